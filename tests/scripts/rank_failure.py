"""A launch in which one process fails: under the launch it is started with (CPU, gloo), train NCATrainer on a tiny
model; at the start of its second step process 1 raises, while process 0 goes on into the step's forward, whose
collectives (ZeRO-3 gathers every module's weights) wait for process 1.

    rank_failure.py OUT STUDENT_DIR

The launcher must then stop process 0 too and print process 1's error, instead of leaving it waiting for the
collective timeout.
"""

import sys

import torch
from datasets import Dataset
from transformers import TrainerCallback

from trl_nca import NCAConfig, NCATrainer
from trl_nca.core.launch import prepare_deepspeed_process


MESSAGE = "process 1 stops here on purpose"


class FailOnProcessOne(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 1 and args.process_index == 1:
            raise RuntimeError(MESSAGE)


def main():
    prepare_deepspeed_process()  # before the config starts DeepSpeed's backend
    out, student = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    rows = {"prompt": [f"Question {i}: which answer?" for i in range(16)], "context": ["Be brief."] * 16}
    args = NCAConfig(
        output_dir=out,
        max_steps=4,
        per_device_train_batch_size=2,
        max_new_tokens=4,
        bf16=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        ddp_backend="gloo",
    )
    trainer = NCATrainer(
        model=student, args=args, train_dataset=Dataset.from_dict(rows), callbacks=[FailOnProcessOne()]
    )
    trainer.train()


if __name__ == "__main__":
    main()
