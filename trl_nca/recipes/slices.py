"""A comparison run as committed slices: one unit at a time, each leaving a small file, the tables built from the files.

A comparison too long for one sitting (the embedded model's fr-30 job on a CPU) runs unit by unit. A *unit* is one
base model evaluated (`base`, or `base-org3` with organisms) or one student trained and evaluated (`opd-seed0`,
`nca-org3-seed1`). `trl-nca compare --slice UNIT --slices_dir DIR` runs that unit through the same steps as a whole
comparison (in the comparison's `output_dir`, so a cut slice resumes) and writes `DIR/UNIT.json`:

- per item and view, each sample's outcome: correct, format failure, truncated, response tokens (no text, no
  weights), and the task's diagnostic rates;
- the header every slice of one table shares: the comparison's settings (without the local model paths), the hash of
  the evaluated and training rows, the sha256 of each base model's weight files and the library versions;
- what it is: its unit, method, organism and seed, and for a student the exact settings of its own run
  (`run_settings`: the shared config with its method's overrides and its seed, as `done.json` records them);
- for a student, its training time and compact training curves; for any unit the machine it ran on (the vector unit
  and the thread count), recorded and shown, not checked: a seeded run repeats on one machine only, and the slices
  of one table may come from several;
- `results_sha256`, the sha256 over what it measured (`RESULT_KEYS`), so an edited outcome is refused (what this
  checksum guards, and what it does not: docs/design.md, "Identity and provenance").

`trl-nca compare --from_slices --slices_dir DIR` builds the table, the statistics and the reading from the slice files
alone: every unit of the plan must have its file, no file may be left over, and a slice whose header, run settings or
identity (its unit against its file's name, its method, organism and seed against the plan's unit of that name)
differs from the plan's is refused, naming the file and each difference (settings compared as
`trl_nca.recipes.identity` says: a library's new default field is no difference, and a slice made with other library
versions is read with a warning naming them). Every field is read through one typed
loader (`Slice.load`): a wrong type or range, a missing or unknown field, duplicate or foreign item ids are one line
naming the file and the field. The numbers equal those of the whole comparison run in one go, because the metrics
read only the outcomes a slice keeps (`eval.metrics.paired_arrays`).

Format 2 added `run_settings` and `results_sha256`; `scripts/upgrade_slices.py` upgraded the committed format-1
slices in place from the configs they were made with, and says so in each slice it upgraded (`upgraded`: the script
and the config its `run_settings` were derived from; a slice written by its own run has no such field).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from ..eval import ModelRun
from ..eval.metrics import compute_metrics, view_samples
from ..eval.provenance import library_versions
from ..eval.records import PairedRecord, ViewOutcome
from ..inputs import sha256_text, write_text_atomic
from .compare_args import CompareInputError
from .compare_eval import Evaluated, apply_exclusion, diagnostic_rates, evaluate_bases, per_seed_rows
from .compare_plan import Plan, Run
from .compare_report import summarize, table_keys, write_plan, write_summary
from .compare_students import evaluate_student
from .identity import compare_settings
from .statistics import aggregate, render_table


logger = logging.getLogger(__name__)


SLICE_FORMAT = 2
HEADER_KEYS = ("format", "settings", "data_sha256", "weights_sha256", "versions")
"""What every slice of one table must share; a slice whose settings, data or weights differ is refused, one made with
other library versions is read with a warning (`identity.compare_settings`: versions are provenance)."""
RESULT_KEYS = ("scorer", "items", "diagnostics", "train_seconds", "curves", "tracking")
"""What a slice measured: `results_sha256` is the sha256 over them (`results_sha256`)."""


class SliceError(CompareInputError):
    """A slice that cannot join the table: missing, left over, or made with other settings, data or weights."""


def base_unit(organism: int | None) -> str:
    return "base" if organism is None else f"base-org{organism}"


def run_unit(run: Run) -> str:
    return run.name.replace("/", "-")


def unit_names(plan: Plan) -> list[str]:
    """The plan's units in the order they run: the bases, then every student."""
    return planned_units(plan.model_paths, plan.runs)


