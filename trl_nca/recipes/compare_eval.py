"""What a comparison evaluates: the base models (one per organism), the exclusion rule applied to them, and each
evaluated model's metrics as one row of the tables (`Evaluated` holds what has been evaluated so far)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from transformers import AutoModelForCausalLM, AutoTokenizer

from ..console import speaking_for
from ..eval import ModelRun
from ..eval.columns import run_interval_keys
from ..eval.metrics import bootstrap_intervals, paired_arrays, view_samples
from ..eval.report import summarize_run
from ..eval.scorers import normalize_text
from ..tasks import BuiltinTask
from .compare_args import CompareInputError
from .compare_plan import Plan
from .statistics import SUMMARY_KEYS


logger = logging.getLogger(__name__)


def load_base(model_path: str, model_init_kwargs: dict[str, Any]):
    return AutoModelForCausalLM.from_pretrained(model_path, **model_init_kwargs)


def diagnostic_rates(task: BuiltinTask, records) -> dict[str, float]:
    """For each diagnostic of the task, the fraction of responses per view that match it: `{name}_x` and `{name}_xc`
    (over all k samples of each view with k samples per view). A diagnostic is a name and either a row column (the
    response, after normalisation, equals that column: the organism's twice-applied answer) or `{"answer": column}`
    (the scorer's parsed answer equals that column: `twice` for a reply that begins with its marker twice)."""
    diagnostics = task.info.get("diagnostics") or {}
    if not diagnostics or not records:
        return {}
    rows = {row["id"]: row for row in task.test}
    rates = {}
    for name, spec in diagnostics.items():
        by_answer = isinstance(spec, dict)
        column = spec["answer"] if by_answer else spec
        for view in ("x", "xc"):
            hits = [
                (sample.answer or "") == str(rows[r.item_id][column])
                if by_answer
                else normalize_text(sample.completion) == normalize_text(str(rows[r.item_id][column]))
                for r in records
                for sample in view_samples(getattr(r, view))
            ]
            rates[f"{name}_{view}"] = sum(hits) / len(hits)
    return rates


@dataclass
class Evaluated:
    """What `execute` has evaluated so far: every model's records (`runs`), which method, organism and seed each
    run is (`identity`), and each student's training time, compact log history and tracking rows."""

    runs: list[Any] = field(default_factory=list)
    identity: dict[str, tuple[str, int | None, int | None]] = field(default_factory=dict)
    train_seconds: dict[str, float] = field(default_factory=dict)
    histories: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    tracking: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    exclusion: dict[str, dict[str, Any]] = field(default_factory=dict)


def apply_exclusion(plan: Plan, evaluated: Evaluated) -> Plan:
    """The exclusion rule and the organism limit of the plan, applied to the evaluated bases: the plan without the
    runs (and base rows) of the organisms left out; each organism's verdict goes to `evaluated.exclusion`."""
    args = plan.args
    if args.organism_min_base_acc_xc is None and args.organism_limit is None:
        return plan

    kept: list[int | None] = []
    for run in list(evaluated.runs):
        _, organism, _ = evaluated.identity[run.name]
        acc_xc = summarize_run(run, n_bootstrap=0)["metrics"].get("acc_xc")
        rule = args.organism_min_base_acc_xc
        if rule is not None and (acc_xc is None or acc_xc < rule):
            verdict = f"excluded: base Acc_xc {100 * (acc_xc or 0):.1f}% < {100 * rule:.1f}%"
        elif args.organism_limit is not None and len(kept) >= args.organism_limit:
            verdict = f"not run: the first {args.organism_limit} organisms that pass are run"
        else:
            kept.append(organism)
            verdict = "included"
        evaluated.exclusion[str(organism)] = {"base_acc_xc": acc_xc, "verdict": verdict}
        logger.warning("Organism %s: %s.", organism, verdict)
    if not kept:
        verdicts = "; ".join(f"organism {o}: {v['verdict']}" for o, v in evaluated.exclusion.items())
        raise CompareInputError(
            f"The exclusion rule `organism_min_base_acc_xc: {args.organism_min_base_acc_xc}` excluded every organism "
            f"({verdicts}); nothing is left to "
            "compare. Pretrain organisms that pass it, or fix the rule before any run."
        )
    evaluated.runs = [r for r in evaluated.runs if evaluated.identity[r.name][1] in kept]
    return dataclasses.replace(plan, runs=[run for run in plan.runs if run.organism in kept])


def evaluate_bases(plan: Plan, evaluated: Evaluated) -> dict[int | None, Any]:
    """Evaluate each base model (one per organism seed), or load its records where a worker or an earlier invocation
    wrote them; returns their tokenizers, which the students share."""
    tokenizers = load_tokenizers(plan)
    for organism in plan.model_paths:
        evaluate_base(plan, organism, tokenizers[organism], evaluated)
    return tokenizers


def load_tokenizers(plan: Plan) -> dict[int | None, Any]:
    return {organism: AutoTokenizer.from_pretrained(path) for organism, path in plan.model_paths.items()}


def evaluate_base(plan: Plan, organism: int | None, tokenizer, evaluated: Evaluated) -> None:
    """The paired evaluation of one base model, its records appended to `evaluated`."""
    model_path = plan.model_paths[organism]
    base = load_base(model_path, plan.model_init_kwargs)
    prov = plan.evaluator.provenance(base, model_path)
    path = plan.base_folder(organism) / "records.jsonl"
    name = plan.base_name(organism)

    with speaking_for(name):  # its progress lines name it
        records = plan.evaluator.run(base, tokenizer, output_path=path, provenance=prov, desc=f"paired eval {name}")
    evaluated.runs.append(ModelRun(name, records, provenance=prov, records_path=str(path)))
    evaluated.identity[name] = ("base", organism, None)


def bases_decide_runs(plan: Plan) -> bool:
    """Whether the bases' results choose which students run (the exclusion rule or the organism limit), so that the
    bases are evaluated before any student starts."""
    return plan.args.organism_min_base_acc_xc is not None or plan.args.organism_limit is not None


def per_seed_rows(
    task: BuiltinTask, evaluated: Evaluated, diagnostics: dict[str, dict[str, float]] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Every evaluated model's metrics as one row, grouped by method (the base models under "base"). `diagnostics`:
    each model's diagnostic rates when its records hold no text (a slice's, `recipes.slices`). A row's `ci` holds the
    run's own bootstrap interval over items of each metric whose column shows one per run (`Column.run_ci`)."""
    per_seed: dict[str, list[dict[str, Any]]] = {}
    for run in evaluated.runs:
        method, organism, seed = evaluated.identity[run.name]
        metrics = summarize_run(run, n_bootstrap=0)["metrics"]
        row = {k: metrics.get(k) for k in SUMMARY_KEYS}
        row.update(diagnostic_rates(task, run.records) if diagnostics is None else diagnostics[run.name])
        intervals = bootstrap_intervals(paired_arrays(run.records)) if run.records else {}
        row["ci"] = {k: None if intervals.get(k) is None else list(intervals[k]) for k in run_interval_keys()}
        row.update(regime=metrics.get("regime"), organism=organism, seed=seed)
        per_seed.setdefault(method, []).append(row)
    return per_seed
