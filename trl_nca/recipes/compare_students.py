"""The students of a comparison: each trained from its base weights (or loaded, when its folder holds a finished one)
and evaluated, one after another or in forked worker processes (`workers`)."""

from __future__ import annotations

import copy
import functools
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from ..console import JobEstimate, in_detail, say, speaking_for
from ..inputs import read_json_output, write_text_atomic
from ..tasks import BuiltinTask
from .compare_eval import Evaluated, _evaluate_base, _load_base
from .compare_plan import Plan, Run, _done_fix


logger = logging.getLogger(__name__)


def _dataset(rows: Sequence[dict[str, Any]]):
    from datasets import Dataset

    return Dataset.from_list(list(rows))


def train_run(
    task: BuiltinTask, config, model_path: str, model_init_kwargs, tokenizer, peft_config, train_rows, tracker=None,
    phase: str | None = None,
):  # fmt: skip
    """Train one student; returns the trainer (its model holds the trained adapter). `phase` names its progress bar
    and training estimate (`trl_nca.trainers.console`)."""
    from ..trainers.console import explain_training
    from ..trainers.nca_trainer import NCATrainer
    from . import sdft

    model = _load_base(model_path, model_init_kwargs)
    trainer_class = NCATrainer
    if sdft.is_sdft_config(config):
        trainer_class = sdft.sdft_trainer  # TRL's SDFTTrainer on the task's rows as prompt + privileged_context
        train_rows = sdft.sdft_rows(task, train_rows)
    trainer = trainer_class(
        model=model,
        args=config,
        train_dataset=_dataset(train_rows),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[tracker] if tracker is not None else None,
    )
    if tracker is not None:
        tracker.bind(trainer)
    explain_training(trainer, phase)  # also TRL's SDFTTrainer
    if trainer_class is NCATrainer:
        trainer.train()
    else:  # TRL's SDFTTrainer toggles checkpointing by its deprecated names around sampling (trainers.checkpointing)
        from ..trainers.checkpointing import quiet_old_checkpointing_names

        with quiet_old_checkpointing_names():
            trainer.train()
    return trainer


CURVE_KEYS = ("loss", "opd_loss", "nca_loss", "view_kl", "nca_beta")


