"""Train 1 SGD step on fixed samples; save the weights before and after, and the logged metrics.

Run under torchrun (DDP on CPU, gloo) or alone:

    ddp_train.py OUT PER_DEVICE_BATCH [GRAD_ACCUM] [reentrant]

With `reentrant`, gradient checkpointing is on and reentrant, which under DDP needs both student views in one forward
(`NCAConfig.nca_joint_forward`, chosen automatically); otherwise the views run in sequence (`nca_sequential_views`
asked for: this is full fine-tuning).
The reference completions have ragged lengths, so per-micro-batch token means differ from the step's token mean.
Under DDP, every gradient all-reduce is counted per bucket (`allreduce.json`: bucket index -> count).
"""

import json
import os
import sys

import torch
from datasets import Dataset
from transformers import TrainerCallback

from trl_nca import NCAConfig, NCATrainer
from trl_nca.core.launch import end_process_group
from trl_nca.testing import make_tiny_model, make_tiny_tokenizer


class CountAllReduces(TrainerCallback):
    """Wraps DDP's gradient all-reduce in a communication hook that counts the reductions of each bucket."""

    def __init__(self, trainer):
        self.trainer, self.counts = trainer, {}

    def on_train_begin(self, args, state, control, **kwargs):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def counting(process_group, bucket):
            self.counts[bucket.index()] = self.counts.get(bucket.index(), 0) + 1
            return allreduce_hook(process_group, bucket)

        ddp = self.trainer.model_wrapped
        if isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            ddp.register_comm_hook(None, counting)


def main(out: str, per_device: int, grad_accum: int, reentrant: bool):
    torch.set_num_threads(1)
    tok = make_tiny_tokenizer()
    rows = [
        [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": "ok" + " yes" * (i * i)}]
        for i in range(4)
    ]
    ds = Dataset.from_dict({"messages": rows, "context": ["Be brief and precise."] * 4})
    args = NCAConfig(
        output_dir=out,
        max_steps=1,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=grad_accum,
        lmbda=0.0,
        nca_beta_schedule="constant",
        optim="sgd",
        learning_rate=1.0,
        max_grad_norm=0.0,
        lr_scheduler_type="constant",
        bf16=False,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        max_new_tokens=4,
        seed=0,
        logging_steps=1,
        dataloader_drop_last=False,
        gradient_checkpointing=reentrant,
        gradient_checkpointing_kwargs={"use_reentrant": True} if reentrant else None,
        nca_sequential_views=None if reentrant else True,
    )
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=make_tiny_model(tok, 1),
        args=args,
        train_dataset=ds,
        processing_class=tok,
    )
    counter = CountAllReduces(trainer)
    trainer.add_callback(counter)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    if trainer.accelerator.is_main_process:
        with open(os.path.join(out, "allreduce.json"), "w") as f:
            json.dump({"counts": counter.counts, "sequential": trainer.nca.sequential}, f)
        torch.save(before, os.path.join(out, "initial.pt"))
        torch.save({n: p.detach() for n, p in trainer.model.named_parameters()}, os.path.join(out, "weights.pt"))
        with open(os.path.join(out, "logs.json"), "w") as f:
            json.dump([h for h in trainer.state.log_history if "opd_loss" in h], f)


if __name__ == "__main__":
    rest = sys.argv[3:]
    reentrant = "reentrant" in rest
    numbers = [int(a) for a in rest if a != "reentrant"]
    main(sys.argv[1], int(sys.argv[2]), numbers[0] if numbers else 1, reentrant)
    end_process_group()  # a clean exit under a launcher (trl_nca.core.launch.end_process_group)
