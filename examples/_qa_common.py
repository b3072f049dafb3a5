"""Shared driver of the system-prompt examples: train with NCATrainer, then a paired evaluation of base and student."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from trl import ModelConfig, TrlParser, get_peft_config

from trl_nca import NCAConfig, NCATrainer
from trl_nca.cli import read_context, resume_checkpoint
from trl_nca.eval import GenerationSettings
from trl_nca.eval.compare import compare_base_and_student
from trl_nca.models import resolve_model_name_or_path


@dataclass
class QAArguments:
    dataset_path: str | None = field(
        default=None, metadata={"help": "Local .jsonl/.parquet instead of the Hub dataset (same schema)."}
    )
    train_limit: int | None = field(default=None, metadata={"help": "Use only the first N training items."})
    eval_limit: int = field(default=500, metadata={"help": "Evaluate on the first N test items (paper: 500)."})
    eval_max_new_tokens: int = field(default=512, metadata={"help": "Tokens per evaluation answer (paper: 512)."})
    eval_batch_size: int = field(default=16, metadata={"help": "Evaluation generation batch size."})
    skip_eval: bool = field(default=False, metadata={"help": "Train only."})


def student_init_kwargs(args: NCAConfig, model_args: ModelConfig) -> dict:
    """`from_pretrained` kwargs of the student: the user's `model_init_kwargs`, completed by ModelConfig's `dtype`,
    `model_revision` and `attn_implementation`. A key set in both places to different values is an error, unless
    the ModelConfig field still has its default (then the explicit `model_init_kwargs` entry wins)."""
    kwargs = dict(args.model_init_kwargs or {})
    defaults = {f.name: f.default for f in fields(ModelConfig)}
    given = {
        "dtype": ("dtype", model_args.dtype or "auto"),
        "revision": ("model_revision", model_args.model_revision),
        "attn_implementation": ("attn_implementation", model_args.attn_implementation),
    }
    for key, (option, value) in given.items():
        if key not in kwargs:
            kwargs[key] = value
        elif kwargs[key] != value and getattr(model_args, option) != defaults[option]:
            raise ValueError(
                f"`{option}: {getattr(model_args, option)}` and `model_init_kwargs: {{{key}: {kwargs[key]}}}` "
                "disagree; set it in one place only."
            )
    return kwargs


def run(build_splits, context_name: str, scorer: str, default_output: str):
    """Parse QAArguments + NCAConfig + ModelConfig (YAML via --config), train, evaluate base and student paired."""
    parser = TrlParser((QAArguments, NCAConfig, ModelConfig))
    qa, args, model_args = parser.parse_args_and_config()
    if args.output_dir in (None, "trainer_output"):
        args.output_dir = default_output
    model_path = resolve_model_name_or_path(model_args.model_name_or_path or "embedded")
    args.model_init_kwargs = student_init_kwargs(args, model_args)
    if args.context_text is None:
        args.context_text = read_context(context_name)
    train, test = build_splits(qa)
    resume = resume_checkpoint(args.resume_from_checkpoint, args.output_dir)  # checked before the model loads
    trainer = NCATrainer(model=model_path, args=args, train_dataset=train, peft_config=get_peft_config(model_args))
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(args.output_dir)
    if qa.skip_eval or not trainer.accelerator.is_main_process:
        return
    settings = GenerationSettings(
        max_new_tokens=qa.eval_max_new_tokens, temperature=1.0, top_p=0.95, top_k=20, batch_size=qa.eval_batch_size
    )
    out = Path(args.output_dir) / "paired_eval"
    compare_base_and_student(
        trainer, test, base_model_path=model_path, scorer=scorer, generation=settings, output_dir=out
    )
    print((out / "report.md").read_text())