def compact_history(log_history: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """The per-step training logs as one list per logged term (`step` plus `CURVE_KEYS`), for figures and JSON."""
    rows = [entry for entry in log_history if "loss" in entry and "step" in entry]
    curves = {"step": [entry["step"] for entry in rows]}
    for key in CURVE_KEYS:
        if any(key in entry for entry in rows):
            curves[key] = [None if entry.get(key) is None else float(f"{entry[key]:.6g}") for entry in rows]
    return curves


def _unit_in_worker(plan: Plan, tokenizers: dict[int | None, Any], unit: tuple[str, Any]) -> str:
    """One unit in a worker, with one CPU thread: ("base", organism) evaluates that base, ("student", index) trains
    and evaluates that student. Each writes its records (and a student its folder) as a sequential run would."""
    import torch

    torch.set_num_threads(1)
    kind, key = unit
    if kind == "base":
        _evaluate_base(plan, key, tokenizers[key], Evaluated())
        return plan.base_name(key)
    run = plan.runs[key]
    _evaluate_student(plan, run, tokenizers[run.organism], Evaluated())
    return run.name


def _units_in_workers(
    plan: Plan, tokenizers: dict[int | None, Any], bases: Sequence[int | None] = (), job: JobEstimate | None = None
) -> None:
    """Evaluate the bases in `bases` and train and evaluate the unfinished students in `workers` forked processes,
    the bases first; the caller then loads each unit back from the files it wrote. The plan and the tokenizers go to
    each worker with its unit. As each student finishes, `job` prints the whole job's estimate."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    units = [("base", organism) for organism in bases]
    units += [("student", i) for i, run in enumerate(plan.runs) if not (run.folder / "done.json").exists()]
    if not units:
        return
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(min(plan.args.workers, len(units)), mp_context=context) as pool:
        work = functools.partial(_unit_in_worker, plan, tokenizers)
        futures = {pool.submit(work, unit): unit for unit in units}
        for future in as_completed(futures):
            name = future.result()
            logger.info("%s finished in a worker.", name)
            if job is not None and futures[future][0] == "student":
                say(job.finished(name), level="units")


def _evaluate_student(plan: Plan, run: Run, tokenizer, evaluated: Evaluated) -> None:
    """Train the student of `run` (or load it, when its folder holds a finished one), then evaluate it."""
    with speaking_for(run.name):  # its progress lines name it: several students may run at once
        _evaluate_named_student(plan, run, tokenizer, evaluated)


def _evaluate_named_student(plan: Plan, run: Run, tokenizer, evaluated: Evaluated) -> None:
    from ..eval import ModelRun

    model_path = plan.model_paths[run.organism]
    records_path = run.folder / "eval" / "records.jsonl"
    done_path = run.folder / "done.json"
    if done_path.exists():
        done = read_json_output(done_path, _done_fix(run))
        from peft import PeftModel

        from ..trainers.checkpointing import quiet_old_checkpointing_names

        with quiet_old_checkpointing_names():  # PEFT reads transformers' deprecated name (trainers.checkpointing)
            student = PeftModel.from_pretrained(_load_base(model_path, plan.model_init_kwargs), str(run.folder))
    else:
        done, student = _train_student(plan, run, model_path, tokenizer)
        write_text_atomic(done_path, json.dumps(done, indent=2, default=str) + "\n")
    evaluated.train_seconds[run.name] = done["train_seconds"]
    evaluated.histories[run.name] = compact_history(done["log_history"])
    evaluated.tracking[run.name] = [
        {k: row[k] for k in ("step", "acc_x", "acc_xc", "harm_count", "help_count") if k in row}
        for row in done.get("tracking", [])
    ]
    prov = plan.evaluator.provenance(student, model_path, adapter=str(run.folder))
    with in_detail():  # its estimate line is a step's: the student's end and the whole job's estimate follow it
        records = plan.evaluator.run(
            student, tokenizer, output_path=records_path, provenance=prov, desc=f"paired eval {run.name}"
        )
    evaluated.runs.append(ModelRun(run.name, records, provenance=prov, records_path=str(records_path)))
    evaluated.identity[run.name] = (run.method.name, run.organism, run.seed)
    del student


def _train_student(plan: Plan, run: Run, model_path: str, tokenizer):
    """Train and save the student of `run`; returns its `done.json` record and the trained model."""
    from ..eval import PairedEvalCallback

    args, task = plan.args, plan.task
    tracker = None
    if args.track_every > 0:
        tracker = PairedEvalCallback(
            plan.test_rows, context=task.context, scorer=task.scorer, id_column="id",
            eval_steps=args.track_every, num_items=args.track_items, generation=plan.evaluator.generation,
            eval_on_start=True, final_report=False, n_bootstrap=0,
        )  # fmt: skip
    t0 = time.perf_counter()
    trainer = train_run(
        task, run.config, model_path, plan.model_init_kwargs, tokenizer, copy.deepcopy(plan.peft_config),
        plan.train_rows,
        tracker, phase=f"training {run.name} (student {plan.runs.index(run) + 1} of {len(plan.runs)})",
    )  # fmt: skip
    trainer.save_model(str(run.folder))
    done = {
        "method": run.method.name,
        "overrides": run.method.overrides,
        "organism_seed": run.organism,
        "seed": run.seed,
        "settings": run.settings,
        "train_seconds": round(time.perf_counter() - t0, 1),
        "log_history": trainer.state.log_history,
        "tracking": [] if tracker is None else tracker.summary_rows(),
    }
    return done, trainer.accelerator.unwrap_model(trainer.model)
