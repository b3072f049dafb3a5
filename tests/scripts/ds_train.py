"""Train 1 SGD step on fixed samples, alone or under DeepSpeed ZeRO (CPU, gloo); save the weights and the logs.

    ds_train.py OUT --tuning {full,lora} --teacher {separate,self,self-copy} --models DIR [--per-device N]
               [--grad-accum K] [--sample]

Alone, it is the single-process reference. Under `accelerate launch --config_file examples/accelerate/zero{2,3}.yaml
--num_processes 2 --mixed_precision no`, it trains under DeepSpeed with the shipped config. `--zero-in-args STAGE`
passes a ZeRO config as `NCAConfig(deepspeed=...)` instead (for `torch.distributed.run`).

- `--tuning lora` trains a LoRA adapter on q/v; `full` trains every weight.
- `--teacher separate`: another tiny model. `self`: teacher_model=None; with LoRA the student with its adapter
  disabled (no parameters of its own), with full fine-tuning a frozen copy of the initial student. `self-copy`: LoRA
  whose B matrices start non-zero (`init_lora_weights=False`), so disabling the adapter is not the initial model and
  the trainer keeps a frozen merged copy of the student instead.
- `--mixed`: rows whose processes would run different forwards unless they agree: the rows of process 0 share a
  long context and a long question start, those of process 1 no context and a shorter question start (prefixes of
  different lengths, one view shared on one process only), with completions of different lengths; rows are dealt to
  the processes in order.
- `--sampling-prefixes` (with `--on-policy --steps 2`): 8 rows whose prompts let the processes share prefixes of
  different lengths in their sampling prefill on step 1 and let only process 0 share one on step 2. Every process
  writes `sampling_rank{R}.json`: the prefix it could share at each sampling call (`local`) and the prefix of each
  shared prefill it ran (`shared`). `--no-gather-for-generation` sets `ds3_gather_for_generation=False`, so that
  under ZeRO-3 every forward of sampling gathers weights with collectives.
- `--steps N`: N optimizer steps instead of 1. Every process writes `teacher_calls_rank{R}.json`: the global step at
  each call of the teacher's top-level module (a separate teacher under ZeRO-3 is called through its engine, whose
  hooks sit there) and the type of the teacher the trainer holds.
- `--sample`: after the step, every process samples completions for its own prompts with a fixed seed through the
  trainer's generation path (under ZeRO-3: with gathered weights) and saves them, with the prompts, to
  `samples_rank{R}.pt`.

Student and separate teacher are loaded by path (`--models` holds `student/` and `teacher/`, written by
`trl_nca.testing.save_tiny_model`), so under ZeRO-3 they are partitioned as they load. Saved by the main process:
`initial.pt` and `weights.pt` (every student parameter, gathered), `logs.json` (the logged step), `info.json`.
"""

import argparse
import json
import os
from contextlib import nullcontext

import torch
from datasets import Dataset

from trl_nca import NCAConfig, NCADistillationConfig, NCADistillationTrainer, NCATrainer
from trl_nca.core.launch import end_process_group, prepare_deepspeed_process
from trl_nca.testing import make_tiny_tokenizer


def gathered(params):
    params = list(params)
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
    return nullcontext()


