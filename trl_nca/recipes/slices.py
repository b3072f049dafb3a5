"""A comparison run as committed slices: one unit at a time, each leaving a small file, the tables built from the files.

A comparison too long for one sitting (the embedded model's fr-30 job on a CPU) runs unit by unit. A *unit* is one
base model evaluated (`base`, or `base-org3` with organisms) or one student trained and evaluated (`opd-seed0`,
`nca-org3-seed1`). `trl-nca compare --slice UNIT --slices_dir DIR` runs that unit through the same steps as a whole
comparison (in the comparison's `output_dir`, so a cut slice resumes) and writes `DIR/UNIT.json`:

- per item and view, each sample's outcome: correct, format failure, truncated, response tokens (no text, no
  weights), and the task's diagnostic rates;
- the header every slice of one table shares: the comparison's settings (without the local model paths), the hash of
  the evaluated and training rows, the sha256 of each base model's weight files and the library versions;
- for a student, its training time and compact training curves; for any unit the machine it ran on (the vector unit
  and the thread count), recorded and shown, not checked: a seeded run repeats on one machine only, and the slices
  of one table may come from several.

`trl-nca compare --from_slices --slices_dir DIR` builds the table, the statistics and the reading from the slice files
alone: every unit of the plan must have its file, no file may be left over, and a slice whose header differs from the
plan's is refused, naming the file and each difference. The numbers equal those of the whole comparison run in one go,
because the metrics read only the outcomes a slice keeps (`eval.metrics.paired_arrays`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..inputs import sha256_text, write_text_atomic
from .compare_args import CompareInputError
from .compare_eval import Evaluated, _apply_exclusion, diagnostic_rates
from .compare_plan import Plan, Run, _differences


SLICE_FORMAT = 1
HEADER_KEYS = ("format", "settings", "data_sha256", "weights_sha256", "versions")
"""What every slice of one table must share; a slice that differs in any of them is refused."""


class SliceError(CompareInputError):
    """A slice that cannot join the table: missing, left over, or made with other settings, data, weights or
    versions."""


def base_unit(organism: int | None) -> str:
    return "base" if organism is None else f"base-org{organism}"


def run_unit(run: Run) -> str:
    return run.name.replace("/", "-")


def unit_names(plan: Plan) -> list[str]:
    """The plan's units in the order they run: the bases, then every student."""
    return [base_unit(organism) for organism in plan.model_paths] + [run_unit(run) for run in plan.runs]


def slice_file(slices_dir: str | Path, unit: str) -> Path:
    return Path(slices_dir) / f"{unit}.json"


def _weights_sha256(model_path: str) -> str:
    """sha256 over the weight files of a model folder (names and bytes, in name order)."""
    folder = Path(model_path)
    files = sorted(
        p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin") or p.name.endswith(".index.json")
    )
    if not files:
        raise SliceError(f"{folder} holds no weight files (*.safetensors, *.bin) to fingerprint for the slices.")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


def slice_header(plan: Plan) -> dict[str, Any]:
    """What every slice of the plan's table shares (`HEADER_KEYS`)."""
    from ..eval.provenance import library_versions

    rows = {"train": plan.train_rows, "test": plan.test_rows}
    return {
        "format": SLICE_FORMAT,
        "settings": json.loads(json.dumps({k: v for k, v in plan.settings.items() if k != "model_paths"}, default=str)),
        "data_sha256": sha256_text(json.dumps(rows, sort_keys=True, default=str)),
        "weights_sha256": {str(o): _weights_sha256(path) for o, path in plan.model_paths.items()},
        "versions": library_versions(),
    }


def _machine() -> dict[str, Any]:
    import torch

    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch_threads": torch.get_num_threads()}


def _outcomes(records) -> list[dict[str, Any]]:
    """Per item, each view's samples as [correct, format_failure, truncated, num_tokens]."""
    from ..eval.metrics import view_samples

    def view(outcome) -> list[list[int]]:
        return [
            [int(s.correct), int(s.format_failure), int(s.truncated), int(s.num_tokens)] for s in view_samples(outcome)
        ]

    return [{"id": r.item_id, "x": view(r.x), "xc": view(r.xc)} for r in records]