def planned_units(organisms: Sequence[int | None], runs: Sequence[Run]) -> list[str]:
    """The units of a comparison of these organisms (None: the one base model) and runs, in the order they run."""
    return [base_unit(organism) for organism in organisms] + [run_unit(run) for run in runs]


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
    rows = {"train": plan.train_rows, "test": plan.test_rows}
    return {
        "format": SLICE_FORMAT,
        "settings": json.loads(json.dumps({k: v for k, v in plan.settings.items() if k != "model_paths"}, default=str)),
        "data_sha256": sha256_text(json.dumps(rows, sort_keys=True, default=str)),
        "weights_sha256": {str(o): _weights_sha256(path) for o, path in plan.model_paths.items()},
        "versions": library_versions(),
    }


def _machine() -> dict[str, Any]:
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch_threads": torch.get_num_threads()}


def _outcomes(records) -> list[dict[str, Any]]:
    """Per item, each view's samples as [correct, format_failure, truncated, num_tokens]."""

    def view(outcome) -> list[list[int]]:
        return [
            [int(s.correct), int(s.format_failure), int(s.truncated), int(s.num_tokens)] for s in view_samples(outcome)
        ]

    return [{"id": r.item_id, "x": view(r.x), "xc": view(r.xc)} for r in records]


def _records(items: list[dict[str, Any]]):
    """The records a slice's outcomes stand for (no text): what the paired metrics read."""

    def view(samples: list[list[int]]) -> ViewOutcome:
        outcomes = [
            {
                "completion": "",
                "answer": None,
                "correct": bool(c),
                "num_tokens": n,
                "truncated": bool(t),
                "format_failure": bool(f),
                "extra": {},
            }
            for c, f, t, n in samples
        ]
        first = outcomes[0]
        if len(outcomes) > 1:
            first["extra"] = {"samples": outcomes[1:]}
        return ViewOutcome(**first)

    return [PairedRecord(item_id=item["id"], x=view(item["x"]), xc=view(item["xc"])) for item in items]


def check_unit(unit: str, names: Sequence[str]) -> None:
    """`slice: UNIT` must name a unit of the comparison (checked before any model loads or organism pretrains)."""
    if unit not in names:
        raise CompareInputError(f"`slice: {unit}` is not a unit of this comparison; its units are {list(names)}.")


def _check_unit(plan: Plan, unit: str) -> None:
    check_unit(unit, unit_names(plan))


