"""Rewrite the generated field reference in docs/configuration.md from `NCAConfig`'s fields and their metadata.

python scripts/config_reference.py          # rewrite the block between the markers
python scripts/config_reference.py --check  # exit 1 if the page is not up to date (tests/test_docs.py does this)
"""

import sys
from pathlib import Path

from trl_nca.config import field_reference


PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
BEGIN = "<!-- BEGIN GENERATED: python scripts/config_reference.py -->\n"
END = "<!-- END GENERATED -->\n"


def render(page: str) -> str:
    """The page with the block between the markers replaced by the current field reference."""
    if page.count(BEGIN) != 1 or page.count(END) != 1:
        raise SystemExit(f"{PAGE} must hold the markers {BEGIN.strip()!r} and {END.strip()!r} once each.")
    head, rest = page.split(BEGIN)
    _, tail = rest.split(END)
    return head + BEGIN + field_reference() + END + tail


if __name__ == "__main__":
    current = PAGE.read_text(encoding="utf-8")
    updated = render(current)
    if "--check" in sys.argv[1:]:
        sys.exit(0 if updated == current else 1)
    PAGE.write_text(updated, encoding="utf-8")
