"""Distil the FrozenLake experience (3x3 lake, 2 holes, 5 moves) into a student with NCA; see examples/sokoban.py.

    accelerate launch examples/frozenlake.py --model_name_or_path Qwen/Qwen3-1.7B --max_steps 100 \
        --per_device_train_batch_size 8 --output_dir outputs/frozenlake-nca
    python examples/frozenlake.py --model_name_or_path embedded --max_steps 2 --per_device_train_batch_size 2 \
        --eval_seeds 8 --max_new_tokens 64 --eval_max_new_tokens 64
"""

from sokoban import run_game


if __name__ == "__main__":
    run_game("frozenlake", default_output="outputs/frozenlake-nca")
