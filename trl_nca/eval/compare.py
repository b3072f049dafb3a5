"""Paired evaluation of a training run's starting model and its distilled student, in one report."""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from ..sampling import GenerationSettings
from .loading import load_model
from .paired import PairedEvaluator
from .report import ModelRun, write_report


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
) -> dict[str, Any]:
    """Evaluate the base model and `trainer.model` with and without the trainer's context; write and return the report.

    A PEFT student's base is the same model with its adapter disabled (nothing is loaded again); otherwise the base is
    loaded from `base_model_path`. Records go to `<output_dir>/<base|student>/records.jsonl` (resumable).
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
    student = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(student, "disable_adapter"):
        base, base_context, base_path = student, student.disable_adapter, trainer.args.output_dir + " (adapter off)"
    else:
        if base_model_path is None:
            raise ValueError("Give base_model_path: a fully fine-tuned student has no adapter to switch off.")
        base, base_context, base_path = load_model(base_model_path), nullcontext, base_model_path
    runs = []
    for name, model, context, path in (
        ("base", base, base_context, base_path),
        ("student", student, nullcontext, trainer.args.output_dir),
    ):
        records_path = output_dir / name / "records.jsonl"
        with context():
            provenance = evaluator.provenance(model, path, None)  # names the attached adapter, active or disabled
            records = evaluator.run(model, trainer.processing_class, output_path=records_path, provenance=provenance)
        runs.append(ModelRun(name, records, provenance=provenance, records_path=records_path))
    return write_report(runs, output_dir, title=title or f"{Path(trainer.args.output_dir).name}: paired evaluation")
