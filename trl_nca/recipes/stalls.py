"""Stalled runs: a method's runs whose no-context accuracy stays well below the reference method's on the same
organism and training seed (docs/results.md section 10.1 reads the anchor schedules by them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..core.checks import format_pct


STALL_SHARE = 0.9  # docs/results.md 10.1: a run is stalled below this share of the reference's Acc_x


def stalled_runs(
    per_seed: Mapping[str, Sequence[Mapping[str, Any]]], reference: str, share: float = STALL_SHARE
) -> dict[str, dict[str, Any]]:
    """Per method other than `reference` (and the bases): its runs paired with a reference run of the same organism
    and training seed, and those whose Acc_x is below `share` of the reference's (stalled), each with both Acc_x."""
    ref = {(r.get("organism"), r.get("seed")): r for r in per_seed[reference]}
    out: dict[str, dict[str, Any]] = {}
    for method, rows in per_seed.items():
        if method in (reference, "base"):
            continue
        runs, stalled = 0, []
        for row in rows:
            other = ref.get((row.get("organism"), row.get("seed")))
            if other is None or row.get("acc_x") is None or other.get("acc_x") is None:
                continue
            runs += 1
            if row["acc_x"] < share * other["acc_x"]:
                stalled.append(
                    {
                        "organism": row.get("organism"),
                        "seed": row.get("seed"),
                        "acc_x": row["acc_x"],
                        "reference_acc_x": other["acc_x"],
                    }
                )
        out[method] = {"runs": runs, "stalled": stalled}
    return out


def render_stalls(stalls: Mapping[str, Mapping[str, Any]], reference: str, share: float = STALL_SHARE) -> str:
    """The Markdown of `stalled_runs`: per method, its stalled runs counted and named."""
    lines = [
        f"Stalled runs (Acc_x below {share:.0%} of {reference}'s on the same organism and training seed):",
        "",
        f"| method | runs | stalled | stalled runs: organism/seed (Acc_x vs {reference}'s, in %) |",
        "|---|---|---|---|",
    ]
    for method, entry in stalls.items():
        named = ", ".join(
            f"{s['organism']}/{s['seed']} ({format_pct(s['acc_x'])} vs {format_pct(s['reference_acc_x'])})"
            for s in entry["stalled"]
        )
        lines.append(f"| {method} | {entry['runs']} | {len(entry['stalled'])} | {named or '-'} |")
    return "\n".join(lines)
