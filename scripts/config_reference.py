"""Rewrite the generated field reference in docs/configuration.md from `NCAConfig`'s fields and their metadata.

python scripts/config_reference.py          # rewrite the block between the markers
python scripts/config_reference.py --check  # exit 1 if the page is not up to date (tests/test_docs.py does this)
"""

import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from trl import DistillationConfig

from trl_nca.config import GKDConfig, NCAConfig, NCADistillationConfig, _nca_field_names


PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
BEGIN = "<!-- BEGIN GENERATED: python scripts/config_reference.py -->\n"
END = "<!-- END GENERATED -->\n"


def _markdown_value(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return "`" + text.replace("|", "\\|") + "`"


def _markdown_text(text: str) -> str:
    return text.replace("|", "\\|")


def _annotation(config_class, name: str) -> str:
    """A field's type as written (HfArgumentParser rewrites `field.type` in place)."""
    for klass in config_class.__mro__:
        if name in getattr(klass, "__annotations__", {}):
            return str(klass.__annotations__[name]).replace("|", "\\|")
    raise KeyError(name)


def field_reference() -> str:
    """Markdown tables of the NCA fields (declared once, in `NCAFields`), of the `GKDConfig` fields whose defaults
    `NCAConfig` changes, and of how `NCADistillationConfig` differs, built from the fields' defaults, types and
    `metadata["help"]` (the text `--help` shows). docs/configuration.md embeds them between markers;
    `python scripts/config_reference.py` rewrites them there, and a test fails when the page drifts."""
    gkd = {f.name: f for f in fields(GKDConfig)}
    ours = {f.name: f for f in fields(NCAConfig)}
    rows = ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name in _nca_field_names(NCAConfig):
        f = ours[name]
        kind = _annotation(NCAConfig, name)
        rows.append(f"| `{name}` | `{kind}` | {_markdown_value(f.default)} | {_markdown_text(f.metadata['help'])} |")
    changed = ["| field | GKDConfig default | NCAConfig default | meaning |", "| --- | --- | --- | --- |"]
    for name in NCAConfig.__annotations__:
        if name in gkd:
            f = ours[name]
            changed.append(
                f"| `{name}` | {_markdown_value(gkd[name].default)} | {_markdown_value(f.default)} | "
                f"{_markdown_text(f.metadata['help'])} |"
            )
    added = ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name in NCAConfig.__annotations__:
        if name not in gkd and name not in _nca_field_names(NCAConfig):
            f = ours[name]
            added.append(
                f"| `{name}` | `{_annotation(NCAConfig, name)}` | {_markdown_value(f.default)} | "
                f"{_markdown_text(f.metadata['help'])} |"
            )
    distill = {f.name: f for f in fields(DistillationConfig)}
    theirs = {f.name: f for f in fields(NCADistillationConfig)}
    renamed = [
        f"| `{a}` | `{b}` | {_markdown_text(ours[a].metadata['help'])} |"
        for a, b in zip(_nca_field_names(NCAConfig), _nca_field_names(NCADistillationConfig))
        if a != b
    ]
    overridden = [name for name in NCADistillationConfig.__annotations__ if name in distill]
    differing = [f"`{name}`" for name in overridden if theirs[name].default != distill[name].default]
    return (
        "\n".join(rows)
        + "\n\nFields of `GKDConfig` whose default differs:\n\n"
        + "\n".join(changed)
        + "\n\nFields `NCAConfig` adds to `GKDConfig` (as `DistillationConfig` has them):\n\n"
        + "\n".join(added)
        + "\n\n`NCADistillationConfig` (on `DistillationConfig`) has the same NCA fields, with the same types, defaults "
        + "and meaning, except:\n\n| `NCAConfig` | `NCADistillationConfig` | meaning |\n| --- | --- | --- |\n"
        + "\n".join(renamed)
        + "\n\nFields of `DistillationConfig` whose default differs: "
        + (", ".join(differing) if differing else "none")
        + ".\n"
    )


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
