"""Paired with/without-context evaluation: does the student still need the context, and does the context still help?

Each item is generated once without the context (view `x`) and once with it (view `xc`), with the same seed and
sampling; the paired outcomes give accuracy per view, harm, help, McNemar's test and a regime (A/B/C). Dataset items
(`PairedEvaluator`) and game maps (`evaluate_game`, `trl_nca.eval.games`) go through the same runner
(`trl_nca.eval.runner`): one resume mechanism, one run key, one provenance record. lm-evaluation-harness tasks
(`evaluate_harness`, `trl_nca.eval.harness`) go through it too, lm-eval scoring each document.
"""

from ..core.sampling import GenerationSettings, HFBackend, PerRowSampler, VLLMBackend, item_seed
from .compare import TrainedModels, compare_base_and_student, models_after_training
from .errors import EvalInputError
from .games import GameEvaluation, check_game_options, evaluate_game, game_summary, run_game_eval
from .harness import HarnessOptions, HarnessTask, evaluate_harness, harness_tasks
from .loading import load_model
from .metrics import bootstrap_intervals, classify_regime, compute_metrics, flatten_metrics, mcnemar_exact
from .paired import PairedEvaluator, evaluate_paired
from .records import PairedRecord, ViewOutcome
from .report import ModelRun, render_markdown, write_report
from .runner import PairedTask, run_key, run_paired, run_provenance
from .scorers import (
    CallableScorer,
    MultipleChoiceScorer,
    Score,
    Scorer,
    StringMatchScorer,
    YesNoScorer,
    get_scorer,
    parse_mcq_reference,
    parse_mcq_strict,
)
from .store import load_records


__all__ = [
    "TrainedModels",
    "compare_base_and_student",
    "models_after_training",
    "CallableScorer",
    "EvalInputError",
    "GameEvaluation",
    "GenerationSettings",
    "HFBackend",
    "HarnessOptions",
    "HarnessTask",
    "ModelRun",
    "MultipleChoiceScorer",
    "PairedEvalCallback",
    "PairedEvaluator",
    "PairedRecord",
    "PairedTask",
    "PerRowSampler",
    "Score",
    "Scorer",
    "StringMatchScorer",
    "VLLMBackend",
    "ViewOutcome",
    "YesNoScorer",
    "bootstrap_intervals",
    "check_game_options",
    "classify_regime",
    "compute_metrics",
    "evaluate_game",
    "evaluate_harness",
    "evaluate_paired",
    "flatten_metrics",
    "game_summary",
    "get_scorer",
    "harness_tasks",
    "item_seed",
    "load_model",
    "load_records",
    "mcnemar_exact",
    "parse_mcq_reference",
    "parse_mcq_strict",
    "render_markdown",
    "run_game_eval",
    "run_key",
    "run_paired",
    "run_provenance",
    "write_report",
]


def __getattr__(name: str):
    # The callback imports transformers' Trainer machinery; load it only when asked for.
    if name == "PairedEvalCallback":
        from .callback import PairedEvalCallback

        return PairedEvalCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
