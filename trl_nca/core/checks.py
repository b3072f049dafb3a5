"""Type and range checks of numbers given by a user (config fields, command options), with messages that show the
value's type, so that a string "0.5" does not read as the number 0.5; and the one way rates are shown as percentages
(`format_pct`)."""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any


def is_int(value: Any) -> bool:
    """Whether `value` is an integer and not a bool (`True` is an `int` to Python, never to a user)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def format_pct(value: float | None, sign: bool = False) -> str:
    """A rate in [0, 1] as a percentage with one decimal (`0.125` -> `12.5`, or `12.5%` with `sign`); `n/a` for a
    missing (None) or undefined (NaN) rate."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{100 * value:.1f}{'%' if sign else ''}"


def shown(value: Any) -> str:
    """A value with its type: `the str '0.5'`, `the float nan`."""
    return f"the {type(value).__name__} {value!r}"


def check_number(
    name: str, value: Any, low: float | None = None, high: float | None = None, low_open: bool = False, hint: str = ""
) -> None:
    """A finite real number (not a bool, not a string) within [low, high] (or (low, high] with `low_open`)."""
    bounds = []
    if low is not None:
        bounds.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        bounds.append(f"<= {high:g}")
    wanted = "a finite number" + (f" {' and '.join(bounds)}" if bounds else "") + (f" ({hint})" if hint else "")
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        fix = " Pass a number, not a string." if isinstance(value, str) else ""
        raise ValueError(f"{name} must be {wanted}, got {shown(value)}.{fix}")


def check_integer(name: str, value: Any, low: int, hint: str = "") -> None:
    """An integer (not a bool) >= `low`."""
    if not is_int(value) or value < low:
        extra = f" ({hint})" if hint else ""
        raise ValueError(f"{name} must be an integer >= {low}{extra}, got {shown(value)}.")
