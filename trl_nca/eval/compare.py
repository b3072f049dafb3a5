"""Paired evaluation of a training run's starting model and its distilled student, in one report."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..core.sampling import GenerationSettings
from .loading import load_model, release_memory
from .paired import PairedEvaluator
from .report import ModelRun, write_report


@dataclass
class TrainedModels:
    """The student a training run produced and the model it started from, ready to evaluate in this process.

    `base_context()` is the block inside which `base` is the starting model: the PEFT student with its adapter
    disabled (no second copy), or `nullcontext` for a base loaded on its own."""

    student: Any
    base: Any
    base_context: Callable[[], AbstractContextManager]
    student_path: str
    base_path: str


def models_after_training(trainer, base_model_path: str | None = None) -> TrainedModels | None:
    """After `trainer.train()` and `trainer.save_model(output_dir)`: the student and its base for the evaluation,
    on the main process; None on every other process.

    A single process without DeepSpeed evaluates the student it holds. A distributed run (several processes, or any
    DeepSpeed run) must not evaluate on the main process while it still holds one shard of a model whose other shards
    live in processes that have moved on: every process first waits for the others, the trainer's models and optimizer
    are released, the process group is closed, and the main process loads what `save_model` wrote (the full model, or
    the base and the saved adapter) onto its own device, with DeepSpeed's load-time partitioning switched off. The
    trainer cannot train after that.
    """
    output_dir = trainer.args.output_dir
    distributed = trainer.accelerator.num_processes > 1 or trainer.is_deepspeed_enabled
    if not distributed:
        student = trainer.accelerator.unwrap_model(trainer.model)
        if hasattr(student, "disable_adapter"):
            return TrainedModels(student, student, student.disable_adapter, output_dir, f"{output_dir} (adapter off)")
        if base_model_path is None:
            raise ValueError("Give base_model_path: a fully fine-tuned student has no adapter to switch off.")
        base = load_model(base_model_path, device=str(trainer.args.device))
        return TrainedModels(student, base, nullcontext, output_dir, base_model_path)
    main = trainer.accelerator.is_main_process
    device = trainer.args.device
    _release_training(trainer)
    if not main:
        return None
    adapter = Path(output_dir, "adapter_config.json").is_file()
    if adapter:
        base_path = (
            base_model_path
            or json.loads(Path(output_dir, "adapter_config.json").read_text())["base_model_name_or_path"]
        )
        student = load_model(base_path, adapter=output_dir, device=str(device))
        return TrainedModels(student, student, student.disable_adapter, output_dir, f"{output_dir} (adapter off)")
    if base_model_path is None:
        raise ValueError("Give base_model_path: a fully fine-tuned student has no adapter to switch off.")
    student = load_model(output_dir, device=str(device))
    base = load_model(base_model_path, device=str(device))
    return TrainedModels(student, base, nullcontext, output_dir, base_model_path)


def _release_training(trainer) -> None:
    """Every process waits for the others, drops the trainer's models, optimizer and engine, and leaves the process
    group; DeepSpeed's ZeRO-3 load-time partitioning (which would broadcast to processes that are gone) is switched
    off in this process."""
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.free_memory()
    for name in ("model", "model_wrapped", "deepspeed", "optimizer", "lr_scheduler", "teacher_model"):
        if hasattr(trainer, name):
            setattr(trainer, name, None)
    release_memory()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()


def compare_base_and_student(
    trainer,
    dataset,
    *,
    base_model_path: str | None = None,
    scorer: Any = "mcq",
    label_column: str = "answer",
    id_column: str | None = "id",
    generation: GenerationSettings | None = None,
    output_dir: str | os.PathLike | None = None,
    title: str | None = None,
) -> dict[str, Any] | None:
    """Evaluate the base model and the trained student with and without the trainer's context; write and return the
    report (on the main process; None on the others).

    Call it on every process after `trainer.save_model(trainer.args.output_dir)`: a distributed run hands the
    evaluation to the main process alone, from the saved model (`models_after_training`). A PEFT student's base is the
    same model with its adapter disabled (nothing is loaded again); otherwise the base is loaded from
    `base_model_path`. Records go to `<output_dir>/<base|student>/records.jsonl` (resumable).
    """
    output_dir = Path(output_dir or Path(trainer.args.output_dir) / "paired_eval")
    evaluator = PairedEvaluator(
        dataset,
        context=trainer.context_spec,
        scorer=scorer,
        label_column=label_column,
        id_column=id_column,
        generation=generation or GenerationSettings(),
    )
    models = models_after_training(trainer, base_model_path)
    if models is None:
        return None
    student, base, base_context = models.student, models.base, models.base_context
    base_path = models.base_path
    runs = []
    for name, model, context, path in (
        ("base", base, base_context, base_path),
        ("student", student, nullcontext, models.student_path),
    ):
        records_path = output_dir / name / "records.jsonl"
        with context():
            provenance = evaluator.provenance(model, path, None)  # names the attached adapter, active or disabled
            records = evaluator.run(
                model,
                trainer.processing_class,
                output_path=records_path,
                provenance=provenance,
                desc=f"paired eval {name}",
            )
        runs.append(ModelRun(name, records, provenance=provenance, records_path=records_path))
    return write_report(runs, output_dir, title=title or f"{Path(trainer.args.output_dir).name}: paired evaluation")
