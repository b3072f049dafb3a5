"""Rebuild the tables and figures of docs/results.md from the committed run summaries in docs/results/data/.

Every `data/<name>.json` is the `comparison.json` that `trl-nca compare` wrote for one experiment. In results.md, a
block between `<!-- table:<name> -->` and `<!-- /table -->` is replaced by that run's table (mean ± standard deviation
over seeds, then one row per seed), `<!-- statistics:<name> -->` by its statistics over runs (medians, quartiles, the
paired differences and their tests), and `<!-- figures:<name> -->` ... `<!-- /figures -->` by links to its figures,
drawn into docs/results/figures/ (not committed: run this script, or build the documentation site, to see them).
A study run as slices is reported as it comes: `<!-- units:<name> -->` renders the units of
`examples/configs/results/<name>.yaml` whose slices are committed in its `slices_dir` so far, checked against that
config, and names the units still missing. The experiments of section 8 (`RANGED`) also give the README's block `<!-- ranges:<name> -->` (the spread over their
runs) and `trl_nca/resources/documented_ranges.json`, which `trl-nca compare` reads a new run against.

    python docs/results/build.py            # rewrite the blocks and draw the figures
    python docs/results/build.py --check    # exit 1 if results.md is out of date with the data (used by the tests)
    python docs/results/build.py --add org-main=outputs/org-main   # store a run's comparison.json as data/org-main.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import NamedTuple


HERE = Path(__file__).resolve().parent


def _beside(name: str):
    """The module `name`.py beside this script (this folder is no package)."""
    spec = importlib.util.spec_from_file_location(f"results_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


readers = _beside("readers")  # the summary's study readers

PAGE = HERE.parent / "results.md"
DATA = HERE / "data"
FIGURES = HERE / "figures"
README = HERE.parents[1] / "README.md"
RANGES = HERE.parents[1] / "trl_nca" / "resources" / "documented_ranges.json"
BLOCK = re.compile(
    r"<!-- (table|figures|ranges|statistics|organisms|anchors|summary|gate|differences|walltime|units):([\w.-]+) -->"
    r"\n.*?"
    r"<!-- /\1 -->",
    re.DOTALL,
)
RANGED = ("org10-shift", "org10-flip", "org10-facts")  # docs/results.md section 8: the documented ranges
OUTCOMES = HERE.parents[1] / "trl_nca" / "resources" / "documented_organisms.json"
# the documented per-organism outcomes: section 9, the anchor-schedule study of section 10 and the quick job's (10.6)
STUDIES = {
    "units-shift": "section 9",
    "units-flip": "section 9",
    "units-facts": "section 9",
    "anchor-shift": "section 10",
    "anchor-facts": "section 10",
    "main-quick": "section 10.6",
}


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
    titles = {
        "comparison": "accuracy without and with the context",
        "harm": "harm per run",
        "curves": "training curves",
        "tracking": "held-out accuracy along training",
    }
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
        cells = [
            f"{100 * d['median']:.1f} ({100 * d['min']:.1f}-{100 * d['max']:.1f})" if d else "n/a"
            for d in (stats[k] for k in STAT_KEYS)
        ]
        lines.append(f"| {method} | {stats['runs']} | " + " | ".join(cells) + " |")
    baseline = summary["statistics"]["baseline"]
    for method, by_key in summary["statistics"]["paired"].items():
        d = by_key["harm"]
        if d["ci"] is None:
            continue
        low, high = d["ci"]
        ties = f", {d['ties']} equal" if d["ties"] else ""
        lines += [
            "",
            f"{method}'s harm was below {baseline}'s in {d['below']} of {d['n']} paired runs{ties}; "
            f"{baseline} - {method} harm {100 * d['mean']:.1f} points on average, 95% bootstrap interval "
            f"[{100 * low:.1f}, {100 * high:.1f}], exact sign test p = {d['sign_test_p']:.2g}, exact "
            f"permutation test p = {d['permutation_p']:.2g}.",
        ]
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
    from trl_nca.recipes import stalls
    from trl_nca.recipes import statistics as st

    per_seed, baseline = summary["per_seed"], summary["statistics"]["baseline"]
    parts = [stalls.render_stalls(stalls.stalled_runs(per_seed, baseline), baseline)]
    for method in per_seed:
        if method not in ("base", baseline, ANCHOR_REFERENCE):
            outcome = st.organism_outcomes(per_seed[ANCHOR_REFERENCE], per_seed[method])
            parts.append(st.render_over_organisms(outcome, ANCHOR_REFERENCE, method, st.COLUMN_NAMES))
    return "\n\n".join(parts)


def gate(summary: dict, method: str) -> str:
    """Per training seed of `method` (sections 12.2, 13): from the logged `nca_beta` of every optimizer step, the
    steps with `nca_beta` > 0, the first such step and the largest value (`<!-- gate:NAME.METHOD -->`)."""
    lines = [
        "| seed | steps with `nca_beta` > 0 | first such step | largest `nca_beta` |",
        "|---|---:|---:|---:|",
    ]
    for key, curve in summary["curves"].items():
        name, _, seed = key.partition("/seed")
        if name != method:
            continue
        open_steps = [step for step, beta in zip(curve["step"], curve["nca_beta"]) if beta > 0]
        first = str(open_steps[0]) if open_steps else "never"
        lines.append(f"| {seed} | {len(open_steps)} | {first} | {max(curve['nca_beta']):.3f} |")
    return "\n".join(lines)


CONFIGS = HERE.parents[1] / "examples" / "configs" / "results"
SLICES_ROOT = HERE.parents[1]  # the configs' `slices_dir` are relative to the repository


def units(name: str) -> str:
    """A study run as slices, as it comes (`<!-- units:NAME -->`, `trl_nca.recipes.slices.progress`): how many of its
    units have a committed slice and where they ran, the units still missing, the table of those present, the
    students degraded by section 13.1's reading 3, and the gate of each method whose anchor is scheduled."""
    import tempfile

    from trl_nca.recipes import plan_from_config, slices

    with tempfile.TemporaryDirectory() as output:
        plan = plan_from_config(CONFIGS / f"{name}.yaml", output)
        try:
            done = slices.progress(plan, SLICES_ROOT / plan.args.slices_dir)
        except slices.SliceError as error:
            raise SystemExit(f"results.md's block units:{name}: {error}") from None
    total = len(done["present"]) + len(done["missing"])
    lines = [
        f"{len(done['present'])} of {total} units committed"
        + machines([{"slices": done}])
        + (f"; not yet run: {', '.join(done['missing'])}." if done["missing"] else "; none missing."),
        "",
        done["table"],
        "",
        "Columns as in `trl-nca compare`'s table (docs/evaluation.md defines each).",
        "",
    ]
    hit = [
        f"{m} seed {r['seed']} ({'regime A' if r['regime'] == 'A' else 'excess harm'})"
        for m, rows in done["per_seed"].items()
        if m != "base"
        for r in rows
        if readers.degraded(r)
    ]
    lines.append(
        f"Students degraded by 13.1's reading 3{' so far' if done['missing'] else ''} (regime A, or an excess harm of at least "
        f"{100 * readers.MARGIN:.0f} points with its interval above 0): {', '.join(hit) if hit else 'none'}."
    )
    present = {key.partition("/seed")[0] for key in done["curves"]}
    scheduled = dict.fromkeys(  # methods with an anchor whose weight follows a schedule (sdft methods have none)
        run.method.name
        for run in plan.runs
        if run.method.name in present
        and float(getattr(run.config, "nca_beta", 0)) != 0
        and getattr(run.config, "nca_beta_schedule", "constant") != "constant"
    )
    for method in scheduled:
        lines += ["", f"The gate of `{method}`:", "", gate(done, method)]
    return "\n".join(lines)


