"""The deprecation policy, in code: a renamed or moved public name keeps working under its old name for one minor
version, with a `FutureWarning` that names the new one and the release that removes the old (docs/design.md,
"Deprecation policy"). Each alias is written with one of these helpers, and tests/core/test_deprecations.py checks each."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any


# The release that removes the names deprecated in this one (one minor version after 0.1).
REMOVED_IN = "0.2.0"


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """The one warning of a deprecated name: `old` is now `new`."""
    warnings.warn(
        f"{old} is deprecated: use {new}. The old name will be removed in trl-nca {REMOVED_IN}.",
        FutureWarning,
        stacklevel=stacklevel,
    )


def renamed_keyword(where: str, old: str, new: str, old_value: Any, new_value: Any, default: Any) -> Any:
    """The value of keyword `new` of `where`, given under its old name `old` (with the warning) or its new one; both
    at once is an error."""
    if old_value is None:
        return new_value
    if new_value is not default:
        raise TypeError(f"{where} got both {old}= (deprecated) and {new}=; pass {new}= only.")
    warn_renamed(f"{where}({old}=...)", f"{new}=", stacklevel=4)
    return old_value


def moved_module(old: str, *new: ModuleType) -> Callable[[str], Any]:
    """The module-level `__getattr__` of the module `old` whose names moved to the modules `new`: each attribute is
    read from the first of them that has it. The old module's import warns once (`warn_renamed` in its body)."""

    def __getattr__(name: str) -> Any:
        for module in new:
            if hasattr(module, name):
                return getattr(module, name)
        names = ", ".join(module.__name__ for module in new)
        raise AttributeError(f"module {old!r} has no attribute {name!r} (its names moved to {names})")

    return __getattr__


def moved_names(old: str, names: dict[str, str]) -> Callable[[str], Any]:
    """The module-level `__getattr__` of the module `old` for single names that moved out of it: `names` maps each
    old name to the module that now holds it. Reading one warns (`warn_renamed`) and returns it from there; the new
    module is imported by name only then, so an alias in a lower layer holds no import of the command line above it
    (the alias lives one minor version, `REMOVED_IN`)."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warn_renamed(f"{old}.{name}", f"{names[name]}.{name}")
        return getattr(importlib.import_module(names[name]), name)

    return __getattr__
