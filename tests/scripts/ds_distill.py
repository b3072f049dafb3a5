"""Train `NCADistillationTrainer` for 2 steps under the launch it is started with (CPU, gloo) and save the model.

    ds_distill.py OUT STUDENT_DIR

Rows with contexts and prompts of different lengths; self-distillation from a frozen copy of the full student.
Writes `logs.json` (the logged steps) and the model to OUT.
"""

import json
import os
import sys

import torch
from datasets import Dataset

from trl_nca import NCADistillationConfig, NCADistillationTrainer
from trl_nca.core.launch import end_process_group, prepare_deepspeed_process


def main():
    prepare_deepspeed_process()  # before the config starts DeepSpeed's backend
    out, student = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    prompts = [[{"role": "user", "content": "Q" + "?" * i}] for i in range(8)]
    contexts = [
        "Be brief." if i % 2 else "Answer like a careful clinician who names each source. " * 2 for i in range(8)
    ]
    args = NCADistillationConfig(
        output_dir=out,
        max_steps=2,
        per_device_train_batch_size=2,
        max_completion_length=6,
        bf16=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        ddp_backend="gloo",
        use_vllm=False,
    )
    trainer = NCADistillationTrainer(
        model=student, args=args, train_dataset=Dataset.from_dict({"prompt": prompts, "context": contexts})
    )
    trainer.train()
    trainer.save_model(out)
    if trainer.accelerator.is_main_process:
        with open(os.path.join(out, "logs.json"), "w") as f:
            json.dump([h for h in trainer.state.log_history if "opd_loss" in h], f)


if __name__ == "__main__":
    main()
    end_process_group()  # a clean exit under a launcher (trl_nca.core.launch.end_process_group)