# `<!-- differences:NAME.METHOD -->`: METHOD minus each reference of the same training seed, in points (section 12.3)
REFERENCES = {"opd": "OPD's", "nca": "constant's"}


def differences(summary: dict, method: str) -> str:
    """Per training seed, `method`'s Acc_x and harm minus those of each reference method (`REFERENCES`) of the same
    seed, in points, from the stored (unrounded) per-seed values."""
    present = [m for m in REFERENCES if m in summary["per_seed"] and m != method]
    header = " | ".join(f"{what} - {REFERENCES[m]}" for m in present for what in ("Acc_x", "harm"))
    lines = [f"| seed | {header} |", "|---|" + "---:|" * (2 * len(present))]
    references = {m: {r["seed"]: r for r in readers.rows_of(summary, m)} for m in present}
    for row in readers.rows_of(summary, method):
        cells = [
            f"{100 * (row[key] - references[m][row['seed']][key]):+.1f}" for m in present for key in ("acc_x", "harm")
        ]
        lines.append(f"| {row['seed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def walltime(kind: str) -> str:
    """The training time of every committed student of one kind of model (`organisms`: the tasks `organism_*`), from
    the summaries' `train_seconds` (`<!-- walltime:organisms -->`)."""
    seconds = []
    for path in sorted(DATA.glob("*.json")):
        summary = json.loads(path.read_text())
        if (kind == "organisms") == summary["task"].startswith("organism_"):
            seconds += [s for s in (summary.get("train_seconds") or {}).values() if s]
    return (
        f"training one of the {len(seconds)} organism students of docs/results/data/ took {min(seconds):.0f} s to "
        f"{max(seconds) / 60:.1f} minutes, whatever its budget (the summaries' `train_seconds`, measured while other "
        "jobs shared the 2 cores)"
    )


# The summary at the top of results.md (`<!-- summary:studies -->`): one row per study. What each study's section fixed
# before its runs (or, where nothing was fixed first, the question it asked) is declared here, once; every other cell
# (task, model, units, methods, versions, the outcome) is read from the study's data by the reader it names. A study
# whose data are not committed yet is shown as pending.
class Study(NamedTuple):
    section: str  # the heading's number: "9", "10.6"
    data: tuple[str, ...]  # data/<name>.json, one per task
    reader: str  # the name of its outcome reader in READERS
    reading: str  # the reading its section fixed
    fixed_in: str | None  # the section that wrote `reading` down before the study's first run; None: not pre-registered
    machine: str  # where it ran; for a study run as slices, the vector units that ran its units are read from them


STUDIES_SUMMARY = (
    Study(
        "2",
        ("isl-budget",),
        "budget",
        "budget: the first tracked step with Acc_x at least the base's + 30 points "
        "(data committed for `island_facts` only)",
        "2",
        "2-core CPU machines of earlier sessions",
    ),
    Study(
        "3",
        ("org-main", "org-100"),
        "seeds",
        "(not fixed first) does OPD degrade, does NCA prevent it?",
        None,
        "2-core CPU machines of earlier sessions; organisms pretrained there",
    ),
    Study(
        "4",
        ("org-sweep", "org-sweep-100"),
        "seeds",
        "(not fixed first) harm against `nca_beta`",
        None,
        "2-core CPU machines of earlier sessions; organisms pretrained there",
    ),
    Study(
        "5",
        ("org-adaptive", "org-adaptive-100", "org-gated"),
        "seeds",
        "(not fixed first) harm and internalisation under the anchor schedules",
        None,
        "2-core CPU machines of earlier sessions; organisms pretrained there",
    ),
    Study(
        "7",
        ("fr-main",),
        "seeds",
        "(not fixed first) does OPD degrade, does NCA prevent it?",
        None,
        "a 2-core CPU machine of an earlier session",
    ),
    Study(
        "8",
        ("org10-shift", "org10-flip", "org10-facts"),
        "distributions",
        "finding 1: OPD's median harm above 2% and regime A in at least a quarter of its runs; finding 2: the paired "
        "OPD - NCA harm interval above 0 and sign test p < 0.05",
        "8.1",
        "2-core Intel Xeon, AVX-512",
    ),
    Study(
        "9",
        ("units-shift", "units-flip", "units-facts"),
        "organisms",
        "finding 1: OPD degrades on at least half of the organisms; finding 2: the two-level OPD - NCA harm interval "
        "above 0 and NCA prevents it on at least 3/4 of those",
        "9.1",
        "2-core AMD EPYC, AVX-512",
    ),
    Study(
        "10",
        ("anchor-shift", "anchor-facts"),
        "anchor_rule",
        "the default: the schedule with fewest stalled runs on both tasks, strictly fewer than constant over both, "
        "and its constant - schedule harm interval not entirely below 0; else constant",
        "10.1",
        "2-core AMD EPYC, AVX2",
    ),
    Study(
        "10.6",
        ("main-quick",),
        "organisms_gate",
        'the quick job: the first candidate whose reading is "opd degraded, nca prevented it" with the gate '
        "open, at most 60 steps",
        "10.6.1",
        "2-core AMD EPYC, AVX-512",
    ),
    Study(
        "11",
        ("fr-30",),
        "real_model",
        "internalised: Acc_x at least the base's + 30 points; OPD degraded: regime A in 2 of 3 seeds; NCA prevented "
        "it: no NCA seed in A, and NCA's harm below OPD's where OPD is in A",
        "11.1",
        "2-core AMD EPYC",
    ),
    Study(
        "11.5",
        ("town-budget",),
        "budget",
        "budget: the first tracked step with Acc_x at least the base's + 30 points, within 60 steps; none: no NCA run",
        "11.1",
        "2-core AMD EPYC, AVX2",
    ),
    Study(
        "12",
        ("fr-30-default",),
        "default_cost",
        "the default (gated) anchor costs Acc_x (harm) when it is at least 5 points below (above) OPD's in 2 of 3 "
        "seeds; internalised as in 11.1",
        "12.1",
        "2-core AMD EPYC",
    ),
    Study(
        "13",
        ("twice",),
        "twice",
        "on a task chosen on the base whose context cannot be applied twice, 10 and 40 steps: a student degraded when "
        "in regime A or its excess harm over the floor is at least 5 points with its interval above 0; OPD degraded "
        "when 2 of 3 seeds did; an anchor prevented it when none of its seeds degraded and its excess is below OPD's",
        "13.1, 13.3",
        "2-core AMD EPYC",
    ),
)


def _heading(page: str, section: str) -> str:
    """The heading of `section` in the page ("## 9. ..." or "### 10.6 ...") and its link, as MkDocs writes anchors."""
    match = re.search(rf"^#+ {re.escape(section)}\.? (.+)$", page, re.MULTILINE)
    if match is None:
        raise SystemExit(f"build.py's summary names section {section}, but results.md has no such heading.")
    slug = re.sub(r"[^\w\s-]", "", f"{section} {match.group(1)}").strip().lower()
    slug = re.sub(r"[-\s]+", "-", slug)
    return f"[{section}](#{slug})"


def _units(summary: dict) -> str:
    rows = [r for m, v in summary["per_seed"].items() if m != "base" for r in v]
    organisms = {r.get("organism") for r in rows} - {None}
    seeds = len({r.get("seed") for r in rows})
    count = f"{seeds} seed{'s' if seeds != 1 else ''}"
    return f"{len(organisms)} organism{'s' if len(organisms) != 1 else ''} x {count}" if organisms else count


def _model(summary: dict) -> str:
    model = (summary.get("settings") or {}).get("student", {}).get("model")
    if model is None:  # older summaries: their task names the model
        model = "organism" if summary["task"].startswith("organism_") else "embedded"
    return {"embedded": "SmolLM2-135M-Instruct"}.get(model, model)


VECTOR_UNITS = {"AVX512": "AVX-512", "AVX2": "AVX2", "DEFAULT": "no vector unit"}


def machines(summaries: list[dict]) -> str:
    """The vector units (and torch threads) that ran a study's units, read from its slices (`slices.machines` of its
    summaries): one, or each with the units it ran; empty for a study not run as slices."""
    units: dict[str, list[str]] = {}
    for summary in summaries:
        for unit, machine in ((summary.get("slices") or {}).get("machines") or {}).items():
            threads = machine["torch_threads"]
            name = VECTOR_UNITS.get(machine["cpu_capability"], machine["cpu_capability"])
            units.setdefault(f"{name}, {threads} torch thread{'s' if threads != 1 else ''}", []).append(unit)
    if len(units) <= 1:
        return "".join(f", {name}" for name in units)
    return ": " + "; ".join(f"{name} ({', '.join(names)})" for name, names in units.items())


def summary_table(page: str) -> str:
    """The summary's table: one row per study of `STUDIES_SUMMARY`, then which sections were written first."""
    lines = [
        "| study | task | model | units | methods | fixed first | reading | outcome | machine; transformers |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for study in STUDIES_SUMMARY:
        present = {name: load(name) for name in study.data if (DATA / f"{name}.json").is_file()}
        if len(present) < len(study.data):
            missing = ", ".join(f"data/{n}.json" for n in study.data if n not in present)
            tasks = models = units = methods = "-"
            outcome = f"**pending**: {missing} not committed yet"
            versions = ""
        else:
            summaries = list(present.values())
            tasks = ", ".join(dict.fromkeys(f"`{s['task']}`" for s in summaries))
            models = ", ".join(dict.fromkeys(_model(s) for s in summaries))
            units = ", ".join(dict.fromkeys(_units(s) for s in summaries))
            methods = ", ".join(dict.fromkeys(m for s in summaries for m in s["methods"]))
            outcome = readers.READERS[study.reader](present)
            versions = (
                machines(summaries) + "; " + ", ".join(sorted({s["versions"]["transformers"] for s in summaries}))
            )
        cells = [
            _heading(page, study.section),
            tasks,
            models,
            units,
            methods,
            study.fixed_in or "no",
            study.reading,
            outcome,
            study.machine + versions,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    versions: dict[str, set[str]] = {}
    for path in sorted(DATA.glob("*.json")):
        for library, version in json.loads(path.read_text()).get("versions", {}).items():
            versions.setdefault(library, set()).add(version)
    lines += [
        "",
        "Library versions over all committed runs (each run's are in its summary's `versions`): "
        + ", ".join(
            f"{library} {' or '.join(sorted(found))}" + (" (per study above)" if len(found) > 1 else "")
            for library, found in versions.items()
        )
        + ".",
    ]
    fixed = list(dict.fromkeys(["1"] + [s.fixed_in for s in STUDIES_SUMMARY if s.fixed_in]))
    lines += [
        "",
        f"Written down before the runs they govern: sections {', '.join(fixed[:-1])} and {fixed[-1]} "
        "(section 1 chose the built-in tasks on the base model alone, before any training). Sections 1 and 6 "
        "compare no methods and have no row.",
    ]
    return "\n".join(lines)


def render(text: str) -> str:
    def replace(match: re.Match) -> str:
        kind, name = match.group(1), match.group(2)
        if kind == "organisms":
            experiment, _, method = name.partition(".")
            body = organisms(load(experiment), method)
        elif kind == "figures":
            body = figure_links(name)
        elif kind == "summary":
            body = summary_table(text)
        elif kind in ("gate", "differences"):
            experiment, _, method = name.partition(".")
            body = {"gate": gate, "differences": differences}[kind](load(experiment), method)
        elif kind == "walltime":
            body = walltime(name)
        elif kind == "units":
            body = units(name)
        else:
            body = {"table": table, "ranges": spread, "statistics": statistics, "anchors": anchors}[kind](load(name))
        start = text.rfind("\n", 0, match.start()) + 1  # a block inside a list item keeps the item's indent
        indent = text[start : match.start()] if not text[start : match.start()].strip() else ""
        body = "\n".join(indent + line if line else line for line in body.split("\n"))
        return f"<!-- {kind}:{name} -->\n{body}\n{indent}<!-- /{kind} -->"

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
    parser.add_argument(
        "--add",
        action="append",
        default=[],
        metavar="NAME=FOLDER",
        help="store FOLDER/comparison.json (written by trl-nca compare) as data/NAME.json",
    )
    args = parser.parse_args(argv)
    for item in args.add:
        name, _, folder = item.partition("=")
        summary = json.loads((Path(folder) / "comparison.json").read_text())
        DATA.mkdir(exist_ok=True)
        (DATA / f"{name}.json").write_text(json.dumps(summary, separators=(",", ":")) + "\n")
    outputs = {
        PAGE: render(PAGE.read_text()),
        README: render(README.read_text()),
        RANGES: ranges_file(),
        OUTCOMES: outcomes_file(),
    }
    if args.check:
        stale = [
            str(path.relative_to(HERE.parents[1]))
            for path, text in outputs.items()
            if not path.is_file() or path.read_text() != text
        ]
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