def _records(items: list[dict[str, Any]]):
    """The records a slice's outcomes stand for (no text): what the paired metrics read."""
    from ..eval.records import PairedRecord, ViewOutcome

    def view(samples: list[list[int]]) -> ViewOutcome:
        outcomes = [
            {"completion": "", "answer": None, "correct": bool(c), "num_tokens": n, "truncated": bool(t),
             "format_failure": bool(f), "extra": {}}
            for c, f, t, n in samples
        ]  # fmt: skip
        first = outcomes[0]
        if len(outcomes) > 1:
            first["extra"] = {"samples": outcomes[1:]}
        return ViewOutcome(**first)

    return [PairedRecord(item_id=item["id"], x=view(item["x"]), xc=view(item["xc"])) for item in items]


def _check_unit(plan: Plan, unit: str) -> None:
    names = unit_names(plan)
    if unit not in names:
        raise CompareInputError(f"`slice: {unit}` is not a unit of this comparison; its units are {names}.")


def run_slice(plan: Plan, unit: str, slices_dir: str | Path) -> Path:
    """Run one unit of the plan (in its output folder, resuming what is there) and write its slice file; returns the
    file's path."""
    from transformers import AutoTokenizer

    from .compare_eval import _evaluate_bases
    from .compare_report import _write_plan
    from .compare_students import _evaluate_student

    _check_unit(plan, unit)
    header = slice_header(plan)
    start = time.perf_counter()
    _write_plan(plan)
    evaluated = Evaluated()
    bases = {base_unit(o): o for o in plan.model_paths}
    if unit in bases:
        organism = bases[unit]
        one = _only_organism(plan, organism)
        _evaluate_bases(one, evaluated)
        method, seed = "base", None
    else:
        run = next(r for r in plan.runs if run_unit(r) == unit)
        _check_not_excluded(plan, run, slices_dir)
        tokenizer = AutoTokenizer.from_pretrained(plan.model_paths[run.organism])
        _evaluate_student(plan, run, tokenizer, evaluated)
        organism, method, seed = run.organism, run.method.name, run.seed
    (model_run,) = evaluated.runs
    data = {
        **header,
        "unit": unit,
        "method": method,
        "organism": organism,
        "seed": seed,
        "scorer": model_run.provenance.get("scorer"),
        "items": _outcomes(model_run.records),
        "diagnostics": diagnostic_rates(plan.task, model_run.records),
        "train_seconds": evaluated.train_seconds.get(model_run.name),
        "curves": evaluated.histories.get(model_run.name),
        "tracking": evaluated.tracking.get(model_run.name),
        "machine": _machine(),
        "wall_seconds": round(time.perf_counter() - start, 1),  # this invocation (a resumed one skips finished work)
    }
    path = slice_file(slices_dir, unit)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")
    return path


def _only_organism(plan: Plan, organism: int | None) -> Plan:
    import dataclasses

    return dataclasses.replace(plan, model_paths={organism: plan.model_paths[organism]})


def _check_not_excluded(plan: Plan, run: Run, slices_dir: str | Path) -> None:
    """With an exclusion rule, a student's slice needs its base's slice, and its organism must pass the rule."""
    args = plan.args
    if args.organism_min_base_acc_xc is None and args.organism_limit is None:
        return
    slices = {}
    for organism in plan.model_paths:
        path = slice_file(slices_dir, base_unit(organism))
        if not path.exists():
            raise SliceError(
                f"The exclusion rule needs every base evaluated before a student: {path} is missing. Run "
                f"`--slice {base_unit(organism)}` first."
            )
        slices[base_unit(organism)] = _read(path)
    evaluated = _evaluated_from(plan, slices)
    kept = {r.organism for r in _apply_exclusion(plan, evaluated).runs}
    if run.organism not in kept:
        verdict = evaluated.exclusion[str(run.organism)]["verdict"]
        raise SliceError(f"The student {run.name} is not run: organism {run.organism} is {verdict}.")


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise SliceError(f"{path} is not a readable slice ({error}); run its slice again.") from None


