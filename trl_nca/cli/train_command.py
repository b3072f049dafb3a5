"""`trl-nca train`: TrlParser options (and an optional `--config` YAML), checked before any model loads, then
`NCATrainer` trains, saves the model and its card, and with `--paired_eval` evaluates base and student paired."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from transformers import AutoTokenizer

from ..console import Stopwatch, closing_line
from ..core.launch import prepare_deepspeed_process
from ..core.schedule import unread_settings
from ..eval import GenerationSettings, PairedEvaluator
from ..eval.compare import compare_base_and_student
from ..inputs import load_dataset_any, read_context, sha256_file, write_text_atomic
from ..models.names import EmbeddedModelUnavailableError, resolve_model_name_or_path
from ..recipes.budgets import position_limit_of
from ..recipes.compare import check_lora_sizes, peft_settings, training_settings
from ..trainers.checkpoints import StopOnInterrupt
from ..trainers.script_options import resume_checkpoint, student_init_kwargs
from . import explain
from .config_files import CommandLineError, main_process_lock, parse_command_line, with_builtin_config
from .train_outputs import (
    TRAIN_SETTINGS,
    check_output_dir,
    check_room_for_final_save,
    checkpoint_write_failures,
    save_model_whole,
    write_model_card,
)
from .train_resume import RunStart, check_resumed_run


@dataclass
class TrainScriptArguments:
    """Data options of `trl-nca train`; training options are those of `NCAConfig`, model options those of
    `trl.ModelConfig` (`model_name_or_path`, `dtype`, `use_peft`, `lora_r`, ...)."""

    dataset_name: str = field(
        default="quickstart",
        metadata={
            "help": "Built-in 'quickstart' (24 medical MCQs), a Hub dataset name, or a local .jsonl/.json/"
            ".parquet/.csv file with a `prompt` or `messages` column."
        },
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration name."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str | None = field(default=None, metadata={"help": "Split for the eval loss, if any."})
    context_file: str | None = field(
        default=None,
        metadata={
            "help": "Read one fixed context from this text file, or a built-in one: 'medical' or 'safety'. "
            "Ignored when `context_text` is set."
        },
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N training rows."})
    paired_eval: bool = field(
        default=False,
        metadata={
            "help": "After training, evaluate base and student with and without the context (report in "
            "<output_dir>/paired_eval)."
        },
    )
    paired_eval_split: str | None = field(
        default=None, metadata={"help": "Split for the paired evaluation (default: dataset_test_split, else train)."}
    )
    paired_eval_limit: int | None = field(default=64, metadata={"help": "Evaluate the first N items."})
    paired_eval_max_new_tokens: int = field(default=256, metadata={"help": "Tokens per evaluation answer."})
    scorer: str = field(
        default="mcq",
        metadata={
            "help": "Scorer of the paired evaluation: mcq, mcq_strict, yesno, exact, normalized, or "
            "'package.module:function'. A custom scorer imports that module and runs its code: use only code "
            "you trust."
        },
    )
    label_column: str = field(default="answer", metadata={"help": "Label column of the paired evaluation."})


def _paired_eval_dataset(script_args):
    split = script_args.paired_eval_split or script_args.dataset_test_split or script_args.dataset_train_split
    dataset = load_dataset_any(script_args.dataset_name, split, script_args.dataset_config)
    if script_args.paired_eval_limit is not None:
        if script_args.paired_eval_limit < 1:
            raise ValueError(
                f"paired_eval_limit must be at least 1 (or None for all), got {script_args.paired_eval_limit}."
            )
        dataset = dataset.select(range(min(script_args.paired_eval_limit, len(dataset))))
    return dataset


def _paired_evaluator(script_args, dataset, context_spec):
    """The paired evaluator of `--paired_eval`, built (and so validated) before training."""
    return PairedEvaluator(
        dataset,
        context=context_spec,
        scorer=script_args.scorer,
        label_column=script_args.label_column,
        id_column="id" if "id" in dataset.column_names else None,
        generation=GenerationSettings(max_new_tokens=script_args.paired_eval_max_new_tokens),
    )


def train(argv: list[str] | None = None):
    """Parse `trl-nca train` options (and an optional `--config` YAML), train, save the model and its card."""
    from trl import ModelConfig, TrlParser

    from ..trainers.nca_config import NCAConfig

    parser = TrlParser((TrainScriptArguments, NCAConfig, ModelConfig), prog="trl-nca train")
    argv = with_builtin_config(argv)
    prepare_deepspeed_process(argv)  # before the config starts DeepSpeed's backend
    script_args, training_args, model_args = parse_command_line(parser, argv)
    for line in unread_settings(training_args):  # schedule fields this run's schedule does not read: one line each
        logging.getLogger(__name__).warning(line)
    try:
        lock = main_process_lock(training_args.output_dir, "trl-nca train")
    except (ValueError, OSError) as error:  # an output_dir that is a file or cannot be made
        raise CommandLineError(str(error)) from error
    with lock:  # one writer per output folder
        return _train(script_args, training_args, model_args)


class TrainingInterrupted(Exception):
    """`trl-nca train` stopped by Ctrl-C after saving a checkpoint; `main` prints it as one line (exit status 130)."""


def _train(script_args, training_args, model_args):
    clock = Stopwatch()
    try:
        trainer, resume, settings, model_path, paired_dataset = _setup_training(script_args, training_args, model_args)
    except (ValueError, TypeError, OSError, EmbeddedModelUnavailableError) as error:
        raise CommandLineError(str(error)) from error
    settings_text = json.dumps(settings, indent=2, sort_keys=True) + "\n"
    check_room_for_final_save(trainer, training_args.output_dir, {TRAIN_SETTINGS: len(settings_text.encode())})
    paired_items = None if paired_dataset is None else len(paired_dataset)
    explain.opening(
        explain.train_opening(
            script_args, training_args, model_path, settings["data"]["rows"], settings["peft"], paired_items
        )
    )
    if trainer.accelerator.is_main_process:
        write_text_atomic(Path(training_args.output_dir) / TRAIN_SETTINGS, settings_text)
    _run_training(trainer, resume, training_args)
    save_model_whole(trainer, training_args.output_dir)
    write_model_card(
        trainer,
        training_args.output_dir,
        model_name=Path(training_args.output_dir).name,
        dataset_name=script_args.dataset_name,
    )
    if script_args.paired_eval:  # every process calls it; after a distributed run the main process evaluates alone
        _paired_eval_after_training(trainer, script_args, training_args, model_path, paired_dataset)
    output = Path(training_args.output_dir)
    explain.opening(
        closing_line(
            "train",
            clock.seconds,
            explain.outputs_of(
                model=output, settings=output / TRAIN_SETTINGS, report=output / "paired_eval" / "report.md"
            ),
        )
    )
    return trainer


def _paired_eval_after_training(trainer, script_args, training_args, model_path: str, paired_dataset) -> None:
    """The base and the trained student evaluated paired on `paired_dataset`; the report printed."""
    settings = GenerationSettings(max_new_tokens=script_args.paired_eval_max_new_tokens)
    id_column = "id" if "id" in paired_dataset.column_names else None
    report = compare_base_and_student(
        trainer,
        paired_dataset,
        base_model_path=model_path,
        scorer=script_args.scorer,
        label_column=script_args.label_column,
        id_column=id_column,
        generation=settings,
    )
    if report is not None:
        print((Path(training_args.output_dir) / "paired_eval" / "report.md").read_text())


def _setup_training(script_args, training_args, model_args):
    """Everything `trl-nca train` checks and builds before training, each bad input one error before any model loads
    where it can be: the student, teacher and context resolved, the checkpoint to resume from, the datasets, the
    settings (checked against a resumed run's) and the trainer. Returns the trainer, the checkpoint to resume from,
    the settings, the student's path and the paired evaluation's dataset (None without `--paired_eval`)."""
    from trl import get_peft_config

    from ..trainers.nca_trainer import NCATrainer

    model_path = resolve_model_name_or_path(model_args.model_name_or_path or "embedded", "Student model")
    training_args.model_init_kwargs = student_init_kwargs(training_args, model_args)
    if training_args.teacher_model_name_or_path:
        training_args.teacher_model_name_or_path = resolve_model_name_or_path(
            training_args.teacher_model_name_or_path, "Teacher model"
        )
    if training_args.context_text is None and script_args.context_file is not None:
        training_args.context_text = read_context(script_args.context_file)
    if training_args.context_text is None and script_args.dataset_name == "quickstart":
        training_args.context_text = read_context("medical")

    resume = resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    check_output_dir(training_args.output_dir, resume)
    train_dataset = load_dataset_any(
        script_args.dataset_name, script_args.dataset_train_split, script_args.dataset_config
    )
    if script_args.max_train_samples is not None:
        if script_args.max_train_samples < 1:
            raise ValueError(f"max_train_samples must be at least 1, got {script_args.max_train_samples}.")
        train_dataset = train_dataset.select(range(min(script_args.max_train_samples, len(train_dataset))))
    eval_dataset = None
    if script_args.dataset_test_split is not None:
        eval_dataset = load_dataset_any(
            script_args.dataset_name, script_args.dataset_test_split, script_args.dataset_config
        )
    paired_dataset = None
    if script_args.paired_eval:  # check the evaluation's dataset, labels and scorer now, not after training
        paired_dataset = _paired_eval_dataset(script_args)
        _paired_evaluator(script_args, paired_dataset, training_args.context_spec)

    if model_args.use_peft:
        check_lora_sizes(model_args)
    peft_config = get_peft_config(model_args)
    settings = _run_settings(script_args, training_args, model_path, peft_config, train_dataset)
    if resume is not None:  # before any model loads
        check_resumed_run(training_args.output_dir, resume, settings, training_args.max_steps)
    _check_prompt_sizes(training_args, model_args, model_path, {"train": train_dataset, "eval": eval_dataset})
    trainer = NCATrainer(
        model=model_path,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=peft_config,
    )
    return trainer, resume, settings, model_path, paired_dataset


def _check_prompt_sizes(training_args, model_args, model_path: str, datasets: dict) -> None:
    """The rows' prompts against `max_context_length`, or else the student's and teacher's positions (read from their
    configs), before any model loads and before the trainer tokenises (`trainers.data.check_prompt_sizes`)."""
    from ..trainers.data import Limits, check_prompt_sizes

    if training_args.max_context_length:
        limit, name = training_args.max_context_length, f"max_context_length={training_args.max_context_length}"
    else:
        positions = {}
        for path in filter(None, (model_path, training_args.teacher_model_name_or_path)):
            try:
                positions[path] = position_limit_of(path)
            except (OSError, ValueError):
                continue  # loading the model reports it, with its own message
        known = {path: limit for path, limit in positions.items() if limit}
        if not known:
            return
        path = min(known, key=known.get)
        limit, name = known[path], f"the {known[path]} positions of the model {path} (max_position_embeddings)"
    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=training_args.trust_remote_code)
    limits = Limits(
        max_new_tokens=training_args.max_new_tokens,
        max_context_length=limit,
        truncate_context=training_args.truncate_context,
    )
    for split, dataset in datasets.items():
        if dataset is not None:
            check_prompt_sizes(dataset, training_args.context_spec, tokenizer, limits, name, split)


def _run_training(trainer, resume, training_args) -> None:
    """`trainer.train`, with Ctrl-C saving a checkpoint and stopping (single process) and a failed checkpoint write
    one line."""
    single_process = os.environ.get("WORLD_SIZE", "1") == "1"
    stop = StopOnInterrupt()
    if single_process:
        trainer.add_callback(stop)
    trainer.add_callback(RunStart())
    with (
        stop.installed() if single_process else contextlib.nullcontext(),
        checkpoint_write_failures(trainer, training_args),
    ):
        trainer.train(resume_from_checkpoint=resume)
    if stop.interrupted:
        step = trainer.state.global_step
        raise TrainingInterrupted(
            f"interrupted at step {step}; the run is saved in {Path(training_args.output_dir) / f'checkpoint-{step}'}. "
            "Run the same command with --resume_from_checkpoint true to continue."
        )


def _run_settings(script_args, training_args, model_path: str, peft_config, train_dataset) -> dict:
    """What shapes a `trl-nca train` run's result: the config's shaping fields (`recipes.compare.training_settings`:
    nca_beta, the learning rate and schedule, the context, ...), the student and its adapter settings, and the data
    (its source, split and row limit, and the file's sha256 or the loaded dataset's fingerprint)."""
    source = script_args.dataset_name
    if Path(source).is_file():
        identity = "sha256:" + sha256_file(source)
    else:
        identity = getattr(train_dataset, "_fingerprint", None)
    data = {
        "dataset": source,
        "config": script_args.dataset_config,
        "split": script_args.dataset_train_split,
        "max_train_samples": script_args.max_train_samples,
        "rows": len(train_dataset),
        "identity": identity,
        "context_file": script_args.context_file,
    }
    return {
        "training": training_settings(training_args, skip=("teacher_model_name_or_path",)),
        "teacher": training_args.teacher_model_name_or_path,
        "model": model_path,
        "peft": peft_settings(peft_config) if peft_config is not None else None,
        "data": data,
    }
