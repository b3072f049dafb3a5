"""The per-organism outcomes of `docs/results.md` sections 9 and 10, and a new comparison read against them.

The shipped organisms are the same weights on every machine, so a comparison on them can be read organism by organism
against the documented study of the same settings: did the baseline (plain OPD) degrade on this organism, did the
method (NCA) prevent it, and what did the documented runs find on the same organism. `docs/results/build.py` writes
the documented outcomes (per experiment of sections 9 and 10: its settings, each organism's outcome, the counts) into
`resources/documented_organisms.json` from the committed summaries. The definitions are those of
`trl_nca.recipes.statistics.organism_outcomes`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from ..core.checks import format_pct
from ..core.schedule import schedule_reads
from .ranges import canonical, json_default, matching_settings


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


def _fingerprint(settings: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=json_default).encode()).hexdigest()


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
            "settings_sha256": _fingerprint(method_settings(summary, method)),
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
        "baseline_settings_sha256": _fingerprint(method_settings(summary, baseline)),
        "match": _match(summary),
        "methods": methods,
    }


def _documented(summary: Mapping[str, Any], method: str, experiments: list[dict[str, Any]]):
    """The first documented experiment with the same shared settings, the same baseline and a method with the same
    settings as `method` (under any name), and that method's name there; (None, None) without one."""
    baseline = summary["statistics"]["baseline"]
    shared, baseline_print = _match(summary), _fingerprint(method_settings(summary, baseline))
    method_print = _fingerprint(method_settings(summary, method))
    for experiment in experiments:
        if experiment["match"] != shared or experiment.get("baseline_settings_sha256") != baseline_print:
            continue
        for name, known in experiment["methods"].items():
            if known.get("settings_sha256") == method_print:
                return experiment, name
    return None, None


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
    lines, read = [], False
    for method, outcome in organisms.items():
        documented, name = _documented(summary, method, experiments)
        known = None if documented is None else documented["methods"][name]
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
            named = "" if name == method else f", there named {name!r}"
            lines.append(
                f"Documented in docs/results.md {documented['section']} ({documented['name']}, the same "
                f"settings{named}): "
                f"{baseline} degraded on {known['degraded']} of {known['n']} organisms, {method} prevented it on "
                f"{known['prevented']} of those {known['degraded']}."
            )
    if not read:
        names = ", ".join(e["name"] for e in experiments) or "none yet"
        lines.append(
            "No per-organism outcome is documented for these settings (docs/results.md sections 9 and 10 document "
            f"{names}), so the organisms are not read against one."
        )
    return "\n".join(lines)
