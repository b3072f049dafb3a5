"""Rewrite the generated field reference in docs/configuration.md from the config classes' fields and their help.

python scripts/config_reference.py          # rewrite the block between the markers
python scripts/config_reference.py --check  # exit 1 if the page is not up to date (tests/project/test_docs.py does this)

The tables show each field's `metadata["help"]`, the same text as `--help` and the class docstrings
(`trl_nca.trainers.field_docs`), with the type as written and the default.
"""

import sys
from dataclasses import fields
from pathlib import Path

from trl_nca.trainers import field_docs
from trl_nca.trainers.nca_config import NCAConfig, NCAFields
from trl_nca.trainers.nca_distillation_config import NCADistillationConfig


PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
BEGIN = "<!-- BEGIN GENERATED: python scripts/config_reference.py -->\n"
END = "<!-- END GENERATED -->\n"


def _value(value) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return "`" + text.replace("|", "\\|") + "`"


def _text(text: str) -> str:
    return text.replace("|", "\\|")


def _help(config_class, name: str) -> str:
    return _text(config_class.__dataclass_fields__[name].metadata["help"])


def _type(config_class, name: str) -> str:
    return "`" + field_docs.annotation(config_class, name).replace("|", "\\|") + "`"


def nca_field_names(config_class) -> list[str]:
    """The NCA fields of a config class in documentation order (its docstring's): those of `NCAFields`, with the
    class's support-size field right after `divergence_support`."""
    nca = NCAFields.__dataclass_fields__
    return [n for n in field_docs.field_names(config_class) if n in nca or n == config_class._support_size_name]


def field_reference() -> str:
    """Markdown tables of the NCA fields (declared once, in `NCAFields`), of the `GKDConfig` fields whose defaults
    `NCAConfig` changes, of the fields `NCAConfig` adds, and of how `NCADistillationConfig` differs."""
    header = ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    ours = {f.name: f for f in fields(NCAConfig)}
    nca = nca_field_names(NCAConfig)
    rows = header + [
        f"| `{n}` | {_type(NCAConfig, n)} | {_value(field_docs.default(ours[n]))} | {_help(NCAConfig, n)} |"
        for n in nca
    ]
    base = field_docs.base_config(NCAConfig)
    base_fields = {f.name: f for f in fields(base)}
    changed = ["| field | GKDConfig default | NCAConfig default | meaning |", "| --- | --- | --- | --- |"] + [
        f"| `{n}` | {_value(field_docs.default(base_fields[n]))} | {_value(field_docs.default(ours[n]))} | "
        f"{_help(NCAConfig, n)} |"
        for n in field_docs.changed_defaults(NCAConfig)
    ]
    added = header + [
        f"| `{n}` | {_type(NCAConfig, n)} | {_value(field_docs.default(ours[n]))} | {_help(NCAConfig, n)} |"
        for n in field_docs.field_names(NCAConfig)
        if n not in nca
    ]
    renamed = [
        f"| `{a}` | `{b}` | {_help(NCAConfig, a)} |"
        for a, b in zip(nca, nca_field_names(NCADistillationConfig))
        if a != b
    ]
    differing = [f"`{n}`" for n in field_docs.changed_defaults(NCADistillationConfig)]
    distillation = {f.name: f for f in fields(NCADistillationConfig)}
    own = header + [
        f"| `{n}` | {_type(NCADistillationConfig, n)} | {_value(field_docs.default(distillation[n]))} | "
        f"{_help(NCADistillationConfig, n)} |"
        for n in field_docs.field_names(NCADistillationConfig)
        if n not in nca_field_names(NCADistillationConfig)
    ]
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
        + ".\n\nFields only `NCADistillationConfig` has (a teacher behind a vLLM server: docs/vllm.md):\n\n"
        + "\n".join(own)
        + "\n"
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
