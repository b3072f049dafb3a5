"""Rebuild the tables and figures of docs/results.md from the committed run summaries in docs/results/data/.

Every `data/<name>.json` is the `comparison.json` that `trl-nca compare` wrote for one experiment. In results.md, a
block between `<!-- table:<name> -->` and `<!-- /table -->` is replaced by that run's table (mean ± standard deviation
over seeds, then one row per seed), and `<!-- figures:<name> -->` ... `<!-- /figures -->` by links to its figures,
drawn into docs/results/figures/ (not committed: run this script, or build the documentation site, to see them).

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
BLOCK = re.compile(r"<!-- (table|figures):([\w.-]+) -->\n.*?<!-- /\1 -->", re.DOTALL)


def load(name: str) -> dict:
    path = DATA / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"results.md refers to {name!r}, but {path} does not exist.")
    return json.loads(path.read_text())


def table(summary: dict) -> str:
    from trl_nca.recipes.compare import render_table

    return render_table(summary["aggregated"], summary["per_seed"], summary["columns"])


def figure_links(name: str) -> str:
    titles = {"comparison": "accuracy without and with the context", "curves": "training curves",
              "tracking": "held-out accuracy along training"}  # fmt: skip
    summary = load(name)
    kinds = ["comparison", "curves"] + (["tracking"] if any(summary.get("tracking", {}).values()) else [])
    return "\n".join(f"![{name}: {titles[k]}](results/figures/{name}-{k}.png)" for k in kinds)


def render(text: str) -> str:
    def replace(match: re.Match) -> str:
        kind, name = match.group(1), match.group(2)
        body = table(load(name)) if kind == "table" else figure_links(name)
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
    text = PAGE.read_text()
    updated = render(text)
    if args.check:
        if updated != text:
            print("docs/results.md is out of date with docs/results/data: run python docs/results/build.py")
            return 1
        return 0
    PAGE.write_text(updated)
    print(f"Rewrote {PAGE}; drew {len(draw_all())} figures into {FIGURES}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
