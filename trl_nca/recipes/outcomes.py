"""The per-organism outcomes of `docs/results.md` sections 9 and 10, and a new comparison read against them.

The shipped organisms are the same weights on every machine, so a comparison on them can be read organism by organism
against the documented study of the same settings: did the baseline (plain OPD) degrade on this organism, did the
method (NCA) prevent it, and what did the documented runs find on the same organism. `docs/results/build.py` writes
the documented outcomes (per experiment of sections 9 and 10: its settings, each organism's outcome, the counts) into
`resources/documented_organisms.json` from the committed summaries. The definitions are those of
`trl_nca.recipes.statistics.organism_outcomes`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..core.checks import format_pct
from ..core.schedule import schedule_reads
from ..eval.provenance import library_versions
from .identity import SettingsComparison, canonical, compare_settings, jsonable
from .ranges import matching_settings


def _match(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The settings every method shares that must agree: those of `ranges.matching_settings` (what shaped the
    students and their evaluation, samples per view included) without the training config and the methods, which
    are matched method by method as `method_settings`."""
    return {k: v for k, v in matching_settings(summary).items() if k not in ("methods", "training")}


def method_settings(summary: Mapping[str, Any], method: str) -> dict[str, Any]:
    """The training settings one method of a comparison ran with: the shared training config with the method's
    overrides, without the schedule fields its run does not read (none with `nca_beta=0`: plain OPD has no anchor to
    schedule; under a schedule, those of the other schedules). So a method is the same method whatever its name and
    whichever defaults it was written against: the README's `nca` under the gated default is section 10's `gated`."""
    settings = {**canonical(summary["settings"]["training"]), **summary["methods"][method]}
    kind = None if settings.get("nca_beta") == 0 else settings.get("nca_beta_schedule")
    reads = schedule_reads()
    return {k: v for k, v in settings.items() if k not in reads or kind in reads[k]}


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
            "settings": jsonable(method_settings(summary, method)),
            "organisms": {
                str(e["organism"]): {
                    "degraded": e["degraded"],
                    "prevented": e["prevented"],
                    "baseline_harm": e["baseline"].get("harm"),
                    "method_harm": e["method"].get("harm"),
                }
                for e in outcome["organisms"]
            },
        }
    return {
        "name": name,
        "section": section,
        "baseline": baseline,
        "baseline_overrides": summary["methods"][baseline],
        "baseline_settings": jsonable(method_settings(summary, baseline)),
        "match": jsonable(_match(summary)),
        "versions": summary.get("versions") or {},
        "methods": methods,
    }


@dataclass
class Documented:
    """The documented experiment a comparison's method is read against: the experiment, the method's name there, and
    how the two compare (their versions: provenance)."""

    experiment: dict[str, Any]
    name: str
    comparison: SettingsComparison


def _documented(summary: Mapping[str, Any], method: str, experiments: list[dict[str, Any]]) -> Documented | None:
    """The first documented experiment with the same shared settings, the same baseline and a method with the same
    settings as `method` (under any name); None without one. Settings are compared by `identity.compare_settings`:
    a library's new default field or another version is no difference."""
    baseline = summary["statistics"]["baseline"]
    shared = _match(summary)
    baseline_settings, method_settings_ = method_settings(summary, baseline), method_settings(summary, method)
    for experiment in experiments:
        comparison = compare_settings(experiment["match"], shared)
        if comparison.differences:
            continue
        if compare_settings(experiment["baseline_settings"], baseline_settings, kind="training").differences:
            continue
        for name, known in experiment["methods"].items():
            if not compare_settings(known["settings"], method_settings_, kind="training").differences:
                comparison.versions += compare_settings(
                    {"versions": experiment.get("versions") or {}}, {"versions": summary.get("versions") or {}}
                ).versions
                comparison.versions = sorted(set(comparison.versions), key=lambda v: str(v[0]))
                return Documented(experiment, name, comparison)
    return None


def _nearest(summary: Mapping[str, Any], experiments: list[dict[str, Any]]) -> str:
    """The documented experiment of the same task whose settings differ least from `summary`'s, and how they
    differ; empty when none is of the same task."""
    shared = _match(summary)
    task = shared["student"].get("task")
    baseline = summary["statistics"]["baseline"]

    def differences(experiment: dict[str, Any]) -> list[tuple[str, Any, Any]]:
        found = compare_settings(experiment["match"], shared).differences
        found += [
            (f"{baseline}.{key}", a, b)
            for key, a, b in compare_settings(
                experiment["baseline_settings"], method_settings(summary, baseline), kind="training"
            ).differences
        ]
        by_method = [
            [
                (f"{name}.{key}", a, b)
                for key, a, b in compare_settings(
                    known["settings"], method_settings(summary, m), kind="training"
                ).differences
            ]
            for m in summary["methods"]
            if m != baseline
            for name, known in experiment["methods"].items()
        ]
        return found + (min(by_method, key=len) if by_method else [])

    same_task = [e for e in experiments if e["match"]["student"].get("task") == task]
    if not same_task:
        return ""
    closest = min(same_task, key=lambda e: len(differences(e)))
    found = differences(closest)
    listed = "; ".join(f"`{key}` {a!r} documented, {b!r} here" for key, a, b in found[:3])
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    return f" The nearest, {closest['name']}, differs in {listed}{more}."