def check_slices_dir(slices_dir: str | Path, writing: bool) -> None:
    """The slices folder, before any work: to write a slice (`writing`), a folder that exists or can be made and that
    can be written to (a file is made there and removed); to build the tables, an existing folder."""
    folder = Path(slices_dir)
    if folder.exists() and not folder.is_dir():
        raise SliceError(f"slices_dir {str(folder)!r} is a file, not a folder; give the folder of the slice files.")
    if not writing:
        if not folder.is_dir():
            raise SliceError(
                f"slices_dir {str(folder)!r} does not exist; give the folder the slices were written to "
                "(`trl-nca compare --slice UNIT --slices_dir DIR`)."
            )
        return
    created = [parent for parent in (folder, *folder.parents) if not parent.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        probe.touch()
        probe.unlink()
        for parent in created:  # nothing is left behind by the check: `run_slice` makes the folder again
            parent.rmdir()
    except OSError as error:
        raise SliceError(
            f"slices_dir {str(folder)!r} cannot be written ({error.strerror or error}); the slice would be lost after "
            "its unit ran. Give a folder you can write to (or make this one writable)."
        ) from None


def run_slice(plan: Plan, unit: str, slices_dir: str | Path) -> Path:
    """Run one unit of the plan (in its output folder, resuming what is there) and write its slice file; returns the
    file's path."""
    _check_unit(plan, unit)
    header = slice_header(plan)
    start = time.perf_counter()
    write_plan(plan)
    evaluated = Evaluated()
    bases = {base_unit(o): o for o in plan.model_paths}
    if unit in bases:
        organism = bases[unit]
        one = _only_organism(plan, organism)
        evaluate_bases(one, evaluated)
        method, seed = "base", None
    else:
        run = next(r for r in plan.runs if run_unit(r) == unit)
        _check_not_excluded(plan, run, slices_dir)
        tokenizer = AutoTokenizer.from_pretrained(plan.model_paths[run.organism])
        evaluate_student(plan, run, tokenizer, evaluated)
        organism, method, seed = run.organism, run.method.name, run.seed
    (model_run,) = evaluated.runs
    data = {
        **header,
        "unit": unit,
        "method": method,
        "organism": organism,
        "seed": seed,
        "run_settings": _run_settings(plan, unit),
        "scorer": model_run.provenance.get("scorer"),
        "items": _outcomes(model_run.records),
        "diagnostics": diagnostic_rates(plan.task, model_run.records),
        "train_seconds": evaluated.train_seconds.get(model_run.name),
        "curves": evaluated.histories.get(model_run.name),
        "tracking": evaluated.tracking.get(model_run.name),
        "machine": _machine(),
        "wall_seconds": round(time.perf_counter() - start, 1),  # this invocation (a resumed one skips finished work)
    }
    data["results_sha256"] = results_sha256(data)
    path = slice_file(slices_dir, unit)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")
    return path


def _only_organism(plan: Plan, organism: int | None) -> Plan:
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
        piece = Slice.load(path)
        check_slice(plan, piece, base_unit(organism))
        slices[base_unit(organism)] = piece
    evaluated = _evaluated_from(plan, slices)
    kept = {r.organism for r in apply_exclusion(plan, evaluated).runs}
    if run.organism not in kept:
        verdict = evaluated.exclusion[str(run.organism)]["verdict"]
        raise SliceError(f"The student {run.name} is not run: organism {run.organism} is {verdict}.")


def results_sha256(data: Mapping[str, Any]) -> str:
    """The sha256 over what a slice measured (`RESULT_KEYS`), as canonical JSON."""
    return sha256_text(json.dumps({k: data.get(k) for k in RESULT_KEYS}, sort_keys=True, separators=(",", ":")))


def _run_settings(plan: Plan, unit: str) -> dict[str, Any] | None:
    """The exact settings of a unit's own run (a student's `Run.settings`, its method's overrides and seed
    included), as JSON values; None for a base (the header's settings are its own)."""
    run = next((r for r in plan.runs if run_unit(r) == unit), None)
    return None if run is None else json.loads(json.dumps(run.settings, default=str))


class SliceFieldError(SliceError):
    """A slice file whose field has the wrong type, range or shape: the message names the file and the field."""


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _json_kind(value: Any) -> str:
    kinds = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list"}
    return kinds.get(type(value), "an object")


def _is_int(value: Any) -> bool:
    return type(value) is int  # JSON true/false are no counts


def _is_number(value: Any) -> bool:
    return (type(value) is int or type(value) is float) and math.isfinite(value)


@dataclass(frozen=True)
class Slice:
    """One slice file, read whole through `Slice.load`: every field of the format with its type and range checked.
    `path` is where it was read from."""

    path: Path
    format: int
    settings: dict[str, Any]
    data_sha256: str
    weights_sha256: dict[str, str]
    versions: dict[str, Any]
    unit: str
    method: str
    organism: int | None
    seed: int | None
    run_settings: dict[str, Any] | None
    scorer: str | None
    items: list[dict[str, Any]]
    diagnostics: dict[str, float]
    train_seconds: float | None
    curves: dict[str, list] | None
    tracking: list[dict[str, Any]] | None
    machine: dict[str, Any]
    wall_seconds: float
    results_sha256: str
    upgraded: str | None = None  # by scripts/upgrade_slices.py: `run_settings` derived then, not recorded by the run

    @classmethod
    def load(cls, path: str | Path) -> Slice:
        """Read and check a slice file; a problem is a `SliceError` naming the file, the field and the fix."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise SliceError(f"{path} is not a readable slice ({error}); run its slice again.") from None
        return cls.from_dict(data, path)

    @classmethod
    def from_dict(cls, data: Any, path: Path) -> Slice:
        def bad(field: str, what: str) -> SliceFieldError:
            return SliceFieldError(f"The slice {path}: `{field}` {what}; run its slice again.")

        if not isinstance(data, dict):
            raise SliceFieldError(
                f"The slice {path} holds {_json_kind(data)}, not a slice's object of fields; run its slice again."
            )
        names = [f.name for f in dataclasses.fields(cls) if f.name != "path"]
        optional = {f.name for f in dataclasses.fields(cls) if f.default is None}
        missing = [name for name in names if name not in data and name not in optional]
        if data.get("format") != SLICE_FORMAT and "format" not in missing and _is_int(data.get("format")):
            raise SliceFieldError(
                f"The slice {path} is of format {data['format']}, this trl-nca reads format {SLICE_FORMAT}; upgrade "
                "committed slices with `python scripts/upgrade_slices.py DIR --config CONFIG`, or run its slice again."
            )
        if missing:
            raise bad(missing[0], "is missing")
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise bad(unknown[0], "is not a field of a slice")
        if not _is_int(data["format"]):
            raise bad("format", f"must be the whole number {SLICE_FORMAT}, not {data['format']!r}")
        for field in ("settings", "versions", "machine", "weights_sha256", "diagnostics"):
            if not isinstance(data[field], dict):
                raise bad(field, f"must be an object, not {type(data[field]).__name__}")
        for field in ("data_sha256", "results_sha256"):
            if not isinstance(data[field], str) or not _HEX64.fullmatch(data[field]):
                raise bad(field, f"must be a sha256 (64 hex digits), not {data[field]!r}")
        for key, value in data["weights_sha256"].items():
            if not isinstance(value, str) or not _HEX64.fullmatch(value):
                raise bad(f"weights_sha256.{key}", f"must be a sha256 (64 hex digits), not {value!r}")
        for field in ("unit", "method"):
            if not isinstance(data[field], str) or not data[field]:
                raise bad(field, f"must be a name, not {data[field]!r}")
        for field in ("organism", "seed"):
            if data[field] is not None and (not _is_int(data[field]) or data[field] < 0):
                raise bad(field, f"must be a whole number >= 0 or null, not {data[field]!r}")
        if data["scorer"] is not None and not isinstance(data["scorer"], str):
            raise bad("scorer", f"must be a name or null, not {data['scorer']!r}")
        for key, value in data["diagnostics"].items():
            if not _is_number(value) or not 0 <= value <= 1:
                raise bad(f"diagnostics.{key}", f"must be a rate from 0 to 1, not {value!r}")
        if data.get("upgraded") is not None and not (isinstance(data["upgraded"], str) and data["upgraded"]):
            raise bad(
                "upgraded", f"must be a sentence naming the script and config, or absent, not {data['upgraded']!r}"
            )
        if not _is_number(data["wall_seconds"]) or data["wall_seconds"] < 0:
            raise bad("wall_seconds", f"must be a number of seconds >= 0, not {data['wall_seconds']!r}")
        cls._check_student_fields(data, bad)
        cls._check_items(data, bad)
        if results_sha256(data) != data["results_sha256"]:
            raise SliceFieldError(
                f"The slice {path}: its outcomes, curves or diagnostics (`{', '.join(RESULT_KEYS)}`) do not match its "
                "`results_sha256`: the file was edited after its run. Run its slice again."
            )
        return cls(path=path, **{name: data[name] for name in names if name in data})

    @staticmethod
    def _check_student_fields(data: dict[str, Any], bad) -> None:
        """A base carries no seed, training time, curves, tracking or run settings; a student carries each."""
        student = data["method"] != "base"
        for field in ("seed", "train_seconds", "curves", "tracking", "run_settings"):
            if (data[field] is None) == student:
                raise bad(field, "must be set for a student" if student else "must be null for a base")
        if not student:
            return
        if not _is_number(data["train_seconds"]) or data["train_seconds"] < 0:
            raise bad("train_seconds", f"must be a number of seconds >= 0, not {data['train_seconds']!r}")
        if not isinstance(data["run_settings"], dict):
            raise bad("run_settings", f"must be an object, not {type(data['run_settings']).__name__}")
        curves = data["curves"]
        if not isinstance(curves, dict) or not isinstance(curves.get("step"), list):
            raise bad("curves", "must be an object of equal-length lists with a `step` list")
        for key, values in curves.items():
            if not isinstance(values, list) or len(values) != len(curves["step"]):
                raise bad(f"curves.{key}", f"must be a list as long as `curves.step` ({len(curves['step'])})")
            if not all(_is_number(v) or (v is None and key != "step") for v in values):
                raise bad(f"curves.{key}", "must hold finite numbers (null where a step did not log it)")
        if not isinstance(data["tracking"], list) or not all(isinstance(row, dict) for row in data["tracking"]):
            raise bad("tracking", "must be a list of objects")
        for index, row in enumerate(data["tracking"]):
            for key, value in row.items():
                if not (_is_number(value) or value is None):
                    raise bad(f"tracking[{index}].{key}", f"must be a number, not {value!r}")

    @staticmethod
    def _check_items(data: dict[str, Any], bad) -> None:
        """Per item an id and each view's samples as [correct, format_failure, truncated, num_tokens]: three flags
        0 or 1 and a count of response tokens from 0 to the evaluation's max_new_tokens; ids unique."""
        items = data["items"]
        if not isinstance(items, list) or not items:
            raise bad("items", "must be a non-empty list")
        evaluation = data["settings"].get("evaluation") or {}
        per_view, limit = evaluation.get("samples_per_view"), evaluation.get("max_new_tokens")
        seen = set()
        for index, item in enumerate(items):
            if not isinstance(item, dict) or set(item) != {"id", "x", "xc"}:
                raise bad(f"items[{index}]", "must be an object of `id`, `x` and `xc`")
            if not isinstance(item["id"], (str, int)) or isinstance(item["id"], bool):
                raise bad(f"items[{index}].id", f"must be an item id (text or a whole number), not {item['id']!r}")
            if item["id"] in seen:
                raise bad(f"items[{index}].id", f"repeats the item {item['id']!r}")
            seen.add(item["id"])
            for view in ("x", "xc"):
                samples = item[view]
                if not isinstance(samples, list) or not samples or (per_view is not None and len(samples) != per_view):
                    raise bad(f"items[{index}].{view}", f"must be a list of the {per_view} samples of the view")
                for number, sample in enumerate(samples):
                    where = f"items[{index}].{view}[{number}]"
                    if not isinstance(sample, list) or len(sample) != 4 or not all(map(_is_int, sample)):
                        raise bad(
                            where,
                            f"must be [correct, format_failure, truncated, num_tokens] as whole numbers, "
                            f"not {sample!r}",
                        )
                    if any(flag not in (0, 1) for flag in sample[:3]):
                        raise bad(
                            where,
                            f"must hold the flags correct, format_failure and truncated as 0 or 1, not {sample[:3]}",
                        )
                    if sample[3] < 0 or (_is_int(limit) and sample[3] > limit):
                        raise bad(where, f"holds {sample[3]} response tokens, outside 0 to max_new_tokens={limit}")

    def as_dict(self) -> dict[str, Any]:
        """The file's fields (without `path`), as `run_slice` writes them."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "path"}


def _plan_identity(plan: Plan, unit: str) -> tuple[str, int | None, int | None]:
    """(method, organism, seed) of the plan's unit `unit`."""
    for organism in plan.model_paths:
        if base_unit(organism) == unit:
            return "base", organism, None
    run = next(r for r in plan.runs if run_unit(r) == unit)
    return run.method.name, run.organism, run.seed


def check_slice(plan: Plan, piece: Slice, unit: str, header: Mapping[str, Any] | None = None) -> None:
    """A slice read from the file of `unit` against the plan: its unit and identity, its header (`HEADER_KEYS`), its
    run's own settings and its item ids (those of the plan's held-out rows, each once)."""
    path = piece.path
    if piece.unit != unit:
        raise SliceError(
            f"The slice {path} holds the unit {piece.unit!r}, but its file is named for {unit!r}: a slice copied or "
            "renamed would stand for another run. Put it back under its own name, or run its slice again."
        )
    identity = (piece.method, piece.organism, piece.seed)
    expected = _plan_identity(plan, unit)
    if identity != expected:
        raise SliceError(
            f"The slice {path} holds method {identity[0]!r}, organism {identity[1]!r}, seed {identity[2]!r}, but the "
            f"unit {unit!r} of this comparison is method {expected[0]!r}, organism {expected[1]!r}, seed "
            f"{expected[2]!r}. Run its slice again."
        )
    header = slice_header(plan) if header is None else header
    ours = {k: header[k] for k in HEADER_KEYS} | {"run_settings": _run_settings(plan, unit)}
    theirs = {k: getattr(piece, k) for k in HEADER_KEYS} | {"run_settings": piece.run_settings}
    comparison = compare_settings(theirs, ours)
    if comparison.differences:
        raise SliceError(
            f"The slice {path} was made with other settings, data or weights than this table: "
            f"{comparison.describe()}. Run that slice again with these, or build the table where it was made."
        )
    if comparison.versions:
        logger.warning(
            "The slice %s was %s; versions are provenance, its settings match.", path, comparison.version_note()
        )
    if len(piece.items) != len(plan.test_rows):
        raise SliceError(f"The slice {path} holds {len(piece.items)} items, the table {len(plan.test_rows)}.")
    foreign = sorted({str(item["id"]) for item in piece.items} - {str(row["id"]) for row in plan.test_rows})
    if foreign:
        raise SliceError(
            f"The slice {path}: `items` holds ids that are no held-out item of this table ({', '.join(foreign[:3])}); "
            "run its slice again."
        )


def read_slices(plan: Plan, slices_dir: str | Path, partial: bool = False) -> dict[str, Slice]:
    """Every unit's slice, checked: none missing (unless `partial`: those present, in the plan's order), none left
    over, each read whole (`Slice.load`) and equal to the plan's unit of its name (`check_slice`)."""
    folder = Path(slices_dir)
    names = unit_names(plan)
    present = {p.stem for p in folder.glob("*.json")} if folder.is_dir() else set()
    missing = [n for n in names if n not in present]
    if missing and not partial:
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
    for name in (n for n in names if n in present):
        piece = Slice.load(slice_file(folder, name))
        check_slice(plan, piece, name, header)
        slices[name] = piece
    return slices


def _model_names(plan: Plan) -> dict[str, str]:
    """Each unit's model name in the tables (the base's, or the run's `method/seedS`)."""
    return {base_unit(o): plan.base_name(o) for o in plan.model_paths} | {run_unit(r): r.name for r in plan.runs}


def _evaluated_from(plan: Plan, slices: Mapping[str, Slice]) -> Evaluated:
    evaluated = Evaluated()
    names = _model_names(plan)
    for unit, piece in slices.items():
        name = names[unit]
        records = _records(piece.items)
        evaluated.runs.append(ModelRun(name, records, provenance={"scorer": piece.scorer}))
        evaluated.identity[name] = (piece.method, piece.organism, piece.seed)
        if piece.method != "base":
            evaluated.train_seconds[name] = piece.train_seconds
            evaluated.histories[name] = piece.curves
            evaluated.tracking[name] = piece.tracking
    return evaluated


def build_from_slices(plan: Plan, slices_dir: str | Path) -> dict[str, Any]:
    """The table, the statistics over runs, the readings and the figures of the plan, from its slice files alone
    (`read_slices`); writes `comparison.json` and `comparison.md` to the plan's output folder as a whole run does
    (`compare_report.summarize`, `write_summary`) and returns the summary."""
    slices = read_slices(plan, slices_dir)
    evaluated = _evaluated_from(plan, slices)
    plan = apply_exclusion(plan, evaluated)
    names = _model_names(plan)
    evaluated.runs = [r for r in evaluated.runs if r.name in names.values()]
    diagnostics = {name: slices[unit].diagnostics for unit, name in names.items()}
    first = next(iter(slices.values()))
    summary = summarize(
        plan, evaluated, versions=first.versions, wall_seconds=None, report_path=None, diagnostics=diagnostics
    )
    summary["settings"] = first.settings  # without the local model paths
    summary["slices"] = {
        "folder": str(slices_dir),
        "machines": {unit: p.machine for unit, p in slices.items()},
        "wall_seconds": {unit: p.wall_seconds for unit, p in slices.items()},
    }
    return write_summary(plan, summary, heading=f" (from the slices in {slices_dir})")


def progress(plan: Plan, slices_dir: str | Path) -> dict[str, Any]:
    """A comparison run as slices, reported as it comes: the units whose slices are in `slices_dir` so far (each
    checked as `read_slices` checks it), their per-run rows (`compare_eval.per_seed_rows`), the means over the runs
    present and the per-run table in the layout of the whole table (`statistics.render_table`, without the statistics
    over runs, which wait for every unit), their training curves, and the units still missing. Once none is missing,
    `build_from_slices` builds the whole table, whose per-run rows equal these."""
    slices = read_slices(plan, slices_dir, partial=True)
    if not slices:
        raise SliceError(f"{slices_dir} holds no slice of this comparison yet; run `trl-nca compare --slice UNIT`.")
    evaluated = _evaluated_from(plan, slices)
    names = _model_names(plan)
    per_seed = per_seed_rows(plan.task, evaluated, {names[unit]: p.diagnostics for unit, p in slices.items()})
    keys = table_keys(per_seed)
    return {
        "present": list(slices),
        "missing": [unit for unit in unit_names(plan) if unit not in slices],
        "per_seed": per_seed,
        "curves": evaluated.histories,
        "machines": {unit: p.machine for unit, p in slices.items()},
        "table": render_table(aggregate(per_seed, keys), per_seed, keys, n_items=len(plan.test_rows)),
    }


def slice_metrics(piece: Slice, n_bootstrap: int = 1000) -> dict[str, Any]:
    """The paired metrics of one slice's outcomes, with bootstrap intervals over items (`eval.metrics.compute_metrics`)."""
    return compute_metrics(_records(piece.items), n_bootstrap=n_bootstrap)


def describe_slice(piece: Slice) -> str:
    """One line of a slice's result: Acc_x, Acc_xc and Delta with its 95% interval over items, harm and the regime."""
    m = slice_metrics(piece)
    low, high = m["ci"]["delta"] or (float("nan"), float("nan"))
    harm = "n/a" if m["harm"] is None else f"{100 * m['harm']:.1f}%"
    return (
        f"{piece.unit}: Acc_x {100 * m['acc_x']:.1f}%, Acc_xc {100 * m['acc_xc']:.1f}%, Delta {100 * m['delta']:+.1f} "
        f"points (95% bootstrap interval over {m['n']} items [{100 * low:+.1f}, {100 * high:+.1f}]), harm {harm}, "
        f"regime {m['regime']}"
    )


def missing_units(plan: Plan, slices_dir: str | Path) -> list[str]:
    """The plan's units without a slice file in `slices_dir`."""
    return [unit for unit in unit_names(plan) if not slice_file(slices_dir, unit).exists()]
