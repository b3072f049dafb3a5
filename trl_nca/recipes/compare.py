"""Train plain OPD and NCA students from the same initial weights on a built-in task, then compare them paired.

The recipe behind `trl-nca compare` and the README's main job:

1. generate the task (`trl_nca.tasks.get_task`): training rows, held-out rows, the context and the scorer;
2. for every training seed and every method (a name plus `NCAConfig` overrides, e.g. `opd:nca_beta=0`,
   `nca:nca_beta=0.5`), train a LoRA student by self-distillation from the same base weights and save its adapter;
3. evaluate the base model and every student on the held-out rows, once without and once with the context, with the
   same per-item seeds and sampling settings (`trl_nca.eval.PairedEvaluator`);
4. write the per-model paired report, a table of mean and spread over seeds, figures (accuracy per view as in the
   paper's Figure 1, training curves, accuracy along training) and a one-sentence reading of the table.

Every step is resumable: a finished run leaves `done.json` next to its adapter and is not trained again, and the
evaluation records are appended item by item and reloaded on a rerun.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..tasks import BuiltinTask, get_task


logger = logging.getLogger(__name__)

SUMMARY_KEYS = ("acc_x", "acc_xc", "delta", "harm", "help", "both_correct", "length_change")


@dataclass
class CompareArguments:
    """Options of `trl-nca compare`; training options are those of `NCAConfig`, model and LoRA options those of
    `trl.ModelConfig` (`model_name_or_path`, `use_peft`, `lora_r`, `lora_target_modules`, ...)."""

    task: str = field(
        default="reply_in_french",
        metadata={"help": "Built-in task (trl_nca.tasks): reply_in_french (instruction) or island_facts (knowledge)."},
    )
    task_seed: int = field(default=0, metadata={"help": "Seed that generates the task's items."})
    seeds: list[int] = field(default_factory=lambda: [0], metadata={"help": "Training seeds; each method runs once "
                             "per seed from the same initial weights."})  # fmt: skip
    methods: list[str] = field(
        default_factory=lambda: ["opd:nca_beta=0", "nca:nca_beta=0.5"],
        metadata={"help": "Methods as NAME:FIELD=VALUE[,FIELD=VALUE...] overrides of the training config, e.g. "
                  "'opd:nca_beta=0' 'nca:nca_beta=0.5'."},
    )  # fmt: skip
    num_train: int | None = field(default=None, metadata={"help": "Train on the first N training rows only."})
    eval_items: int | None = field(default=None, metadata={"help": "Evaluate on the first N held-out rows only."})
    eval_batch_size: int = field(default=32, metadata={"help": "Prompts per generate call in the evaluation."})
    eval_max_new_tokens: int | None = field(
        default=None, metadata={"help": "Reply budget of the evaluation (default: the training max_new_tokens)."}
    )
    eval_temperature: float = field(default=1.0, metadata={"help": "Evaluation sampling temperature (OPCD: 1.0)."})
    eval_top_p: float = field(default=0.95, metadata={"help": "Evaluation top-p (OPCD QA: 0.95)."})
    eval_top_k: int = field(default=20, metadata={"help": "Evaluation top-k (OPCD QA: 20)."})
    eval_seed: int = field(default=0, metadata={"help": "Seed of the per-item evaluation random streams."})
    track_every: int = field(
        default=0,
        metadata={"help": "Every N optimizer steps, evaluate both views on `track_items` held-out rows (0: never)."},
    )
    track_items: int = field(default=32, metadata={"help": "Held-out rows evaluated along training."})
    monitor_opd: bool = field(
        default=True,
        metadata={"help": "Log nca_loss and view_kl for nca_beta=0 runs too (one extra forward, no gradient)."},
    )


@dataclass
class Method:
    """A named set of `NCAConfig` overrides."""

    name: str
    overrides: dict[str, Any]


def parse_method(spec: str) -> Method:
    """`"nca:nca_beta=0.5,top_k=64"` -> Method("nca", {"nca_beta": 0.5, "top_k": 64}); values are read as YAML."""
    name, sep, rest = spec.partition(":")
    if not sep or not name.strip():
        raise ValueError(
            f"Method {spec!r} must look like NAME:FIELD=VALUE[,FIELD=VALUE...], e.g. 'opd:nca_beta=0' or "
            "'nca:nca_beta=0.5'."
        )
    overrides: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"In method {spec!r}, {item!r} is not FIELD=VALUE.")
        overrides[key.strip()] = yaml.safe_load(value)
    return Method(name.strip(), overrides)


def _check_methods(methods: Sequence[Method], config) -> None:
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"Method names must be unique, got {names}.")
    known = {f.name for f in dataclasses.fields(config)}
    for method in methods:
        unknown = sorted(set(method.overrides) - known)
        if unknown:
            raise ValueError(f"Method {method.name!r} sets {unknown}, which are not NCAConfig fields.")


def run_config(config, task: BuiltinTask, method: Method, seed: int, output_dir: Path, monitor_opd: bool):
    """The training config of one run: the shared config with the task's context, the method's overrides, the seed
    and the run's folder."""
    context = task.context
    overrides = {
        "output_dir": str(output_dir),
        "seed": seed,
        "save_strategy": "no",
        "context_text": context.text,
        "context_column": context.column or "context",
        "context_placement": context.placement,
        "context_template": context.template,
        "context_separator": context.separator,
        **method.overrides,
    }
    if monitor_opd and float(overrides.get("nca_beta", config.nca_beta)) == 0:
        overrides.setdefault("nca_monitor", True)
    return dataclasses.replace(config, **overrides)