def planned_summary(plan) -> dict[str, Any]:
    """What a comparison's summary holds before it runs (its settings, methods, baseline, number of evaluated items
    and the installed library versions): enough to find the documented experiment it will be read against."""
    return {
        "settings": {k: v for k, v in plan.settings.items() if k != "model_paths"},
        "methods": {m.name: m.overrides for m in plan.methods},
        "num_test": len(plan.test_rows),
        "statistics": {"baseline": plan.baseline},
        "versions": library_versions(),
    }


def documented_for(summary: Mapping[str, Any], experiments: list[dict[str, Any]] | None = None) -> str:
    """One line per method of `summary` (a comparison's summary, or `planned_summary` of its plan) but the baseline:
    the documented experiment it is read against (with any version that differs), or, without one, the nearest
    documented experiment and how its settings differ."""
    experiments = documented_outcomes() if experiments is None else experiments
    baseline = summary["statistics"]["baseline"]
    lines = []
    for method in summary["methods"]:
        if method == baseline:
            continue
        found = _documented(summary, method, experiments)
        if found is None:
            lines.append(f"{method}: no documented outcome for these settings.{_nearest(summary, experiments)}")
            continue
        note = found.comparison.version_note()
        lines.append(
            f"{method}: documented: {found.experiment['name']} ({found.experiment['section']}"
            + ("" if found.name == method else f", there named {found.name!r}")
            + ")"
            + (f", {note}" if note else "")
            + "."
        )
    return "\n".join(lines)


def documented_outcomes() -> list[dict[str, Any]]:
    """The outcomes shipped with trl-nca (`trl_nca/resources/documented_organisms.json`); empty when none ship."""
    path = resources.files("trl_nca.resources").joinpath("documented_organisms.json")
    return json.loads(path.read_text())["experiments"] if path.is_file() else []


def _verdict(baseline: str, method: str, degraded: bool, prevented: bool | None) -> str:
    if not degraded:
        return f"{baseline} did not degrade"
    return f"{baseline} degraded, {method} {'prevented it' if prevented else 'did not prevent it'}"


def _anchor_timing(summary: Mapping[str, Any], method: str, organism: Any, seeds: list[Any]) -> str:
    """Where the method did not prevent a degradation: until which logged step its anchor's weight (`nca_beta`) stayed
    0 in each seed, and, when that was past half of the steps (or all of them) in every seed, that the anchor came too
    late to act (a gated anchor opens late, or never); empty when the run logged no weight."""
    last = (summary.get("settings") or {}).get("training", {}).get("max_steps")
    notes, late = [], True
    for seed in seeds:
        curve = (summary.get("curves") or {}).get(f"{method}/org{organism}/seed{seed}") or {}
        if not curve.get("nca_beta"):
            return ""
        first = next((s for s, b in zip(curve["step"], curve["nca_beta"]) if b > 0), None)
        end = last or curve["step"][-1]
        late = late and (first is None or 2 * first > end)
        notes.append(
            f"through all {end} steps in seed {seed}"
            if first is None
            else f"until step {first} of {end} in seed {seed}"
        )
    why = ": it opened too late to act" if late else ""
    return f" {method}'s anchor weight (nca_beta) stayed 0 " + " and ".join(notes) + why + "."


def read_per_organism(summary: Mapping[str, Any], experiments: list[dict[str, Any]] | None = None) -> str:
    """Lines reading each organism of `summary` (per method against the baseline) and the documented outcome on the
    same organism; empty when the comparison has no organisms."""
    organisms = summary["statistics"].get("organisms") or {}
    if not any(e["organism"] is not None for o in organisms.values() for e in o["organisms"]):
        return ""
    experiments = documented_outcomes() if experiments is None else experiments
    baseline = summary["statistics"]["baseline"]
    lines, read, notes = [], False, []
    for method, outcome in organisms.items():
        documented = _documented(summary, method, experiments)
        known = None if documented is None else documented.experiment["methods"][documented.name]
        read = read or known is not None
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
            text += "."
            if e["degraded"] and not e["prevented"]:
                text += _anchor_timing(summary, method, e["organism"], e["seeds"])
            lines.append(text)
        if known is not None:
            experiment, name = documented.experiment, documented.name
            named = "" if name == method else f", there named {name!r}"
            lines.append(
                f"Documented in docs/results.md {experiment['section']} ({experiment['name']}, the same "
                f"settings{named}): "
                f"{baseline} degraded on {known['degraded']} of {known['n']} organisms, {method} prevented it on "
                f"{known['prevented']} of those {known['degraded']}."
            )
            note = documented.comparison.version_note()
            if note and note not in notes:
                notes.append(note)
    if not read:
        names = ", ".join(e["name"] for e in experiments) or "none yet"
        lines.append(
            "No per-organism outcome is documented for these settings (docs/results.md sections 9 and 10 document "
            f"{names}), so the organisms are not read against one.{_nearest(summary, experiments)}"
        )
    for note in notes:  # versions are provenance: said, never a reason not to read against the documented outcome
        lines.append(
            f"The documented outcome was {note}; versions are provenance, the settings that shape the numbers match."
        )
    return "\n".join(lines)
