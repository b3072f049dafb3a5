"""Rebuild the tables and figures of docs/results.md from the committed run summaries in docs/results/data/.

Every `data/<name>.json` is the `comparison.json` that `trl-nca compare` wrote for one experiment. In results.md, a
block between `<!-- table:<name> -->` and `<!-- /table -->` is replaced by that run's table (mean ± standard deviation
over seeds, then one row per seed), `<!-- statistics:<name> -->` by its statistics over runs (medians, quartiles, the
paired differences and their tests), and `<!-- figures:<name> -->` ... `<!-- /figures -->` by links to its figures,
drawn into docs/results/figures/ (not committed: run this script, or build the documentation site, to see them).
The experiments of section 8 (`RANGED`) also give the README's block `<!-- ranges:<name> -->` (the spread over their
runs) and `trl_nca/resources/documented_ranges.json`, which `trl-nca compare` reads a new run against.

    python docs/results/build.py            # rewrite the blocks and draw the figures
    python docs/results/build.py --check    # exit 1 if results.md is out of date with the data (used by the tests)
    python docs/results/build.py --add org-main=outputs/org-main   # store a run's comparison.json as data/org-main.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


HERE = Path(__file__).resolve().parent
PAGE = HERE.parent / "results.md"
DATA = HERE / "data"
FIGURES = HERE / "figures"
README = HERE.parents[1] / "README.md"
RANGES = HERE.parents[1] / "trl_nca" / "resources" / "documented_ranges.json"
BLOCK = re.compile(
    r"<!-- (table|figures|ranges|statistics|organisms|anchors):([\w.-]+) -->\n.*?<!-- /\1 -->", re.DOTALL
)
RANGED = ("org10-shift", "org10-flip", "org10-facts")  # docs/results.md section 8: the documented ranges
OUTCOMES = HERE.parents[1] / "trl_nca" / "resources" / "documented_organisms.json"
# the documented per-organism outcomes: section 9, the anchor-schedule study of section 10 and the quick job's (10.6)
STUDIES = {"units-shift": "section 9", "units-flip": "section 9", "units-facts": "section 9",
           "anchor-shift": "section 10", "anchor-facts": "section 10"}  # fmt: skip


def load(name: str) -> dict:
    path = DATA / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"results.md refers to {name!r}, but {path} does not exist.")
    return current_statistics(json.loads(path.read_text()))


def current_statistics(summary: dict) -> dict:
    """`summary` with its readings per organism recomputed from its per-seed records by today's
    `trl_nca.recipes.statistics`, so that a mended statistic (e.g. an organism whose mean difference is zero up to
    rounding, now a tie rather than a difference) reaches every table without editing the stored runs."""
    from trl_nca.recipes.statistics import compare_organisms

    statistics = summary.get("statistics") or {}
    if statistics.get("organisms"):
        statistics["organisms"] = compare_organisms(summary["per_seed"], statistics["baseline"])
    return summary


def table(summary: dict) -> str:
    from trl_nca.recipes.compare import render_table

    return render_table(summary["aggregated"], summary["per_seed"], summary["columns"], n_items=summary["num_test"])


def figure_links(name: str) -> str:
    titles = {"comparison": "accuracy without and with the context", "harm": "harm per run", "curves": "training curves",
              "tracking": "held-out accuracy along training"}  # fmt: skip
    summary = load(name)
    kinds = ["comparison"] + (
        ["harm"] if "harm" in summary.get("figures", {}) and summary["statistics"]["paired"] else []
    )
    kinds += ["curves"] + (["tracking"] if any(summary.get("tracking", {}).values()) else [])
    return "\n".join(f"![{name}: {titles[k]}](results/figures/{name}-{k}.png)" for k in kinds)


def statistics(summary: dict) -> str:
    from trl_nca.recipes.statistics import COLUMN_NAMES, render_statistics

    return render_statistics(summary["statistics"], COLUMN_NAMES)


def spread(summary: dict) -> str:
    """Per method: runs, then median (min-max) of each statistic (harm, Acc_x, Acc_xc) over all runs, in %."""
    from trl_nca.recipes.ranges import RANGE_KEYS as STAT_KEYS
    from trl_nca.recipes.statistics import COLUMN_NAMES

    lines = ["| method | runs | " + " | ".join(COLUMN_NAMES[k] for k in STAT_KEYS) + " |", "|---|---:|---:|---:|---:|"]
    for method, stats in summary["statistics"]["distributions"].items():
        if method == "base":
            continue
        cells = [f"{100 * d['median']:.1f} ({100 * d['min']:.1f}-{100 * d['max']:.1f})" if d else "n/a"
                 for d in (stats[k] for k in STAT_KEYS)]  # fmt: skip
        lines.append(f"| {method} | {stats['runs']} | " + " | ".join(cells) + " |")
    baseline = summary["statistics"]["baseline"]
    for method, by_key in summary["statistics"]["paired"].items():
        d = by_key["harm"]
        if d["ci"] is None:
            continue
        low, high = d["ci"]
        ties = f", {d['ties']} equal" if d["ties"] else ""
        lines += ["", f"{method}'s harm was below {baseline}'s in {d['below']} of {d['n']} paired runs{ties}; "
                  f"{baseline} - {method} harm {100 * d['mean']:.1f} points on average, 95% bootstrap interval "
                  f"[{100 * low:.1f}, {100 * high:.1f}], exact sign test p = {d['sign_test_p']:.2g}, exact "
                  f"permutation test p = {d['permutation_p']:.2g}."]  # fmt: skip
    return "\n".join(lines)


def ranges_file() -> str:
    from trl_nca.recipes.ranges import ranges_of

    names = [n for n in RANGED if (DATA / f"{n}.json").is_file()]
    experiments = [ranges_of(n, load(n), "section 8") for n in names]
    return json.dumps({"written_by": "docs/results/build.py", "experiments": experiments}, indent=1) + "\n"


def outcomes_file() -> str:
    from trl_nca.recipes.outcomes import outcomes_of

    names = [n for n in STUDIES if (DATA / f"{n}.json").is_file()]
    experiments = [outcomes_of(n, load(n), STUDIES[n]) for n in names]
    return json.dumps({"written_by": "docs/results/build.py", "experiments": experiments}, indent=1) + "\n"


def organisms(summary: dict, method: str = "") -> str:
    """The per-organism table and the statistics over organisms of each method against the baseline (of `method`
    alone when the block names one: `<!-- organisms:units-shift.nca -->`)."""
    from trl_nca.recipes.statistics import COLUMN_NAMES, render_organisms

    outcomes = summary["statistics"]["organisms"]
    if method:
        outcomes = {method: outcomes[method]}
    return render_organisms(outcomes, summary["statistics"]["baseline"], COLUMN_NAMES)


ANCHOR_REFERENCE = "constant"  # docs/results.md section 10: the schedules are read against the constant anchor


def anchors(summary: dict) -> str:
    """Section 10's readings between anchors: the stalled runs of each method (against the baseline, OPD), then per
    schedule the statistics over organisms of `constant` - schedule."""
    from trl_nca.recipes import statistics as st

    per_seed, baseline = summary["per_seed"], summary["statistics"]["baseline"]
    parts = [st.render_stalls(st.stalled_runs(per_seed, baseline), baseline)]
    for method in per_seed:
        if method not in ("base", baseline, ANCHOR_REFERENCE):
            outcome = st.organism_outcomes(per_seed[ANCHOR_REFERENCE], per_seed[method])
            parts.append(st.render_over_organisms(outcome, ANCHOR_REFERENCE, method, st.COLUMN_NAMES))
    return "\n\n".join(parts)


def render(text: str) -> str:
    def replace(match: re.Match) -> str:
        kind, name = match.group(1), match.group(2)
        if kind == "organisms":
            experiment, _, method = name.partition(".")
            body = organisms(load(experiment), method)
        elif kind == "figures":
            body = figure_links(name)
        else:
            body = {"table": table, "ranges": spread, "statistics": statistics, "anchors": anchors}[kind](load(name))
        return f"<!-- {kind}:{name} -->\n{body}\n<!-- /{kind} -->"

    return BLOCK.sub(replace, text)


def draw_all() -> list[str]:
    from trl_nca.recipes.plots import write_figures

    FIGURES.mkdir(exist_ok=True)
    paths = []
    for path in sorted(DATA.glob("*.json")):
        paths += write_figures(json.loads(path.read_text()), FIGURES, prefix=f"{path.stem}-").values()
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that results.md matches the data")
    parser.add_argument("--add", action="append", default=[], metavar="NAME=FOLDER",
                        help="store FOLDER/comparison.json (written by trl-nca compare) as data/NAME.json")  # fmt: skip
    args = parser.parse_args(argv)
    for item in args.add:
        name, _, folder = item.partition("=")
        summary = json.loads((Path(folder) / "comparison.json").read_text())
        DATA.mkdir(exist_ok=True)
        (DATA / f"{name}.json").write_text(json.dumps(summary, separators=(",", ":")) + "\n")
    outputs = {PAGE: render(PAGE.read_text()), README: render(README.read_text()), RANGES: ranges_file(),
               OUTCOMES: outcomes_file()}  # fmt: skip
    if args.check:
        stale = [str(path.relative_to(HERE.parents[1])) for path, text in outputs.items()
                 if not path.is_file() or path.read_text() != text]  # fmt: skip
        if stale:
            print(f"{', '.join(stale)} out of date with docs/results/data: run python docs/results/build.py")
            return 1
        return 0
    for path, text in outputs.items():
        path.write_text(text)
    print(f"Rewrote {PAGE}; drew {len(draw_all())} figures into {FIGURES}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
