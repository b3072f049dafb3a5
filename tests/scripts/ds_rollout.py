"""Train 2 steps on episodes whose number of model calls differs between processes, under DeepSpeed ZeRO-3 (CPU, gloo).

    ds_rollout.py OUT --models DIR [--no-gather]

Each episode of seed s calls the student `1 + s % 4` times (one `generate` per call for the episodes still running),
and the seeds are dealt so that process 0 plays short episodes and process 1 long ones. Under ZeRO-3 every `generate`
gathers the student's weights with collectives (`--no-gather`: every layer of every generated token does), so the
processes must call it equally often. Each process writes `calls_rank{R}.json`: its rollout's calls and every call
`generate` got, throw-away rows included.
"""

import argparse
import json
import os

import torch

from trl_nca import NCAConfig, NCATrainer
from trl_nca.core.launch import end_process_group, prepare_deepspeed_process
from trl_nca.core.views import ContextSpec
from trl_nca.testing import make_tiny_tokenizer
from trl_nca.trainers.rollouts import RolloutBatch, RolloutSample


class UnevenRollout:
    """Episodes of `1 + seed % 4` model calls; process 0's seeds give 1 call, process 1's give 4."""

    spec = ContextSpec(column="context", placement="user")

    def __init__(self, episodes_per_step: int):
        self.episodes_per_step = episodes_per_step
        self.calls = 0

    def seeds(self, step: int) -> list[int]:
        per_process = self.episodes_per_step // 2
        return [4 * i for i in range(per_process)] + [4 * i + 3 for i in range(per_process)]

    def rollout(self, seeds, generate, tokenizer) -> RolloutBatch:
        samples, live = [], list(seeds)
        turn = 0
        while live:
            prompts = [[{"role": "user", "content": f"Episode {s}, move {turn}."}] for s in live]
            texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
            ids = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
            self.calls += 1
            for prompt, out in zip(prompts, generate(ids, live)):
                samples.append(RolloutSample(prompt, "Walls are grey.", list(out.token_ids)))
            turn += 1
            live = [s for s in live if 1 + s % 4 > turn]
        return RolloutBatch(samples, {"turns": float(turn)})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--models", required=True)
    parser.add_argument("--no-gather", action="store_true")
    opts = parser.parse_args()
    prepare_deepspeed_process()  # before the config starts DeepSpeed's backend
    torch.set_num_threads(1)
    args = NCAConfig(
        output_dir=opts.out,
        max_steps=2,
        per_device_train_batch_size=2,
        bf16=False,
        report_to=[],
        save_strategy="no",
        max_new_tokens=4,
        seed=0,
        logging_steps=1,
        ddp_backend="gloo",
        ds3_gather_for_generation=not opts.no_gather,
    )
    rollout = UnevenRollout(episodes_per_step=2 * args.world_size)
    trainer = NCATrainer(
        model=os.path.join(opts.models, "student"), args=args, rollout=rollout, processing_class=make_tiny_tokenizer()
    )
    generated = []
    original = trainer._generate

    def counting(model, prompts, mask, teacher=None):
        generated.append(prompts.shape[0])
        return original(model, prompts, mask, teacher)

    trainer._generate = counting
    trainer.train()
    rank = trainer.accelerator.process_index
    with open(os.path.join(opts.out, f"calls_rank{rank}.json"), "w") as f:
        json.dump({"rollout_calls": rollout.calls, "generate_rows": generated}, f)


if __name__ == "__main__":
    main()
    end_process_group()  # a clean exit under a launcher (trl_nca.core.launch.end_process_group)
