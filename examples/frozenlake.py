"""Distil the FrozenLake experience (3x3 lake, 2 holes, 5 moves) into a student with NCA; see examples/sokoban.py.

    accelerate launch examples/frozenlake.py --config examples/configs/frozenlake.yaml
    python examples/frozenlake.py --model_name_or_path embedded --max_steps 2 --per_device_train_batch_size 2 \
        --eval_seeds 8 --max_new_tokens 64 --eval_max_new_tokens 64 --max_length 4096
"""

from sokoban import run_game


if __name__ == "__main__":
    run_game("frozenlake", default_output="outputs/frozenlake-nca")
