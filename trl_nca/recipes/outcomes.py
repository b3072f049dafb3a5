"""The per-organism outcomes `docs/results.md` section 9 documents, and the reading of a new comparison against them.

The shipped organisms are the same weights on every machine, so a comparison on them can be read organism by organism
against the documented study of the same settings: did the baseline (plain OPD) degrade on this organism, did the
method (NCA) prevent it, and what did the documented runs find on the same organism. `docs/results/build.py` writes
the documented outcomes (per experiment of section 9: its settings, each organism's outcome, the counts) into
`resources/documented_organisms.json` from the committed summaries. The definitions are those of
`trl_nca.recipes.statistics.organism_outcomes`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from ..core.checks import format_pct
from .ranges import matching_settings


def _match(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The settings that must agree: those of `ranges.matching_settings` (what shaped the students, the training and
    the evaluation, samples per view included), without the organisms and seeds; the methods are matched one by one
    (a documented study may have run more methods than the comparison read against it)."""
    return {k: v for k, v in matching_settings(summary).items() if k != "methods"}


def outcomes_of(name: str, summary: Mapping[str, Any], section: str) -> dict[str, Any]:
    """The documented per-organism outcomes of one experiment (its `statistics.organisms`)."""
    methods = {}
    baseline = summary["statistics"]["baseline"]
    for method, outcome in summary["statistics"]["organisms"].items():
        methods[method] = {
            "n": outcome["n"],
            "degraded": outcome["degraded"],
            "prevented": outcome["prevented"],
            "overrides": summary["methods"][method],
            "organisms": {
                str(e["organism"]): {"degraded": e["degraded"], "prevented": e["prevented"],
                                     "baseline_harm": e["baseline"].get("harm"), "method_harm": e["method"].get("harm")}
                for e in outcome["organisms"]
            },
        }  # fmt: skip
    return {"name": name, "section": section, "baseline": baseline, "baseline_overrides": summary["methods"][baseline],
            "match": _match(summary), "methods": methods}  # fmt: skip


def documented_outcomes() -> list[dict[str, Any]]:
    """The outcomes shipped with trl-nca (`trl_nca/resources/documented_organisms.json`); empty when none ship."""
    path = resources.files("trl_nca.resources").joinpath("documented_organisms.json")
    return json.loads(path.read_text())["experiments"] if path.is_file() else []


def _verdict(baseline: str, method: str, degraded: bool, prevented: bool | None) -> str:
    if not degraded:
        return f"{baseline} did not degrade"
    return f"{baseline} degraded, {method} {'prevented it' if prevented else 'did not prevent it'}"


def read_per_organism(summary: Mapping[str, Any], experiments: list[dict[str, Any]] | None = None) -> str:
    """Lines reading each organism of `summary` (per method against the baseline) and the documented outcome on the
    same organism; empty when the comparison has no organisms."""
    organisms = summary["statistics"].get("organisms") or {}
    if not any(e["organism"] is not None for o in organisms.values() for e in o["organisms"]):
        return ""
    experiments = documented_outcomes() if experiments is None else experiments
    settings = _match(summary)
    baseline = summary["statistics"]["baseline"]
    documented = next(
        (e for e in experiments if e["match"] == settings and e["baseline"] == baseline
         and e["baseline_overrides"] == summary["methods"][baseline]),
        None,
    )  # fmt: skip
    lines = []
    for method, outcome in organisms.items():
        known = None if documented is None else documented["methods"].get(method)
        if known is not None and known["overrides"] != summary["methods"][method]:
            known = None  # a method of the same name with other settings: not the documented one
        for e in outcome["organisms"]:
            seeds = len(e["seeds"])
            text = (
                f"organism {e['organism']}: {_verdict(baseline, method, e['degraded'], e['prevented'])} (regime A in "
                f"{e['baseline']['regime_a']} of {seeds} {baseline} seeds; harm {format_pct(e['baseline'].get('harm'), sign=True)} vs "
                f"{format_pct(e['method'].get('harm'), sign=True)})"
            )
            if known is not None:
                same = known["organisms"].get(str(e["organism"]))
                text += "; documented: " + (
                    "not run" if same is None else _verdict(baseline, method, same["degraded"], same["prevented"])
                )
            lines.append(text + ".")
        if known is not None:
            lines.append(
                f"Documented in docs/results.md {documented['section']} ({documented['name']}, the same settings): "
                f"{baseline} degraded on {known['degraded']} of {known['n']} organisms, {method} prevented it on "
                f"{known['prevented']} of those {known['degraded']}."
            )
    if documented is None:
        names = ", ".join(e["name"] for e in experiments) or "none yet"
        lines.append(
            "No per-organism outcome is documented for these settings (docs/results.md section 9 documents "
            f"{names}), so the organisms are not read against one."
        )
    return "\n".join(lines)
