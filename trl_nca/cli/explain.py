"""The opening line of each `trl-nca` command: what it will do, with how many models, where it writes, and where its
time estimate comes from (each phase prints its own estimate from a rate measured in this run: a training after its
second step, `trl_nca.trainers.console.TrainingEstimate`; a paired evaluation after its first chunk,
`trl_nca.eval.paired.estimate_line`). The closing line is `trl_nca.console.closing_line`. Printing only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..console import plural, say


TRAIN_TIME = "time: printed after the second training step, from its rate measured in this run (no default is assumed)"
SHORT_TIME = "time: no training estimate (2 steps or fewer: the end is as near as one)"


def _train_time(args) -> str:
    return SHORT_TIME if 0 < (args.max_steps or 0) <= 2 else TRAIN_TIME


EVAL_TIME = "time: printed after each model's first chunk of items, from its rate measured in this run"


def _steps(args) -> str:
    if args.max_steps and args.max_steps > 0:
        return plural(args.max_steps, "step")
    return (
        plural(int(args.num_train_epochs), "epoch")
        if float(args.num_train_epochs).is_integer()
        else (f"{args.num_train_epochs} epochs")
    )


def train_opening(script_args, training_args, model_path: str, rows: int, peft_config, paired_items: int | None) -> str:
    """`trl-nca train`'s opening line."""
    weights = "a LoRA adapter of" if peft_config is not None else "all weights of"
    teacher = training_args.teacher_model_name_or_path or "the student itself, reading the context"
    batch = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
    then = ""
    if paired_items is not None:
        then = f", then evaluate 2 models (base and student) paired on {plural(paired_items, 'item')}"
    return (
        f"trl-nca train: distil the context into {weights} {model_path} (1 student; teacher: {teacher}) for "
        f"{_steps(training_args)} of {batch} prompts (per device) from {plural(rows, 'row')} of "
        f"{script_args.dataset_name}{then}; output {training_args.output_dir}; {_train_time(training_args)}."
    )


def compare_opening(plan) -> str:
    """`trl-nca compare`'s opening line (from its checked plan)."""
    runs = plan.runs
    finished = sum((run.folder / "done.json").exists() for run in runs)
    bases = len(plan.model_paths)
    methods = ", ".join(method.name for method in plan.methods)
    organisms = len({run.organism for run in runs})
    kind = "organism" if any(run.organism is not None for run in runs) else "model"
    seeds = len({run.seed for run in runs})
    samples = getattr(plan.evaluator, "samples_per_view", 1)
    left = len(runs) - finished
    shape = (
        f"{methods} x {plural(organisms, kind)} x {plural(seeds, 'seed')}, "
        f"{_steps(runs[0].config) if runs else '0 steps'} each"
    )
    if left == 0 and runs:  # a resume of a job whose students are all trained: nothing to train, no training estimate
        train = f"nothing to train: its {plural(len(runs), 'student')} ({shape}) on {plan.task.name} are trained, "
        train += f"loaded from {plan.root}; evaluate"
        time = EVAL_TIME
    else:
        again = f" ({finished} of {len(runs)} already trained, loaded from {plan.root})" if finished else ""
        train = f"train {plural(left, 'student')}{again} ({shape}) on {plan.task.name}, then evaluate"
        time = f"{_train_time(runs[0].config) if runs else TRAIN_TIME}, and {EVAL_TIME.removeprefix('time: ')}"
    return (
        f"trl-nca compare: {train} {plural(bases + len(runs), 'model')} ({plural(bases, 'base')} and the students) "
        f"paired on {plural(len(plan.test_rows), 'item')} x 2 views x {plural(samples, 'sample')}; output "
        f"{plan.root}; {time}."
    )


def eval_opening(plan) -> str:
    """`trl-nca eval`'s opening line (from its checked plan)."""
    task = plan.task
    if hasattr(task, "rows"):
        what = (
            f"{plural(len(task.rows), 'item')} x 2 views (without and with the context) x "
            f"{plural(getattr(task, 'samples_per_view', 1), 'sample')}, at most {plan.settings.max_new_tokens} new "
            "tokens each"
        )
    else:
        what = f"{plural(len(task.seeds), 'map')} of {task.game}, each played without and with the context"
    names = ", ".join(spec.name for spec in plan.specs)
    return (
        f"trl-nca eval: evaluate {plural(len(plan.specs), 'model')} ({names}) paired on {what}; output "
        f"{plan.output_dir}; {EVAL_TIME}."
    )


def analyze_opening(plan, output_dir: str) -> str:
    """`trl-nca analyze`'s opening line (from its checked plan)."""
    names = ", ".join(spec.name for spec in plan.specs)
    source = "the completions of --records" if plan.records is not None else "completions sampled here"
    return (
        f"trl-nca analyze: measure {plural(len(plan.specs), 'model')} ({names}; the first is the reference) on "
        f"{plural(len(plan.prompts.rows), 'prompt')} ({plan.prompts.description}) in both views, on {source}; output "
        f"{output_dir}; time: each measure's progress bar shows its rate, measured in this run."
    )


def experience_opening(args, output: Path) -> str:
    """`trl-nca experience`'s opening line."""
    return (
        f"trl-nca experience: extract {args.game} experience from 1 model ({args.model}) in "
        f"{plural(args.rounds, 'round')} of {plural(args.episodes, 'episode')} and a validation of "
        f"{plural(args.validation_size, 'map')}; output {output} and {output.with_suffix('.json')}; time: no estimate "
        "(an episode lasts until its game ends)."
    )


def opening(line: str) -> None:
    """Print an opening line (main process only)."""
    if os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) in ("0", "-1", ""):
        say(line)


def outputs_of(**paths: Any) -> dict[str, Any]:
    """The outputs a closing line names, those that exist."""
    return {name: path for name, path in paths.items() if path is not None and Path(path).exists()}