def _load_base(model_path: str, model_init_kwargs: dict[str, Any]):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, **model_init_kwargs)


def _dataset(rows: Sequence[dict[str, Any]]):
    from datasets import Dataset

    return Dataset.from_list(list(rows))


def train_run(
    task: BuiltinTask, config, model_path: str, model_init_kwargs, tokenizer, peft_config, train_rows, tracker=None
):
    """Train one student; returns the trainer (its model holds the trained adapter)."""
    from ..trainer import NCATrainer

    model = _load_base(model_path, model_init_kwargs)
    trainer = NCATrainer(
        model=model,
        args=config,
        train_dataset=_dataset(train_rows),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[tracker] if tracker is not None else None,
    )
    if tracker is not None:
        tracker.bind(trainer)
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


def _finite(value: Any) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def diagnostic_rates(task: BuiltinTask, records) -> dict[str, float]:
    """For each diagnostic of the task (a name and a row column, e.g. the organism's twice-applied answer), the
    fraction of responses per view that equal that column after normalisation: `{name}_x` and `{name}_xc`."""
    from ..eval.scorers import normalize_text

    diagnostics = task.info.get("diagnostics") or {}
    if not diagnostics or not records:
        return {}
    rows = {row["id"]: row for row in task.test}
    rates = {}
    for name, column in diagnostics.items():
        for view in ("x", "xc"):
            hits = [
                normalize_text(getattr(r, view).completion) == normalize_text(str(rows[r.item_id][column]))
                for r in records
            ]
            rates[f"{name}_{view}"] = sum(hits) / len(hits)
    return rates


