"""The `trl-nca` command: `trl-nca train` (TrlParser, YAML configs) and `trl-nca eval` (paired evaluation)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..core.console import Stopwatch, closing_line, quiet_library_bars, say, take_verbose_flag
from ..core.launch import end_process_group
from ..inputs import (
    BUILTIN_CONTEXTS,
    BUILTIN_DATASETS,
    FULL_DISK_ERRNOS,
    LOCAL_FORMATS,
    InputError,
    OutputError,
    full_disk_error,
    load_dataset_any,
    output_folder_lock,
    read_context,
    read_utf8_text,
    write_text_atomic,
)
from ..trainers.script_options import resume_checkpoint, student_init_kwargs
from . import explain


# read_context, load_dataset_any and resume_checkpoint stay importable from here; they live in trl_nca.inputs and
# trl_nca.trainers.script_options.
__all__ = [
    "BUILTIN_CONTEXTS",
    "BUILTIN_DATASETS",
    "LOCAL_FORMATS",
    "load_dataset_any",
    "main",
    "read_context",
    "resume_checkpoint",
]


USAGE = """usage: trl-nca {compare,train,eval,analyze,experience} [options]

  compare train plain OPD and NCA students on a built-in task and compare them paired with the base model
          e.g. trl-nca compare --config main_quick   (a config shipped with the package; main: the README's job)
  train   on-policy context distillation with No-Context Anchoring (NCATrainer)
          e.g. trl-nca train --config quickstart     (or a YAML file's path)
  eval    paired evaluation with and without the context
          e.g. trl-nca eval --help
  analyze what distilling the context did inside the students (hidden-state cosine, view KL, updates, gradients)
          e.g. trl-nca analyze --help
  experience  extract game experience from a model's own played episodes
          e.g. trl-nca experience --help

Run `trl-nca COMMAND --help` for every option of a command; `--verbose` (any command) prints each training log's
full dict and the libraries' progress bars."""


@dataclass
class TrainScriptArguments:
    """Data options of `trl-nca train`; training options are those of `NCAConfig`, model options those of
    `trl.ModelConfig` (`model_name_or_path`, `dtype`, `use_peft`, `lora_r`, ...)."""

    dataset_name: str = field(
        default="quickstart",
        metadata={"help": "Built-in 'quickstart' (24 medical MCQs), a Hub dataset name, or a local .jsonl/.json/"
                  ".parquet/.csv file with a `prompt` or `messages` column."},
    )  # fmt: skip
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration name."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str | None = field(default=None, metadata={"help": "Split for the eval loss, if any."})
    context_file: str | None = field(
        default=None,
        metadata={"help": "Read one fixed context from this text file, or a built-in one: 'medical' or 'safety'. "
                  "Ignored when `context_text` is set."},
    )  # fmt: skip
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N training rows."})
    paired_eval: bool = field(
        default=False,
        metadata={"help": "After training, evaluate base and student with and without the context (report in "
                  "<output_dir>/paired_eval)."},
    )  # fmt: skip
    paired_eval_split: str | None = field(
        default=None, metadata={"help": "Split for the paired evaluation (default: dataset_test_split, else train)."}
    )
    paired_eval_limit: int | None = field(default=64, metadata={"help": "Evaluate the first N items."})
    paired_eval_max_new_tokens: int = field(default=256, metadata={"help": "Tokens per evaluation answer."})
    scorer: str = field(
        default="mcq",
        metadata={"help": "Scorer of the paired evaluation: mcq, mcq_strict, yesno, exact, normalized, or "
                  "'package.module:function'. A custom scorer imports that module and runs its code: use only code "
                  "you trust."},
    )  # fmt: skip
    label_column: str = field(default="answer", metadata={"help": "Label column of the paired evaluation."})


class CommandLineError(ValueError):
    """Bad input to `trl-nca train` or `trl-nca compare`, found before training starts (and, for compare, before any
    model loads or file is written); `main` prints it as one line (exit status 2)."""


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
    from ..eval import GenerationSettings, PairedEvaluator

    return PairedEvaluator(
        dataset, context=context_spec, scorer=script_args.scorer, label_column=script_args.label_column,
        id_column="id" if "id" in dataset.column_names else None,
        generation=GenerationSettings(max_new_tokens=script_args.paired_eval_max_new_tokens),
    )  # fmt: skip


def train(argv: list[str] | None = None):
    """Parse `trl-nca train` options (and an optional `--config` YAML), train, save the model and its card."""
    from trl import ModelConfig, TrlParser

    from ..trainers.nca_config import NCAConfig

    parser = TrlParser((TrainScriptArguments, NCAConfig, ModelConfig), prog="trl-nca train")
    argv = with_builtin_config(argv)
    check_config_file(argv)
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    except (ValueError, TypeError) as error:
        raise CommandLineError(str(error)) from error
    try:
        lock = _main_process_lock(training_args.output_dir, "trl-nca train")
    except (ValueError, OSError) as error:  # an output_dir that is a file or cannot be made
        raise CommandLineError(str(error)) from error
    with lock:  # one writer per output folder
        return _train(script_args, training_args, model_args)


def builtin_config_names() -> list[str]:
    """The configs shipped inside the package (`trl_nca/resources/configs/`, also `examples/configs/` in the
    repository), by name."""
    from importlib.resources import files

    return sorted(
        p.name[: -len(".yaml")] for p in (files("trl_nca.resources") / "configs").iterdir() if p.name.endswith(".yaml")
    )


def with_builtin_config(argv: list[str] | None) -> list[str]:
    """`--config NAME` for a config shipped with the package (`trl-nca compare --config main_quick`), so the commands
    work from the wheel, where `examples/` does not exist: a NAME that is no file here and names a shipped config
    becomes that file's path. Anything else is left for `check_config_file`."""
    from importlib.resources import files

    argv = list(sys.argv[2:] if argv is None else argv)
    names = builtin_config_names()
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--config" and i + 1 < len(argv) else None
        if arg.startswith("--config="):
            value = arg.split("=", 1)[1]
        if value is None or Path(value).exists() or value.removesuffix(".yaml") not in names:
            continue
        path = str(files("trl_nca.resources") / "configs" / f"{value.removesuffix('.yaml')}.yaml")
        if arg == "--config":
            argv[i + 1] = path
        else:
            argv[i] = f"--config={path}"
    return argv


def check_config_file(argv: list[str] | None) -> None:
    """The `--config` file of `trl-nca train` or `compare`, read before TrlParser reads it: a missing file, a folder,
    a byte that is not UTF-8 or YAML that does not parse is a `CommandLineError` naming the file, the line and the
    fix (TrlParser would raise a bare OSError or a YAML traceback)."""
    import yaml

    argv = list(sys.argv[2:] if argv is None else argv)
    values = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--config"]
    values += [arg.split("=", 1)[1] for arg in argv if arg.startswith("--config=")]
    for value in values:
        path = Path(value)
        if path.is_dir():
            raise CommandLineError(
                f"--config {value!r} is a folder; give the YAML file of the settings (e.g. examples/configs/quickstart.yaml, or a shipped config's name: quickstart)."
            )
        if not path.is_file():
            raise CommandLineError(
                f"--config {value!r} does not exist; give the path of a YAML file of settings, or the name of a "
                f"shipped config ({', '.join(builtin_config_names())})."
            )
        try:
            text = read_utf8_text(path, f"the config {value!r}")
            data = yaml.safe_load(text)
        except InputError as error:
            raise CommandLineError(str(error)) from None
        except yaml.YAMLError as error:
            mark, start = getattr(error, "problem_mark", None), getattr(error, "context_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            if where and start is not None and start.line != mark.line:
                where += f"; {getattr(error, 'context', None) or 'it starts'} at line {start.line + 1}"
            where += ")" if where else ""
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            raise CommandLineError(
                f"The config {value!r} is not valid YAML: {problem}{where}. Fix that line (one `name: value` per line)."
            ) from None
        if data is not None and not isinstance(data, dict):
            raise CommandLineError(
                f"The config {value!r} holds a YAML {type(data).__name__}, not settings; write one `name: value` per line."
            )
        for key, setting in (data or {}).items():  # YAML reads unquoted no/yes/off/on as booleans
            if isinstance(setting, bool) and (str(key).endswith("_strategy") or key == "report_to"):
                word = "no" if setting is False else "yes"
                raise CommandLineError(
                    f"In the config {value!r}, `{key}` is the boolean {setting} (YAML reads an unquoted {word} or "
                    f"{'off' if setting is False else 'on'} as a boolean), but it takes a word. Quote it: "
                    f'`{key}: "{word}"`.'
                )


def _main_process_lock(output_dir: str, command: str):
    """The output folder's lock, taken by the main process of a launch (the others write into the same folder)."""
    rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))
    return output_folder_lock(output_dir, command) if rank in ("0", "-1", "") else contextlib.nullcontext()


@contextlib.contextmanager
def _checkpoint_write_failures(training_args):
    """torch reports a checkpoint file it could not write (a full disk) as a RuntimeError of its stream writer; the
    command reports it as the one line of every other full disk."""
    try:
        yield
    except RuntimeError as error:
        markers = ("PytorchStreamWriter failed writing", "file write failed", "inline_container")  # torch's writer
        if not any(marker in str(error) for marker in markers):
            raise
        raise OutputError(
            f"No space left to write a checkpoint in {training_args.output_dir} (torch: "
            f"{str(error).splitlines()[0][:160]}). Free some space (or choose an output folder on another disk) and run "
            "the same command with --resume_from_checkpoint true: the last complete checkpoint is kept."
        ) from error


class TrainingInterrupted(Exception):
    """`trl-nca train` stopped by Ctrl-C after saving a checkpoint; `main` prints it as one line (exit status 130)."""


def _train(script_args, training_args, model_args):
    from ..models.names import EmbeddedModelUnavailableError

    clock = Stopwatch()
    try:
        trainer, resume, settings, model_path, paired_dataset = _setup_training(script_args, training_args, model_args)
    except (ValueError, TypeError, OSError, EmbeddedModelUnavailableError) as error:
        raise CommandLineError(str(error)) from error
    paired_items = None if paired_dataset is None else len(paired_dataset)
    explain.opening(explain.train_opening(script_args, training_args, model_path, settings["data"]["rows"],
                                          settings["peft"], paired_items))  # fmt: skip
    if trainer.accelerator.is_main_process:
        write_text_atomic(
            Path(training_args.output_dir) / TRAIN_SETTINGS, json.dumps(settings, indent=2, sort_keys=True) + "\n"
        )
    _run_training(trainer, resume, training_args)
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        trainer.create_model_card(model_name=Path(training_args.output_dir).name, dataset_name=script_args.dataset_name)
    if script_args.paired_eval:  # every process calls it; after a distributed run the main process evaluates alone
        _paired_eval_after_training(trainer, script_args, training_args, model_path, paired_dataset)
    output = Path(training_args.output_dir)
    explain.opening(closing_line("train", clock.seconds, explain.outputs_of(
        model=output, settings=output / TRAIN_SETTINGS, report=output / "paired_eval" / "report.md")))  # fmt: skip
    return trainer


def _paired_eval_after_training(trainer, script_args, training_args, model_path: str, paired_dataset) -> None:
    """The base and the trained student evaluated paired on `paired_dataset`; the report printed."""
    from ..eval import GenerationSettings
    from ..eval.compare import compare_base_and_student

    settings = GenerationSettings(max_new_tokens=script_args.paired_eval_max_new_tokens)
    id_column = "id" if "id" in paired_dataset.column_names else None
    report = compare_base_and_student(
        trainer, paired_dataset, base_model_path=model_path, scorer=script_args.scorer,
        label_column=script_args.label_column, id_column=id_column, generation=settings,
    )  # fmt: skip
    if report is not None:
        print((Path(training_args.output_dir) / "paired_eval" / "report.md").read_text())


def _setup_training(script_args, training_args, model_args):
    """Everything `trl-nca train` checks and builds before training, each bad input one error before any model loads
    where it can be: the student, teacher and context resolved, the checkpoint to resume from, the datasets, the
    settings (checked against a resumed run's) and the trainer. Returns the trainer, the checkpoint to resume from,
    the settings, the student's path and the paired evaluation's dataset (None without `--paired_eval`)."""
    from trl import get_peft_config

    from ..models.names import resolve_model_name_or_path
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
        from ..recipes.compare import check_lora_sizes

        check_lora_sizes(model_args)
    peft_config = get_peft_config(model_args)
    settings = _run_settings(script_args, training_args, model_path, peft_config, train_dataset)
    if resume is not None:  # before any model loads
        _check_resumed_settings(training_args.output_dir, settings)
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
    from transformers import AutoTokenizer

    from ..recipes.budgets import position_limit_of
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
    limits = Limits(max_new_tokens=training_args.max_new_tokens, max_context_length=limit,
                    truncate_context=training_args.truncate_context)  # fmt: skip
    for split, dataset in datasets.items():
        if dataset is not None:
            check_prompt_sizes(dataset, training_args.context_spec, tokenizer, limits, name, split)


def _run_training(trainer, resume, training_args) -> None:
    """`trainer.train`, with Ctrl-C saving a checkpoint and stopping (single process) and a failed checkpoint write
    one line."""
    from ..trainers.checkpoints import StopOnInterrupt

    single_process = os.environ.get("WORLD_SIZE", "1") == "1"
    stop = StopOnInterrupt()
    if single_process:
        trainer.add_callback(stop)
    with stop.installed() if single_process else contextlib.nullcontext(), _checkpoint_write_failures(training_args):
        trainer.train(resume_from_checkpoint=resume)
    if stop.interrupted:
        step = trainer.state.global_step
        raise TrainingInterrupted(
            f"interrupted at step {step}; the run is saved in {Path(training_args.output_dir) / f'checkpoint-{step}'}. "
            "Run the same command with --resume_from_checkpoint true to continue."
        )


TRAIN_SETTINGS = "train_settings.json"  # what shaped a `trl-nca train` run, checked when it is resumed


def _run_settings(script_args, training_args, model_path: str, peft_config, train_dataset) -> dict:
    """What shapes a `trl-nca train` run's result: the config's shaping fields (`recipes.compare.training_settings`:
    nca_beta, the learning rate and schedule, the context, ...), the student and its adapter settings, and the data
    (its source, split and row limit, and the file's sha256 or the loaded dataset's fingerprint)."""
    from ..inputs import sha256_file
    from ..recipes.compare import _peft_settings, training_settings

    source = script_args.dataset_name
    if Path(source).is_file():
        identity = "sha256:" + sha256_file(source)
    else:
        identity = getattr(train_dataset, "_fingerprint", None)
    data = {
        "dataset": source, "config": script_args.dataset_config, "split": script_args.dataset_train_split,
        "max_train_samples": script_args.max_train_samples, "rows": len(train_dataset), "identity": identity,
        "context_file": script_args.context_file,
    }  # fmt: skip
    return {
        "training": training_settings(training_args, skip=("teacher_model_name_or_path",)),
        "teacher": training_args.teacher_model_name_or_path,
        "model": model_path,
        "peft": _peft_settings(peft_config) if peft_config is not None else None,
        "data": data,
    }


def _check_resumed_settings(output_dir: str, settings: dict) -> None:
    """A resumed run must be shaped by the settings it started with (`train_settings.json` of its output_dir): a
    changed dataset, context, model, nca_beta, learning rate or schedule would silently train a mixture."""
    import logging

    from ..inputs import read_json_output
    from ..recipes.compare import refuse_changed_settings

    saved = Path(output_dir) / TRAIN_SETTINGS
    if not saved.is_file():
        logging.getLogger(__name__).warning(
            "%s has no %s (an older trl-nca did not write one), so the resumed run's settings cannot be "
            "checked against those it started with.", output_dir, TRAIN_SETTINGS,
        )  # fmt: skip
        return
    old = read_json_output(saved, "Delete it to resume without the check, or use a new output_dir.")
    refuse_changed_settings(
        "a training run", saved, old, json.loads(json.dumps(settings)),
        why="Resuming would continue it as another run (new data, context or settings, the old optimizer state).",
    )  # fmt: skip


def compare(argv: list[str] | None = None) -> dict:
    """Parse `trl-nca compare` options (and an optional `--config` YAML), run the comparison, print its table."""
    from trl import ModelConfig, TrlParser

    from ..models.names import EmbeddedModelUnavailableError
    from ..recipes import CompareArguments, execute, plan_comparison
    from ..trainers.nca_config import NCAConfig

    parser = TrlParser((CompareArguments, NCAConfig, ModelConfig), prog="trl-nca compare")
    argv = with_builtin_config(argv)
    check_config_file(argv)
    try:  # the config's own checks, and every check of the comparison (and of an existing output folder)
        compare_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    except (ValueError, TypeError) as error:
        raise CommandLineError(str(error)) from error
    with output_folder_lock(training_args.output_dir, "trl-nca compare"):  # one writer per output folder
        try:  # before any model loads
            plan = plan_comparison(compare_args, training_args, model_args)
        except (ValueError, TypeError, OSError, EmbeddedModelUnavailableError) as error:
            raise CommandLineError(str(error)) from error
        if compare_args.slice is not None or compare_args.from_slices:
            return _compare_slices(compare_args, plan)
        explain.opening(explain.compare_opening(plan))
        summary = execute(plan)
    print(f"\n{summary['table']}\n\n{summary['conclusion']}\n{summary['reading']}\n")
    if summary.get("tracking_reading"):
        print(f"{summary['tracking_reading']}\n")
    print(f"{summary['statistics_table']}\n")
    print(f"Figures: {', '.join(summary['figures'].values())}")
    print(f"Full paired report: {summary['report']}")
    output = Path(training_args.output_dir)
    say(closing_line("compare", summary["wall_seconds"], explain.outputs_of(
        table=output / "comparison.md", summary=output / "comparison.json", report=summary["report"])))  # fmt: skip
    return summary


def _compare_slices(compare_args, plan) -> dict:
    """`trl-nca compare --slice UNIT` (one unit run, its slice written) or `--from_slices` (the tables built from the
    slice files): `trl_nca.recipes.slices`."""
    from ..recipes import slices

    try:
        if compare_args.from_slices:
            summary = slices.build_from_slices(plan, compare_args.slices_dir)
            print(f"\n{summary['table']}\n\n{summary['conclusion']}\n\n{summary['statistics_table']}\n")
            print(f"Built from the slices in {compare_args.slices_dir}: {plan.root / 'comparison.md'}")
            return summary
        slices._check_unit(plan, compare_args.slice)
        path = slices.run_slice(plan, compare_args.slice, compare_args.slices_dir)
    except slices.SliceError as error:
        raise CommandLineError(str(error)) from error
    missing = slices.missing_units(plan, compare_args.slices_dir)
    data = json.loads(path.read_text())
    print(f"Slice {compare_args.slice} written: {path}\n{slices.describe_slice(data)}")
    print(
        f"Units still without a slice: {', '.join(missing)}"
        if missing
        else f"Every unit has its slice: build the tables with --from_slices --slices_dir {compare_args.slices_dir}"
    )
    return data


def experience(argv: list[str] | None = None) -> int:
    """`trl-nca experience`: extract a game experience text from a model's own games (`trl_nca.envs.experience`);
    writes the text and a JSON history of the rounds. Every setting is checked before the model is loaded."""
    from ..envs import game_generation_settings
    from ..envs.experience import build_parser, check_options
    from ..eval import loading
    from ..inputs import check_output_file, output_file_lock

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        for name in ("rounds", "episodes", "validation_size", "max_items", "max_new_items", "max_calls", "batch_size"):
            if getattr(args, name) < 1:
                parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}.")
        output = check_output_file(args.output, "--output")  # written after the rounds: checked before them
        history = output.with_suffix(".json")
        if history == output:
            raise InputError(
                f"--output {args.output!r} ends in .json, the name of the JSON history written next to the text, so "
                "one would overwrite the other. Give the text file another suffix, e.g. "
                f"{output.with_suffix('.txt')}."
            )
        check_output_file(history, "--output (its JSON history)")
        clock = Stopwatch()
        env_kwargs = check_options(args.game_option, args.game, args.max_calls)
        loading.check_weights(loading.resolve_model_path(args.model), args.adapter, f"--model {args.model!r}")
        settings = game_generation_settings(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            seed=args.seed,
        )
    except ValueError as error:  # InputError (EvalInputError) included
        parser.error(str(error))
    explain.opening(explain.experience_opening(args, output))
    with output_file_lock(output, "trl-nca experience", "--output"):  # one writer of the text and its history
        try:
            model = loading.load_model(args.model, args.adapter, dtype=args.dtype, device=args.device)
            tokenizer = loading.load_tokenizer(args.tokenizer or args.model)
        except ValueError as error:
            parser.error(str(error))
        result = _extract(args, model, tokenizer, settings, env_kwargs)
        write_text_atomic(history, json.dumps(result.to_dict(), indent=2) + "\n")
        write_text_atomic(output, (result.text or "") + "\n")
    print(f"Validation win rate {result.score:.3f} with {len(result.items)} lessons; written to {output}.")
    say(closing_line("experience", clock.seconds, {"experience": output, "history": history}))
    return 0


