"""What both paths of `trl-nca eval` share: the model specs, the checks of the run options, and the report with
its table on the console."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..console import say
from ..core.sampling import vllm_available
from ..eval import loading
from ..eval.errors import EvalInputError
from ..eval.loading import ModelSpec
from ..eval.report import ModelRun, console_table, write_report
from .options import DEFAULT_SEPARATOR, DEFAULT_TEMPLATE


def parse_model_specs(models: Sequence[str], adapters: Sequence[str]) -> list[ModelSpec]:
    """Pair `--model [NAME=]PATH[:ADAPTER]` and `--adapter [NAME=]PATH` values into named model specs (see
    `--help`)."""
    return loading.parse_model_specs(models, adapters, inline_adapters=True)


def check_run_options(args) -> None:
    """The value ranges and combinations of the options that `GenerationSettings` does not check itself."""
    if not 0 < args.alpha < 1:  # also refuses nan
        raise EvalInputError(f"--alpha must be a significance level within (0, 1), e.g. 0.05; got {args.alpha}.")
    if args.bootstrap < 0:
        raise EvalInputError(f"--bootstrap must be 0 (no intervals) or a number of resamples, got {args.bootstrap}.")
    sampling = [
        f"--{name.replace('_', '-')}" for name in ("temperature", "top_p", "top_k") if getattr(args, name) is not None
    ]
    if args.greedy and sampling:
        raise EvalInputError(
            f"--greedy decodes without sampling, so {', '.join(sampling)} would be ignored. Drop --greedy to sample "
            f"with them, or drop {', '.join(sampling)}."
        )
    if args.placement == "system" and args.template != DEFAULT_TEMPLATE:
        raise EvalInputError(
            "--template joins the context and the prompt in the user turn, so it applies only with --placement user; "
            "with --placement system it would be ignored. Add --placement user, or drop --template."
        )
    if args.placement == "user" and args.separator != DEFAULT_SEPARATOR:
        raise EvalInputError(
            "--separator joins the context and a system message, so it applies only with --placement system; with "
            "--placement user it would be ignored. Drop --separator, or use --template to join context and prompt."
        )
    loading.check_device(args.device)
    if args.samples_per_view < 1:
        raise EvalInputError(f"--samples-per-view must be at least 1, got {args.samples_per_view}.")
    if args.game and args.samples_per_view != 1:
        raise EvalInputError("--samples-per-view applies to dataset items; a game map is played once per view.")
    if args.backend == "vllm" and not vllm_available():
        raise EvalInputError("--backend vllm needs vllm installed (`pip install vllm`); use --backend hf.")


def write_eval_report(runs: Sequence[ModelRun], output_dir: Path, args) -> dict[str, Any]:
    """The report of every model side by side (`trl_nca.eval.report.write_report`), with the command line."""
    return write_report(
        runs,
        output_dir,
        alpha=args.alpha,
        n_bootstrap=args.bootstrap,
        bootstrap_seed=args.bootstrap_seed,
        plots=False if args.no_plots else None,  # without matplotlib: skipped, with one line saying so
        title=args.title,
        extra={"command": {k: v for k, v in vars(args).items() if not callable(v)}},
    )


def print_result_table(summary) -> None:
    """The report's main table on the console (also under `--quiet`), before the closing line."""
    say("\n" + console_table(summary))
