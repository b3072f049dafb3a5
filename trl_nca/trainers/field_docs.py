"""Config docstrings written from the fields' help texts, so that each field is documented once.

A field's text lives in its `metadata["help"]`, which `TrlParser --help` shows. `document_fields` appends the same
text to the class docstring, which `help()` and the API pages show (the site reads it at run time:
`scripts/griffe_runtime_docstrings.py`), and `scripts/config_reference.py` writes it into docs/configuration.md. The
field's type and default come from its declaration.

A class documents the fields declared in this package (those of its `trl_nca` base classes and its own), in
declaration order, grouped in sections: `_doc_sections` (a class attribute) maps the field that opens a section to
the section's title, and a section runs to the next one. A field that a base class of another package already
declares (a changed default) is listed with that base's default. A new field needs only its declaration, with its
help, where it belongs.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import textwrap
import typing
from typing import Any


PACKAGE = __name__.split(".")[0]
INDENT = " " * 4
WIDTH = 120


def _ours(klass: type) -> bool:
    return klass.__module__.split(".")[0] == PACKAGE


def base_config(cls: type) -> type | None:
    """The first dataclass of another package among `cls`'s bases (`GKDConfig`, `DistillationConfig`), if any."""
    return next((k for k in cls.__mro__[1:] if dataclasses.is_dataclass(k) and not _ours(k)), None)


def annotation(cls: type, name: str) -> str:
    """A field's type as written in its class (HfArgumentParser rewrites `Field.type` in place)."""
    for klass in cls.__mro__:
        if name in klass.__dict__.get("__annotations__", {}):
            written = klass.__dict__["__annotations__"][name]
            if isinstance(written, str) and written.isidentifier():  # a named type: a Literal built from a registry
                resolved = typing.get_type_hints(klass).get(name)
                if typing.get_origin(resolved) is typing.Literal:
                    return "Literal[" + ", ".join(map(repr, typing.get_args(resolved))) + "]"
            return written if isinstance(written, str) else getattr(written, "__name__", str(written))
    raise KeyError(name)


def field_names(cls: type) -> list[str]:
    """The fields `cls` documents, in order: those declared in the package's classes of its MRO, base classes first,
    without the fields a base of another package already has; `document_fields(after=...)` places a field right
    after another one."""
    after = cls.__dict__.get("_doc_after", {})
    fields = {f.name for f in dataclasses.fields(cls)}
    base = base_config(cls)
    inherited = {f.name for f in dataclasses.fields(base)} if base else set()
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        if not _ours(klass):
            continue
        for name in klass.__dict__.get("__annotations__", {}):
            if name in fields and name not in inherited and name not in names and name not in after:
                names.append(name)
    for name, anchor in after.items():
        names.insert(names.index(anchor) + 1, name)
    return names


def changed_defaults(cls: type) -> list[str]:
    """Fields of the base config (of another package) that `cls` declares again, with another default."""
    base = base_config(cls)
    inherited = {f.name for f in dataclasses.fields(base)} if base else set()
    return [n for n in cls.__dict__.get("__annotations__", {}) if n in inherited and n in cls.__dataclass_fields__]


def default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _type_text(written: str) -> str:
    """`float` -> "`float`"; `str | None` -> "`str` or `None`"; `Literal['a', 'b']` -> "`str`" (TRL's style)."""
    kinds = ["str" if part.strip().startswith("Literal[") else part.strip() for part in written.split(" | ")]
    return " or ".join(f"`{kind}`" for kind in kinds)


def _value_text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value)


@dataclasses.dataclass
class Section:
    """Fields documented together under a title; `base` is set for fields whose default differs from that base's."""

    title: str
    names: list[str]
    base: type | None = None


def sections(cls: type) -> list[Section]:
    """The docstring's sections, in order: those that `_doc_sections` opens, then the fields `cls` itself adds to
    its base, then the base's fields whose default `cls` changes."""
    base = base_config(cls)
    titles = dict(getattr(cls, "_doc_sections", {}))
    own = cls.__dict__.get("__annotations__", {})
    added = [n for n in field_names(cls) if n in own and n not in cls.__dict__.get("_doc_after", {})]
    if base is not None and added and added[0] not in titles:
        titles[added[0]] = f"Parameters that `{base.__name__}` lacks"
    grouped: list[Section] = []
    for name in field_names(cls):
        if name in titles or not grouped:
            grouped.append(Section(titles.get(name, "Parameters"), []))
        grouped[-1].names.append(name)
    changed = changed_defaults(cls)
    if changed:
        grouped.append(Section(f"Parameters of `{base.__name__}` whose default differs", changed, base))
    return grouped


def entry(cls: type, name: str, base: type | None = None) -> str:
    """One field in the `Parameters:` style of TRL's configs: name, type and default, then the help text (and the
    default of `base`, when given)."""
    f = cls.__dataclass_fields__[name]
    head = f"{INDENT}{name} ({_type_text(annotation(cls, name))}, *optional*, defaults to `{_value_text(default(f))}`):"
    text = f.metadata["help"]
    if base is not None:
        text += f" `{base.__name__}` defaults to `{_value_text(default(base.__dataclass_fields__[name]))}`."
    body = textwrap.fill(text, WIDTH, initial_indent=INDENT * 2, subsequent_indent=INDENT * 2, break_on_hyphens=False)
    return head + "\n" + body


def document_fields(after: dict[str, str] | None = None):
    """Class decorator, applied outside `@dataclass`: appends one `Parameters:` block per section to the docstring,
    written from the fields' help texts. `after` maps a field of the class to the field it is documented after."""

    def decorate(cls: type) -> type:
        cls._doc_after = dict(after or {})
        parts = [inspect.cleandoc(cls.__doc__ or "")]
        for section in sections(cls):
            entries = "\n".join(entry(cls, name, section.base) for name in section.names)
            parts.append(f"{section.title}:\n\nParameters:\n{entries}")
        cls.__doc__ = "\n\n".join(parts) + "\n"
        return cls

    return decorate
