"""The one alias left before the first release: `token_divergences(want=...)` (`trl_nca.core.losses`), written with
these helpers. Nothing has been released yet (0.1.0 is unreleased), so renamed names get no alias; this module goes
with that keyword. From the first release on, the deprecation policy (docs/design.md, "Deprecation policy") applies."""

from __future__ import annotations

import warnings
from typing import Any


# The release that removes the names deprecated in this one.
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