def aggregate(
    summaries: dict[str, list[dict[str, Any]]], keys: Sequence[str] = SUMMARY_KEYS
) -> dict[str, dict[str, Any]]:
    """Mean, sample standard deviation, min and max over seeds of each summary metric, per method."""
    out = {}
    for method, per_seed in summaries.items():
        stats: dict[str, Any] = {"n_seeds": len(per_seed), "regimes": [m.get("regime") for m in per_seed]}
        for key in keys:
            values = [v for v in (_finite(m.get(key)) for m in per_seed) if v is not None]
            if not values:
                stats[key] = None
                continue
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
            stats[key] = {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": len(values)}
        out[method] = stats
    return out


def _pct(stat: dict[str, Any] | None, spread: bool = True) -> str:
    if stat is None:
        return "n/a"
    text = f"{100 * stat['mean']:.1f}"
    if spread and stat["n"] > 1:
        text += f" ± {100 * stat['std']:.1f}"
    return text


COLUMN_NAMES = {"acc_x": "Acc_x", "acc_xc": "Acc_xc", "delta": "Delta", "harm": "Harm", "help": "Help",
                "both_correct": "BothCorrect", "length_change": "Length change"}  # fmt: skip


def render_table(
    aggregated: dict[str, dict[str, Any]], per_seed: dict[str, list[dict[str, Any]]], keys: Sequence[str] = SUMMARY_KEYS
) -> str:
    """Markdown (rates in %): mean ± sample standard deviation over seeds per method, then one row per seed."""
    names = [COLUMN_NAMES.get(k, k) for k in keys]
    header = "| Model | seeds | " + " | ".join(names) + " | Regime |"
    rule = "|" + "---|" * (len(keys) + 3)
    lines = [header, rule]
    for method, stats in aggregated.items():
        cells = [method, str(stats["n_seeds"])] + [_pct(stats[k]) for k in keys]
        cells.append(", ".join(r or "n/a" for r in stats["regimes"]))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Per seed:", "", header.replace("seeds", "seed"), rule]
    for method, rows in per_seed.items():
        for row in rows:
            cells = [method, "-" if row.get("seed") is None else str(row["seed"])]
            cells += [_pct({"mean": row[k], "n": 1}) if _finite(row.get(k)) is not None else "n/a" for k in keys]
            lines.append("| " + " | ".join(cells + [row.get("regime") or "n/a"]) + " |")
    return "\n".join(lines)


def conclusion(task: str, aggregated: dict[str, dict[str, Any]]) -> str:
    """One sentence stating what the table shows for the base, the plain OPD and the NCA students."""

    def num(method: str, key: str) -> str:
        stat = aggregated.get(method, {}).get(key)
        return "n/a" if stat is None else f"{100 * stat['mean']:.0f}%"

    parts = [f"On {task}, the base model answers {num('base', 'acc_x')} without and {num('base', 'acc_xc')} with the "
             "context"]  # fmt: skip
    for method in aggregated:
        if method == "base":
            continue
        regimes = ", ".join(r or "n/a" for r in aggregated[method]["regimes"])
        parts.append(
            f"{method} reaches {num(method, 'acc_x')} without and {num(method, 'acc_xc')} with it (harm "
            f"{num(method, 'harm')}, length change {num(method, 'length_change')}, regime {regimes})"
        )
    return "; ".join(parts) + "."


def run_comparison(args: CompareArguments, config, model_args) -> dict[str, Any]:
    """Train, evaluate and report; see the module docstring. Returns the summary written to `comparison.json`."""
    from transformers import AutoTokenizer
    from trl import get_peft_config

    from ..eval import GenerationSettings, ModelRun, PairedEvalCallback, PairedEvaluator, write_report
    from ..eval.report import summarize_run
    from ..models import resolve_model_name_or_path
    from .plots import write_figures

    start = time.perf_counter()
    task = get_task(args.task, seed=args.task_seed)
    methods = [parse_method(m) for m in args.methods]
    _check_methods(methods, config)
    if not args.seeds:
        raise ValueError("Give at least one training seed (`seeds`).")
    model_path = resolve_model_name_or_path(model_args.model_name_or_path or "embedded")
    model_init_kwargs = {"dtype": model_args.dtype or "float32", **(config.model_init_kwargs or {})}
    peft_config = get_peft_config(model_args)
    if peft_config is None:
        raise ValueError("The comparison trains LoRA students (self-distillation from the adapter-off model): set "
                         "use_peft: true.")  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    root = Path(config.output_dir)
    root.mkdir(parents=True, exist_ok=True)
    train_rows = task.train if args.num_train is None else task.train[: args.num_train]
    test_rows = task.test if args.eval_items is None else task.test[: args.eval_items]
    settings = GenerationSettings(
        max_new_tokens=args.eval_max_new_tokens or config.max_new_tokens,
        temperature=args.eval_temperature,
        top_p=args.eval_top_p,
        top_k=args.eval_top_k,
        seed=args.eval_seed,
        batch_size=args.eval_batch_size,
    )
    evaluator = PairedEvaluator(
        test_rows, context=task.context, scorer=task.scorer, id_column="id", generation=settings
    )
    (root / "task.json").write_text(
        json.dumps({"task": task.name, "family": task.family, "description": task.description, **task.info,
                    "num_train": len(train_rows), "num_test": len(test_rows)}, indent=2, default=str) + "\n"
    )  # fmt: skip

    runs: list[ModelRun] = []
    base = _load_base(model_path, model_init_kwargs)
    base_prov = evaluator.provenance(base, model_path)
    records = evaluator.run(base, tokenizer, output_path=root / "base" / "records.jsonl", provenance=base_prov)
    runs.append(ModelRun("base", records, provenance=base_prov, records_path=str(root / "base" / "records.jsonl")))
    del base

    histories: dict[str, dict[str, list[Any]]] = {}
    train_seconds: dict[str, float] = {}
    tracking: dict[str, list[dict[str, Any]]] = {}
    for method in methods:
        for seed in args.seeds:
            name = f"{method.name}/seed{seed}"
            run_dir = root / method.name / f"seed{seed}"
            records_path = run_dir / "eval" / "records.jsonl"
            done_path = run_dir / "done.json"
            if done_path.exists():
                done = json.loads(done_path.read_text())
                from peft import PeftModel

                student = PeftModel.from_pretrained(_load_base(model_path, model_init_kwargs), str(run_dir))
            else:
                run_args = run_config(config, task, method, seed, run_dir, args.monitor_opd)
                tracker = None
                if args.track_every > 0:
                    tracker = PairedEvalCallback(
                        test_rows, context=task.context, scorer=task.scorer, id_column="id",
                        eval_steps=args.track_every, num_items=args.track_items, generation=settings,
                        eval_on_start=True, final_report=False, n_bootstrap=0,
                    )  # fmt: skip
                t0 = time.perf_counter()
                trainer = train_run(
                    task, run_args, model_path, model_init_kwargs, tokenizer, peft_config, train_rows, tracker
                )
                trainer.save_model(str(run_dir))
                done = {
                    "method": method.name,
                    "overrides": method.overrides,
                    "seed": seed,
                    "train_seconds": round(time.perf_counter() - t0, 1),
                    "log_history": trainer.state.log_history,
                    "tracking": [] if tracker is None else tracker.summary_rows(),
                }
                student = trainer.accelerator.unwrap_model(trainer.model)
                done_path.write_text(json.dumps(done, indent=2, default=str) + "\n")
            train_seconds[name] = done["train_seconds"]
            histories[name] = compact_history(done["log_history"])
            tracking[name] = [
                {k: row[k] for k in ("step", "acc_x", "acc_xc", "harm_count", "help_count") if k in row}
                for row in done.get("tracking", [])
            ]
            prov = evaluator.provenance(student, model_path, adapter=str(run_dir))
            records = evaluator.run(student, tokenizer, output_path=records_path, provenance=prov)
            runs.append(ModelRun(name, records, provenance=prov, records_path=str(records_path)))
            del student

    report = write_report(runs, root / "paired_eval", title=f"{task.name}: base vs students, paired")
    per_seed: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        method = run.name.split("/")[0]
        metrics = summarize_run(run, n_bootstrap=0)["metrics"]
        row = {k: metrics.get(k) for k in SUMMARY_KEYS}
        row.update(diagnostic_rates(task, run.records))
        row.update(regime=metrics.get("regime"), seed=int(run.name.split("seed")[-1]) if "/" in run.name else None)
        per_seed.setdefault(method, []).append(row)
    keys = [*SUMMARY_KEYS, *(k for k in per_seed["base"][0] if k not in SUMMARY_KEYS and k not in ("regime", "seed"))]
    aggregated = aggregate(per_seed, keys)
    table = render_table(aggregated, per_seed, keys)
    sentence = conclusion(task.name, aggregated)
    summary = {
        "task": task.name,
        "family": task.family,
        "methods": {m.name: m.overrides for m in methods},
        "seeds": list(args.seeds),
        "num_train": len(train_rows),
        "num_test": len(test_rows),
        "evaluation": settings.to_dict(),
        "columns": keys,
        "aggregated": aggregated,
        "per_seed": per_seed,
        "conclusion": sentence,
        "versions": report["versions"],
        "wall_seconds": round(time.perf_counter() - start, 1),  # this invocation (a resumed one skips finished work)
        "train_seconds": train_seconds,  # each run's training time, measured when it ran
        "curves": histories,
        "tracking": tracking,
        "report": str(root / "paired_eval" / "report.md"),
    }
    summary["figures"] = write_figures(summary, root)
    (root / "comparison.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (root / "comparison.md").write_text(f"# {task.name}: base, OPD and NCA\n\n{table}\n\n{sentence}\n")
    summary["table"] = table
    return summary
