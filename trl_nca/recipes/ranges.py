"""The ranges `docs/results.md` documents, and the reading of a new comparison against them.

Per-seed numbers of a comparison depend on the machine (other vector kernels round differently, and training
amplifies it), so a single run is read against the spread of many: `docs/results/build.py` writes, from the
committed summaries of section 8 of `docs/results.md`, each experiment's per-method minimum and maximum of harm,
Acc_x and Acc_xc over all its runs (two organisms x ten training seeds) into `resources/documented_ranges.json`,
together with the settings that shaped those runs. `read_against_ranges` then says, for a comparison made with the
same settings (the README's main job is one), whether each of its runs lies within the documented range or outside.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from ..core.checks import format_pct
from .identity import canonical, compare_settings
from .statistics import COLUMN_NAMES


# the settings that must agree for a comparison to be read against a documented experiment (not the seeds, the
# organisms, the output folder or the tracking along training, which shape no student)
STUDENT_KEYS = (
    "task",
    "task_seed",
    "train_rows",
    "train_rows_sha256",
    "model",
    "model_init_kwargs",
    "peft",
    "monitor_opd",
)


# the statistics a documented range covers (older summaries have no BothCorrect distribution)
RANGE_KEYS = ("harm", "acc_x", "acc_xc")


def matching_settings(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a `comparison.json` summary that decides whether a documented range applies to it: everything
    that changes what its numbers mean. The methods; what shaped the students (task, training rows, model, LoRA) and
    their training (budget `max_steps`, learning rate, `max_new_tokens`, sampling temperature, ...); the evaluation's
    sampling (reply budget, temperature, top-p, top-k, seed, samples per view) and the number of evaluated items."""
    settings = canonical(summary["settings"])
    return {
        "methods": summary["methods"],
        "student": {k: settings["student"].get(k) for k in STUDENT_KEYS},
        "training": settings["training"],
        "evaluation": {**settings["evaluation"], "items": summary.get("num_test")},
    }


def setting_differences(documented: Mapping[str, Any], settings: Mapping[str, Any]) -> list[str]:
    """`setting` (documented value, this run's) for every setting that shapes the numbers and differs
    (`identity.compare_settings`)."""
    return [
        f"`{key}` {old!r} documented, {new!r} here"
        for key, old, new in compare_settings(documented, settings).differences
    ]


def matches(documented: Mapping[str, Any], settings: Mapping[str, Any]) -> bool:
    """Whether a documented experiment's `match` settings are this run's (versions apart: they are provenance)."""
    return not compare_settings(documented, settings).differences


def run_label(row: Mapping[str, Any]) -> str:
    """A per-seed row's run: `org{o} seed {s}` over several organisms, `seed {s}` on one model."""
    seed = f"seed {row.get('seed')}"
    return seed if row.get("organism") is None else f"org{row['organism']} {seed}"


def ranges_of(name: str, summary: Mapping[str, Any], section: str) -> dict[str, Any]:
    """The documented range of one experiment: per method, the min and max over its runs of each statistic of its
    summary (`RANGE_KEYS`: harm, Acc_x, Acc_xc), read from the summary's own distributions."""
    methods = {}
    for method, stats in summary["statistics"]["distributions"].items():
        if method != "base":
            methods[method] = {"runs": stats["runs"]} | {
                key: None if stats[key] is None else [stats[key]["min"], stats[key]["max"]] for key in RANGE_KEYS
            }
    return {
        "name": name,
        "section": section,
        "match": matching_settings(summary),
        "versions": summary.get("versions") or {},
        "methods": methods,
    }


def documented_ranges() -> list[dict[str, Any]]:
    """The ranges shipped with trl-nca (`trl_nca/resources/documented_ranges.json`)."""
    text = resources.files("trl_nca.resources").joinpath("documented_ranges.json").read_text()
    return json.loads(text)["experiments"]


def read_against_ranges(summary: Mapping[str, Any], experiments: list[dict[str, Any]] | None = None) -> str:
    """One sentence: whether every run of `summary` lies within the range documented for its settings."""
    experiments = documented_ranges() if experiments is None else experiments
    settings = matching_settings(summary)
    match = next((e for e in experiments if matches(e["match"], settings)), None)
    if match is None:
        names = ", ".join(e["name"] for e in experiments) or "none"
        same_task = [e for e in experiments if e["match"]["student"].get("task") == settings["student"].get("task")]
        nearest = ""
        if same_task:  # name what differs from the documented experiment of this task
            closest = min(same_task, key=lambda e: len(setting_differences(e["match"], settings)))
            diffs = setting_differences(closest["match"], settings)
            more = f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else ""
            nearest = f" {closest['name']} differs in " + "; ".join(diffs[:3]) + more + "."
        return (
            "No range is documented for these settings (docs/results.md section 8 documents the experiments "
            f"{names}; the README's main job is one of them), so this run is not read against one.{nearest}"
        )
    outside, checked = [], 0
    for method, rows in summary["per_seed"].items():
        documented = match["methods"].get(method)
        if method == "base" or documented is None:
            continue
        for row in rows:
            for key in RANGE_KEYS:
                bounds, value = documented[key], row.get(key)
                if bounds is None or value is None:
                    continue
                checked += 1
                low, high = bounds
                if not low - 1e-9 <= value <= high + 1e-9:
                    outside.append(
                        f"{method} {run_label(row)}: {COLUMN_NAMES[key]} {format_pct(value, sign=True)} against {format_pct(low, sign=True)}-{format_pct(high, sign=True)}"
                    )
    runs = ", ".join(f"{m} {e['runs']}" for m, e in match["methods"].items())
    where = f"the range documented in docs/results.md {match['section']} ({match['name']}: {runs} runs)"
    note = compare_settings(
        {"versions": match.get("versions") or {}, "match": match["match"]},
        {"versions": summary.get("versions") or {}, "match": settings},
    ).version_note()
    if note:  # versions are provenance: said beside the reading, never a reason not to read against the range
        where += f", {note}"
    if not checked:
        return f"Nothing in this run can be read against {where}."
    if not outside:
        return f"Every run is within {where}."
    return f"Outside {where}: " + "; ".join(outside) + "."