def read_slices(plan: Plan, slices_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Every unit's slice, checked: none missing, none left over, each header equal to the plan's."""
    folder = Path(slices_dir)
    names = unit_names(plan)
    present = {p.stem for p in folder.glob("*.json")} if folder.is_dir() else set()
    missing = [n for n in names if n not in present]
    if missing:
        raise SliceError(
            f"{folder} lacks the slices {missing} of this comparison; run `trl-nca compare --slice UNIT` for each."
        )
    stray = sorted(present - set(names))
    if stray:
        raise SliceError(
            f"{folder} holds slices {stray} that are not units of this comparison; move them out, or fix the config "
            "to the one they were made with."
        )
    header = slice_header(plan)
    slices = {}
    for name in names:
        path = slice_file(folder, name)
        data = _read(path)
        differences = _differences({k: data.get(k) for k in HEADER_KEYS}, {k: header[k] for k in HEADER_KEYS})
        if differences:
            listed = "; ".join(f"`{key}` was {old!r}, now {new!r}" for key, old, new in differences[:5])
            more = f" (and {len(differences) - 5} more)" if len(differences) > 5 else ""
            raise SliceError(
                f"The slice {path} was made with other settings, data, weights or versions than this table: {listed}"
                f"{more}. Run that slice again with these, or build the table where it was made."
            )
        if len(data["items"]) != len(plan.test_rows):
            raise SliceError(f"The slice {path} holds {len(data['items'])} items, the table {len(plan.test_rows)}.")
        slices[name] = data
    return slices


def _evaluated_from(plan: Plan, slices: Mapping[str, Mapping[str, Any]]) -> Evaluated:
    from ..eval import ModelRun

    evaluated = Evaluated()
    names = {base_unit(o): plan.base_name(o) for o in plan.model_paths} | {run_unit(r): r.name for r in plan.runs}
    for unit, data in slices.items():
        name = names[unit]
        records = _records(data["items"])
        evaluated.runs.append(ModelRun(name, records, provenance={"scorer": data.get("scorer")}))
        evaluated.identity[name] = (data["method"], data["organism"], data["seed"])
        if data["method"] != "base":
            evaluated.train_seconds[name] = data["train_seconds"]
            evaluated.histories[name] = data["curves"]
            evaluated.tracking[name] = data["tracking"]
    return evaluated


def build_from_slices(plan: Plan, slices_dir: str | Path) -> dict[str, Any]:
    """The table, the statistics over runs, the readings and the figures of the plan, from its slice files alone
    (`read_slices`); writes `comparison.json` and `comparison.md` to the plan's output folder as a whole run does
    (`compare_report.summarize`, `write_summary`) and returns the summary."""
    from .compare_report import summarize, write_summary

    slices = read_slices(plan, slices_dir)
    evaluated = _evaluated_from(plan, slices)
    plan = _apply_exclusion(plan, evaluated)
    names = {base_unit(o): plan.base_name(o) for o in plan.model_paths} | {run_unit(r): r.name for r in plan.runs}
    evaluated.runs = [r for r in evaluated.runs if r.name in names.values()]
    diagnostics = {name: slices[unit]["diagnostics"] for unit, name in names.items()}
    first = next(iter(slices.values()))
    summary = summarize(plan, evaluated, versions=first["versions"], wall_seconds=None, report_path=None,
                        diagnostics=diagnostics)  # fmt: skip
    summary["settings"] = first["settings"]  # without the local model paths
    summary["slices"] = {"folder": str(slices_dir), "machines": {unit: data["machine"] for unit, data in slices.items()},
                         "wall_seconds": {unit: data["wall_seconds"] for unit, data in slices.items()}}  # fmt: skip
    return write_summary(plan, summary, heading=f" (from the slices in {slices_dir})")


def slice_metrics(data: Mapping[str, Any], n_bootstrap: int = 1000) -> dict[str, Any]:
    """The paired metrics of one slice's outcomes, with bootstrap intervals over items (`eval.metrics.compute_metrics`)."""
    from ..eval.metrics import compute_metrics

    return compute_metrics(_records(data["items"]), n_bootstrap=n_bootstrap)


def describe_slice(data: Mapping[str, Any]) -> str:
    """One line of a slice's result: Acc_x, Acc_xc and Delta with its 95% interval over items, harm and the regime."""
    m = slice_metrics(data)
    low, high = m["ci"]["delta"] or (float("nan"), float("nan"))
    harm = "n/a" if m["harm"] is None else f"{100 * m['harm']:.1f}%"
    return (
        f"{data['unit']}: Acc_x {100 * m['acc_x']:.1f}%, Acc_xc {100 * m['acc_xc']:.1f}%, Delta {100 * m['delta']:+.1f} "
        f"points (95% bootstrap interval over {m['n']} items [{100 * low:+.1f}, {100 * high:+.1f}]), harm {harm}, "
        f"regime {m['regime']}"
    )


def missing_units(plan: Plan, slices_dir: str | Path) -> list[str]:
    """The plan's units without a slice file in `slices_dir`."""
    return [unit for unit in unit_names(plan) if not slice_file(slices_dir, unit).exists()]
