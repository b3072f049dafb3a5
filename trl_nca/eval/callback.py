"""A training callback that runs the paired with/without-context evaluation every N steps and at the end of training."""

from __future__ import annotations

import contextlib
import json
import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

from ..core.sampling import GenerationSettings
from ..core.views import ContextSpec
from .harness import HarnessOptions, HarnessTask, harness_tasks, hf_lm
from .metrics import compute_metrics, flatten_metrics
from .paired import PairedEvaluator
from .records import PairedRecord
from .report import ModelRun, write_report
from .runner import run_provenance


logger = logging.getLogger(__name__)


@contextlib.contextmanager
def preserved_rng_state() -> Iterator[None]:
    """Run a block without changing the python `random`, numpy, torch CPU and accelerator RNG streams."""
    py_state = random.getstate()
    np_state = np.random.get_state()
    torch_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    mps_state = None
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        mps_state = torch.mps.get_rng_state()
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        if mps_state is not None:
            torch.mps.set_rng_state(mps_state)


class PairedEvalCallback(TrainerCallback):
    """Every `eval_steps` optimizer steps, evaluate the current model without and with the context on a fixed subset.

    The metrics (accuracy per view, harm, help, lengths, McNemar p, regime code, ...) are logged under `prefix`
    through the trainer's loggers, so they appear in TensorBoard / W&B next to the losses, and kept in `history`. At
    the end of training a full report (records JSONL, summary JSON, Markdown, figures) is written to `output_dir`
    (default `<args.output_dir>/paired_eval`).

    The evaluation does not perturb training: the python/numpy/torch/CUDA RNG states are saved and restored around it
    (sampling itself uses private per-item generators), and the model is put back in train mode. It runs on the main
    process only, so it is refused at the trainer's init under ZeRO-3 (sharded weights).

    Logging needs the trainer: pass `trainer=` or call `callback.bind(trainer)`. It calls the base
    `transformers.Trainer.log`, bypassing subclass overrides (TRL's trainers flush their accumulated training metrics
    in `log`, which would shift their averaging windows). Without a trainer the metrics only go to
    `state.log_history` and `history`.

    Args:
        eval_dataset: rows with a prompt, a label and (unless `context.text` is set) a context column.
        context: the same `ContextSpec` the trainer uses (`NCAConfig.context_spec`), so both views match training.
        scorer: scorer name or object (see `trl_nca.eval.scorers`).
        eval_steps: evaluate when `global_step % eval_steps == 0`; 0 disables periodic evaluation.
        num_items: size of the fixed subset (the first rows); None uses all.
        generation: sampling settings (defaults: `GenerationSettings()` with `max_new_tokens=256`).
        final_report: evaluate and write the report at the end of training.
        eval_on_start: also evaluate before the first step (step 0).
        tasks: lm-evaluation-harness task names to evaluate instead of `eval_dataset` (`trl_nca.eval.harness`; needs
            `pip install "trl-nca[harness]"`): each task's metrics are logged under `prefix + TASK + "/"`, and the final
            report has one row per task. `num_items` then keeps each task's first documents.
        include_path: a folder of local task YAMLs (with `tasks`).
        harness_options: how the tasks run (`HarnessOptions`; with `tasks`).
        evaluator_kwargs: passed to `PairedEvaluator` (`label_column`, `id_column`, `prompt_column`,
            `samples_per_view`, ...).
    """

    def __init__(
        self,
        eval_dataset=None,
        *,
        context: ContextSpec,
        scorer: Any = "mcq",
        eval_steps: int = 50,
        num_items: int | None = 64,
        generation: GenerationSettings | None = None,
        trainer=None,
        tokenizer=None,
        prefix: str = "paired/",
        final_report: bool = True,
        eval_on_start: bool = False,
        output_dir: str | None = None,
        model_name: str = "student",
        alpha: float = 0.05,
        n_bootstrap: int = 200,
        tasks: Sequence[str] | None = None,
        include_path: str | None = None,
        harness_options: HarnessOptions | None = None,
        **evaluator_kwargs,
    ):
        if (eval_dataset is None) == (tasks is None):
            raise ValueError("Give PairedEvalCallback either an eval_dataset or harness `tasks`, not both.")
        self.evaluator = None
        self.harness_tasks: list[HarnessTask] = []
        if tasks is not None:
            if evaluator_kwargs:
                raise ValueError(f"{sorted(evaluator_kwargs)} apply to an eval_dataset, not to harness tasks.")
            options = harness_options or HarnessOptions()
            if options.limit is None and num_items is not None:
                options = replace(options, limit=num_items)
            self.harness_tasks = harness_tasks(tasks, context, options, include_path=include_path)
        else:
            self.evaluator = PairedEvaluator(
                eval_dataset,
                context=context,
                scorer=scorer,
                generation=generation or GenerationSettings(max_new_tokens=256),
                limit=num_items,
                **evaluator_kwargs,
            )
        self.eval_steps = eval_steps
        self.trainer = trainer
        self.tokenizer = tokenizer
        self.prefix = prefix
        self.final_report = final_report
        self.eval_on_start = eval_on_start
        self.output_dir = output_dir
        self.model_name = model_name
        self.alpha = alpha
        self.n_bootstrap = n_bootstrap
        self.history: list[dict[str, Any]] = []
        self.last_records: list[PairedRecord] | None = None
        self.last_runs: list[ModelRun] = []  # the last evaluation's runs, one per harness task
        self._last_step: int | None = None
        self._last_provenance: dict[str, Any] = {}
        self._warned = False

    def bind(self, trainer) -> PairedEvalCallback:
        """Attach the trainer whose loggers receive the metrics."""
        self.trainer = trainer
        return self

    def _output_dir(self, args) -> Path:
        return Path(self.output_dir) if self.output_dir else Path(args.output_dir) / "paired_eval"

    def evaluate_tasks(self, model, tokenizer, step: int) -> dict[str, dict[str, Any]]:
        """Run every harness task on the current weights (RNG states and train/eval mode kept): metrics by task."""
        was_training = model.training
        metrics = {}
        runs = []
        with preserved_rng_state():
            try:
                lm = hf_lm(model, tokenizer, self.harness_tasks[0].options)
                for task in self.harness_tasks:
                    provenance = {**run_provenance(task, model, tokenizer, generation=task.settings()), "step": step}
                    records = task.run(model, tokenizer, lm=lm, provenance=provenance)
                    runs.append(ModelRun(f"{self.model_name}/{task.name}", records, provenance=provenance))
                    metrics[task.name] = compute_metrics(records, alpha=self.alpha, n_bootstrap=self.n_bootstrap)
            finally:
                model.train(was_training)
        self.last_runs, self._last_step = runs, step
        return metrics

    def evaluate(self, model, tokenizer, step: int) -> tuple[list[PairedRecord], dict[str, Any]]:
        """Run the paired evaluation on the current weights, leaving RNG states and train/eval mode as they were."""
        was_training = model.training
        with preserved_rng_state():
            try:
                provenance = {**self.evaluator.provenance(model), "step": step}
                records = self.evaluator.run(model, tokenizer, progress=False, provenance=provenance)
                metrics = compute_metrics(records, alpha=self.alpha, n_bootstrap=self.n_bootstrap)
            finally:
                model.train(was_training)
        self.last_records, self._last_step = records, step
        self._last_provenance = provenance
        return records, metrics

    def _run(self, args, state, model, tokenizer, final: bool = False) -> None:
        tokenizer = self.tokenizer or tokenizer
        if model is None or tokenizer is None:
            raise ValueError("PairedEvalCallback needs the trainer's model and processing_class (or `tokenizer=`).")
        if self.harness_tasks:
            by_task = self.evaluate_tasks(model, tokenizer, state.global_step)
            entries = [
                {"step": state.global_step, "final": final, "task": name, "metrics": metrics}
                for name, metrics in by_task.items()
            ]
            logs = {k: v for name, m in by_task.items() for k, v in flatten_metrics(m, f"{self.prefix}{name}/").items()}
        else:
            _, metrics = self.evaluate(model, tokenizer, state.global_step)
            entries = [{"step": state.global_step, "final": final, "metrics": metrics}]
            logs = flatten_metrics(metrics, self.prefix)
        self.history += entries
        if args.output_dir or self.output_dir:
            path = self._output_dir(args)
            path.mkdir(parents=True, exist_ok=True)
            with (path / "history.jsonl").open("a", encoding="utf-8") as f:
                f.writelines(json.dumps(entry, default=str) + "\n" for entry in entries)
        self._log(state, logs)

    def _log(self, state, logs: dict[str, float]) -> None:
        if self.trainer is not None:
            from transformers import Trainer

            # Trainer.log clears `control.should_log` (CallbackHandler.on_log does): called from on_step_end, that
            # would skip the trainer's own logging of this step, so the flag is put back.
            control = getattr(self.trainer, "control", None)
            should_log = getattr(control, "should_log", None)
            if isinstance(self.trainer, Trainer):
                Trainer.log(self.trainer, dict(logs))
            else:
                self.trainer.log(dict(logs))
            if should_log is not None:
                self.trainer.control.should_log = should_log
            return
        if not self._warned:
            logger.warning("PairedEvalCallback has no trainer bound: metrics go to state.log_history only.")
            self._warned = True
        state.log_history.append({**logs, "step": state.global_step})

    def on_init_end(self, args, state, control, **kwargs):
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

        if is_deepspeed_zero3_enabled() and args.world_size > 1:
            raise ValueError(
                "PairedEvalCallback evaluates on the main process alone, which under DeepSpeed ZeRO-3 holds one shard "
                "of the student: its generation would wait for the other processes forever. Drop the callback and "
                "evaluate after training (trl_nca.eval.compare_base_and_student, as the example scripts do), or train "
                "under ZeRO-2 or DDP."
            )

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if self.eval_on_start and state.is_world_process_zero:
            self._run(args, state, model, processing_class)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if self.eval_steps > 0 and state.global_step % self.eval_steps == 0 and state.is_world_process_zero:
            self._run(args, state, model, processing_class)

    def on_train_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if not self.final_report or not state.is_world_process_zero:
            return
        if self._last_step != state.global_step or (self.last_records is None and not self.last_runs):
            self._run(args, state, model, processing_class, final=True)
        if self.harness_tasks:
            runs = list(self.last_runs)
        else:
            runs = [ModelRun(self.model_name, list(self.last_records), provenance=self._last_provenance)]
        write_report(
            runs,
            self._output_dir(args),
            alpha=self.alpha,
            n_bootstrap=self.n_bootstrap,
            title=f"Paired evaluation at step {state.global_step}",
        )

    def summary_rows(self) -> Sequence[dict[str, Any]]:
        """One flat dict of metrics per evaluation so far (for quick inspection or plotting)."""
        return [
            {"step": e["step"], **({"task": e["task"]} if "task" in e else {}), **flatten_metrics(e["metrics"])}
            for e in self.history
        ]