def full_params(model) -> dict[str, torch.Tensor]:
    with gathered(model.parameters()):
        return {n: p.detach().clone() for n, p in model.named_parameters()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--tuning", choices=["full", "lora"], required=True)
    parser.add_argument("--teacher", choices=["separate", "self", "self-copy"], required=True)
    parser.add_argument("--per-device", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--sample", action="store_true")
    parser.add_argument("--mixed", action="store_true")
    parser.add_argument("--steps", type=int, default=1, help="optimizer steps (the reference runs 1)")
    parser.add_argument("--zero-in-args", type=int, help="pass a ZeRO config of this stage as `deepspeed=` instead")
    parser.add_argument("--on-policy", action="store_true", help="sample the completions (lmbda=1)")
    parser.add_argument("--sampling-prefixes", action="store_true")
    parser.add_argument("--no-gather-for-generation", action="store_true")
    parser.add_argument(
        "--trainer", choices=["nca", "distill"], default="nca", help="NCATrainer or NCADistillationTrainer"
    )
    parser.add_argument("--reentrant", choices=["unset", "true", "false"], default="unset")
    parser.add_argument("--reduce-bucket", type=int, help="DeepSpeed's reduce_bucket_size (elements)")
    parser.add_argument("--no-checkpointing", action="store_true")
    parser.add_argument("--joint-forward", choices=["auto", "true", "false"], default="auto")
    parser.add_argument("--models", required=True, help="folder with `student/` and `teacher/` (save_tiny_model)")
    opts = parser.parse_args()
    prepare_deepspeed_process(deepspeed_arg=opts.zero_in_args is not None)  # before the config starts DeepSpeed
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    torch.set_num_threads(1)
    student_path, teacher_path = (os.path.join(opts.models, name) for name in ("student", "teacher"))

    tok = make_tiny_tokenizer()
    rows = [
        [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": "ok" + " yes" * (i * i)}]
        for i in range(4)
    ]
    contexts = ["Be brief and precise."] * 4
    if opts.mixed:
        # process 0: one long context and long common question starts; process 1: contexts that share nothing and
        # question starts that share fewer tokens, so its context view cannot share a prefix at all
        stem = "A patient of forty-five presents with severe abdominal pain radiating to the back since two days. "
        common = "Answer as a careful clinician who checks every dosage twice and names each source. " * 2
        contexts = [common + "Rank zero.", common + "Rank zero.", "One.", "Two, a longer one."]
        questions = [stem + "What now?", stem + "Which test first?", stem[:60] + "Cause?", stem[:60] + "Why so?"]
        rows = [
            [{"role": "user", "content": q}, {"role": "assistant", "content": "ok" + " yes" * (5 - i)}]
            for i, q in enumerate(questions)
        ]
    if opts.sampling_prefixes:
        # step 1: both processes' rows share a long start (of different lengths); step 2: only process 0's do
        starts = ["A patient of forty-five presents with severe abdominal pain. ", "The child has a fever and a rash. "]
        questions = [
            starts[0] + "What now?",
            starts[0] + "Which test?",
            starts[1] + "Cause?",
            starts[1] + "Why?",
            starts[0] + "Dose?",
            starts[0] + "Which drug first?",
            "Cause?",
            "Why so, doctor?",
        ]
        rows = [[{"role": "user", "content": q}, {"role": "assistant", "content": "ok"}] for q in questions]
        contexts = ["Be brief and precise."] * len(rows)
    data = Dataset.from_dict({"messages": rows, "context": contexts})
    distill = opts.trainer == "distill"
    if distill:  # DistillationTrainer samples every completion from the prompts (it has no off-policy steps)
        data = Dataset.from_dict({"prompt": [r[:1] for r in rows], "context": contexts})
    config_class, trainer_class = (
        (NCADistillationConfig, NCADistillationTrainer) if distill else (NCAConfig, NCATrainer)
    )
    lengths = (
        {"max_completion_length": 6} if distill else {"max_new_tokens": 6, "lmbda": 1.0 if opts.on_policy else 0.0}
    )
    args = config_class(
        output_dir=opts.out,
        max_steps=opts.steps,
        per_device_train_batch_size=opts.per_device,
        gradient_accumulation_steps=opts.grad_accum,
        optim="sgd",
        nca_beta_schedule="constant",  # the NCA term weighed from the first step: the steps are compared with it on
        gradient_checkpointing=not opts.no_checkpointing,
        gradient_checkpointing_kwargs=None
        if opts.reentrant == "unset"
        else {"use_reentrant": opts.reentrant == "true"},
        nca_joint_forward=None if opts.joint_forward == "auto" else opts.joint_forward == "true",
        learning_rate=1.0,
        max_grad_norm=0.0,
        lr_scheduler_type="constant",
        bf16=False,
        use_cpu=not distributed,
        report_to=[],
        save_strategy="no",
        seed=0,
        logging_steps=1,
        dataloader_drop_last=False,
        **lengths,
        train_sampling_strategy="sequential" if opts.mixed or opts.sampling_prefixes else "random",
        ds3_gather_for_generation=not opts.no_gather_for_generation,
        ddp_backend="gloo" if distributed else None,  # on a CPU, accelerate needs the backend named
        deepspeed=None
        if opts.zero_in_args is None
        else {
            "zero_optimization": {"stage": opts.zero_in_args},
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "zero_allow_untested_optimizer": True,
        },
    )
    if args.deepspeed_plugin is not None:
        # Keep Trainer's torch SGD (one step moves the weights by the gradient itself): it is not on DeepSpeed's ZeRO
        # list, and with an offloaded optimizer DeepSpeed would swap in its own CPU Adam.
        args.deepspeed_plugin.deepspeed_config["zero_allow_untested_optimizer"] = True
        args.deepspeed_plugin.deepspeed_config["zero_force_ds_cpu_optimizer"] = False
        if opts.reduce_bucket is not None:  # small enough to split a weight's two gradient-hook calls across flushes
            args.deepspeed_plugin.deepspeed_config["zero_optimization"]["reduce_bucket_size"] = opts.reduce_bucket
    peft_config = None
    if opts.tuning == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=4,
            lora_alpha=8,
            lora_dropout=0.0,
            target_modules=["q_proj", "v_proj"],
            init_lora_weights=opts.teacher != "self-copy",
        )
        torch.manual_seed(1234)  # the random B of `self-copy` is the same in every run
    trainer = trainer_class(
        model=student_path,
        teacher_model=teacher_path if opts.teacher == "separate" else None,
        args=args,
        train_dataset=data,
        processing_class=tok,
        peft_config=peft_config,
    )
    info = {
        "teacher": type(trainer.accelerator.unwrap_model(trainer.teacher_model)).__name__,
        "processes": trainer.accelerator.num_processes,
        "zero_stage": args.deepspeed_plugin.zero_stage if args.deepspeed_plugin is not None else None,
        "loaded_partitioned": any(hasattr(p, "ds_id") for p in trainer.model.parameters()),
        "use_reentrant": (trainer.args.gradient_checkpointing_kwargs or {}).get("use_reentrant"),
        "joint_forward": trainer.args.joint_forward,
    }
    teacher_calls = []  # the global step at each call of the teacher's top-level module (where DeepSpeed's hooks sit)
    trainer.accelerator.unwrap_model(trainer.teacher_model).register_forward_pre_hook(
        lambda module, args: teacher_calls.append(trainer.state.global_step)
    )
    sampled = {"local": [], "shared": []}  # the prefix each sampling call could share here, and the prefills it ran
    if opts.sampling_prefixes:
        import trl_nca.trainers.nca_trainer as module

        could, prefill = module.sharable_prefix_tokens, module.shared_prefill

        def local(*args, **kwargs):
            sampled["local"].append(could(*args, **kwargs))
            return sampled["local"][-1]

        def shared(*args, **kwargs):
            out = prefill(*args, **kwargs)
            sampled["shared"].append(out.prefix_tokens)
            return out

        module.sharable_prefix_tokens, module.shared_prefill = local, shared
    before = full_params(trainer.model)
    trainer.train()
    if opts.sampling_prefixes:
        with open(os.path.join(opts.out, f"sampling_rank{trainer.accelerator.process_index}.json"), "w") as f:
            json.dump(sampled, f)
    with open(os.path.join(opts.out, f"teacher_calls_rank{trainer.accelerator.process_index}.json"), "w") as f:
        json.dump({"calls": teacher_calls, "engine": type(trainer.teacher_model).__name__}, f)
    after = full_params(trainer.model)
    unwrapped = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    shared = dict(trainer.nca.prefix_sharing.last_shared)  # prefix length of each view's last forward
    with open(os.path.join(opts.out, f"shared_rank{trainer.accelerator.process_index}.json"), "w") as f:
        json.dump(shared, f)
    info["student_partitioned"] = any(hasattr(p, "ds_id") for p in unwrapped.parameters())
    teacher = trainer.accelerator.unwrap_model(trainer.teacher_model)
    info["teacher_partitioned"] = any(hasattr(p, "ds_id") for p in teacher.parameters())
    if opts.sample:
        rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)][rank::world])
        prompts = batch["prompts"].to(trainer.args.device)
        mask = batch["prompt_attention_mask"].to(trainer.args.device)
        torch.manual_seed(1000 + rank)
        ids, completion_mask = trainer._generate(trainer.model_wrapped, prompts, mask)
        torch.save(
            {"prompts": prompts, "prompt_mask": mask, "ids": ids, "mask": completion_mask, "seed": 1000 + rank},
            os.path.join(opts.out, f"samples_rank{rank}.pt"),
        )
    if trainer.accelerator.is_main_process:
        torch.save(before, os.path.join(opts.out, "initial.pt"))
        torch.save(after, os.path.join(opts.out, "weights.pt"))
        with open(os.path.join(opts.out, "logs.json"), "w") as f:
            json.dump([h for h in trainer.state.log_history if "opd_loss" in h], f)
        with open(os.path.join(opts.out, "info.json"), "w") as f:
            json.dump(info, f)


if __name__ == "__main__":
    main()
    end_process_group()  # a clean exit under a launcher (trl_nca.core.launch.end_process_group)
