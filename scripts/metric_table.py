"""Rewrite docs/evaluation.md's metric table from the column spec (`trl_nca.eval.columns.metric_table`).

python scripts/metric_table.py          # rewrite the block between the markers
python scripts/metric_table.py --check  # exit 1 if the page is not up to date (tests/eval/test_columns.py does this)

Each row is a metric's `Column.definition`, in the spec's order: a paired metric added to the spec reaches the page
by running this script.
"""

import sys
from pathlib import Path

from trl_nca.eval.columns import metric_table


PAGE = Path(__file__).resolve().parents[1] / "docs" / "evaluation.md"
BEGIN = "<!-- BEGIN GENERATED: python scripts/metric_table.py -->\n"
END = "<!-- END GENERATED -->\n"


def render(page: str) -> str:
    """`page` with the block between the markers replaced by the metric table."""
    start, end = page.index(BEGIN) + len(BEGIN), page.index(END, page.index(BEGIN))
    return page[:start] + metric_table() + page[end:]


if __name__ == "__main__":
    text = PAGE.read_text(encoding="utf-8")
    rendered = render(text)
    if "--check" in sys.argv[1:]:
        sys.exit(0 if rendered == text else 1)
    PAGE.write_text(rendered, encoding="utf-8")