def _extract(args, model, tokenizer, settings, env_kwargs):
    """The rounds of `trl-nca experience` (`trl_nca.envs.experience.extract_experience`) with the parsed options."""
    from ..core.sampling import HFBackend, generate_fn
    from ..envs.experience import extract_experience, load_experience, parse_items

    initial = parse_items(load_experience(args.game)) if args.start_from_shipped else []
    return extract_experience(
        generate_fn(HFBackend(model, tokenizer), settings),
        tokenizer,
        args.game,
        rounds=args.rounds,
        episodes_per_round=args.episodes,
        validation_size=args.validation_size,
        max_items=args.max_items,
        max_new_items=args.max_new_items,
        initial_items=initial,
        max_calls=args.max_calls,
        env_kwargs=env_kwargs,
        sampling_seed=args.seed,
    )


def _name_cpu_for_deepspeed() -> None:
    """DeepSpeed, when installed, is imported by accelerate whenever a model is unwrapped; on a machine with no
    accelerator its detection warns at every run that it fell back to the CPU. Name the CPU for it there (a
    `DS_ACCELERATOR` the user set is kept, and machines with any accelerator are left to DeepSpeed's detection)."""
    if "DS_ACCELERATOR" in os.environ:
        return
    import torch

    if not torch.accelerator.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _name_cpu_for_deepspeed()
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = argv[0], take_verbose_flag(argv[1:])  # --verbose: the full log dicts and every library's bars
    quiet_library_bars()
    if command not in COMMANDS:
        print(f"trl-nca: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    try:
        result = COMMANDS[command](rest)  # train returns its trainer, compare its summary
        end_process_group()  # `accelerate launch trl-nca train ...`: exit without the backend's threads running
        return result if isinstance(result, int) else 0
    except TrainingInterrupted as error:
        print(f"trl-nca {command}: {error}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(
            f"trl-nca {command}: interrupted; run the same command again to resume what was finished.", file=sys.stderr
        )
        return 130
    except USER_ERRORS as error:
        return _user_error(command, error)
    except OSError as error:  # a full disk anywhere (a save of the model, a figure) is one line too
        if error.errno not in FULL_DISK_ERRNOS:
            raise
        return _user_error(command, error)


def _eval(argv: list[str]) -> int:
    from .eval import main as eval_main

    return eval_main(argv)


def _analyze(argv: list[str]) -> int:
    from .analyze import main as analyze_main

    return analyze_main(argv)


COMMANDS = {"train": train, "compare": compare, "eval": _eval, "analyze": _analyze, "experience": experience}
# what the commands report in one line (exit status 2); any other exception keeps its traceback
USER_ERRORS = (CommandLineError, InputError, OutputError)


def _user_error(command: str, error: BaseException) -> int:
    """The one error path of every command: one line on stderr, exit status 2 (`TRL_NCA_TRACEBACK=1` re-raises)."""
    if os.environ.get("TRL_NCA_TRACEBACK"):
        raise error
    if isinstance(error, OSError) and error.errno in FULL_DISK_ERRNOS:
        error = full_disk_error(error.filename or "an output file", error)
    message = " ".join(str(error).split())
    print(f"trl-nca {command}: error: {message} (set TRL_NCA_TRACEBACK=1 to see the traceback)", file=sys.stderr)
    return 2
