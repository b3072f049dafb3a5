"""What identifies a run's numbers, and what is only its provenance.

The documented outcomes and ranges, the slices of a table, and the resume checks of `trl-nca compare` and
`trl-nca train` compare the settings that shape a run: what the user set (LoRA's rank, alpha, dropout, target modules
and the rest; the task and its rows; the training config) and whatever else changes a number. They do not compare how
a library serialises its defaults. A field that only one side holds (a newer library added it, or the other side's
library still had it) counts as the same when its value there is the installed library's default for it, or, for a
field the installed library does not know, when it is unset (null, an empty collection, false, an empty string):
the feature it names is off. Any other value of such a field, and any field the two sides hold with different values,
is a difference, and still refuses a resume or keeps a documented outcome from matching.

A field a library renamed is compared under its new name: transformers' `gradient_checkpointing` (and its `_kwargs`)
is `activation_checkpointing` in releases after 5.17 (5.25 has both; `RENAMED_FIELDS`), so a run recorded with either
version matches under the other.

A schedule is compared under one spelling: `adaptive` with `nca_adaptive_init=0` is `gated`, the default anchor's
name (`canonical_schedule`), so runs recorded before the default had its name still match.

Library versions are provenance: the `versions` a summary or slice records, and the version a library writes into its
own config (PEFT's `peft_version`; any key named `version` or ending in `_version`, so a renamed one too). They are
printed and compared as a warning where they differ ("made with peft 0.21.2, running 0.22.0"), never a refusal and
never a silent non-match.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING


MISSING = "<not set>"
"""How a field that one side does not hold is shown in a difference."""

RENAMED_FIELDS = {
    "gradient_checkpointing": "activation_checkpointing",
    "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs",
}
"""A training config's fields that a library renamed (old name: new name); where a config holds both, the new name's
value is the field's (transformers keeps the old one as an alias)."""

VERSIONS_KEY = "versions"
"""The key under which a summary, a slice header or a documented entry records its library versions."""


def json_default(value: Any) -> Any:
    """The JSON form of what `json` cannot write: a set as a sorted list, anything else as its string."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)


def jsonable(value: Any) -> Any:
    """`value` as JSON values; a set becomes a sorted list (its own order changes with every process's hash seed)."""
    return json.loads(json.dumps(value, sort_keys=True, default=json_default))


def canonical(value: Any) -> Any:
    """`value` with every set that older summaries wrote as a string (e.g. LoRA's `target_modules`,
    `"{'v_proj', 'q_proj'}"`, in the writing process's own hash order) read back as the sorted list written now."""
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, str) and value.startswith("{'") and value.endswith("'}"):
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
        if isinstance(parsed, set):
            return sorted(parsed, key=str)
    return value


def is_version_key(key: str) -> bool:
    """Whether a config field names a library's version (provenance, never identity)."""
    return key == "version" or key.endswith("_version")


def _unset(value: Any) -> bool:
    return value is None or value is False or value == "" or (isinstance(value, (list, dict)) and not value)


@functools.cache
def peft_defaults(peft_type: str) -> dict[str, Any]:
    """The installed PEFT's serialised defaults of a config of `peft_type` (`LORA`, ...); empty for a type it does
    not know."""
    config_class = next(
        (c for t, c in PEFT_TYPE_TO_CONFIG_MAPPING.items() if str(getattr(t, "value", t)) == peft_type), None
    )
    return {} if config_class is None else jsonable(config_class().to_dict())


def _field_default(spec: dataclasses.Field) -> Any:
    if spec.default is not dataclasses.MISSING:
        return spec.default
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return MISSING


@functools.cache
def training_defaults() -> dict[str, Any]:
    """The installed libraries' defaults of the training configs' fields (`NCAConfig`, then the fields only
    `NCADistillationConfig` has), as JSON values."""
    from ..trainers.nca_config import NCAConfig
    from ..trainers.nca_distillation_config import NCADistillationConfig

    defaults: dict[str, Any] = {}
    for config_class in (NCADistillationConfig, NCAConfig):  # NCAConfig's own defaults win where both have a field
        defaults.update({f.name: _field_default(f) for f in dataclasses.fields(config_class)})
    return jsonable({k: v for k, v in defaults.items() if v != MISSING})


def _defaults_of(key: str, old: Any, new: Any) -> dict[str, Any]:
    """The installed library's defaults for the fields of the object at `key` (a PEFT config, a training config)."""
    for side in (new, old):
        if isinstance(side, Mapping) and isinstance(side.get("peft_type"), str):
            return peft_defaults(side["peft_type"])
    return training_defaults() if key == "training" else {}


@dataclass
class SettingsComparison:
    """What differs between recorded settings and this run's: `differences` (setting, recorded, now) shape the
    numbers; `versions` (library, recorded, now) are provenance."""

    differences: list[tuple[str, Any, Any]] = field(default_factory=list)
    versions: list[tuple[str, Any, Any]] = field(default_factory=list)

    def describe(self, limit: int = 5, recorded: str = "was", now: str = "now") -> str:
        """The first `limit` differences, as "`a.b` was X, now Y; ..." (with a count of the rest)."""
        listed = "; ".join(f"`{k}` {recorded} {a!r}, {now} {b!r}" for k, a, b in self.differences[:limit])
        more = f" (and {len(self.differences) - limit} more)" if len(self.differences) > limit else ""
        return listed + more

    def version_note(self, made: str = "made with") -> str:
        """ "made with peft 0.21.2, running 0.22.0" for every version that differs; empty when none does."""
        if not self.versions:
            return ""
        was = ", ".join(f"{lib} {a if a is not None else 'none'}" for lib, a, _ in self.versions)
        now = ", ".join(f"{lib} {b if b is not None else 'none'}" for lib, _, b in self.versions)
        return f"{made} {was}, running {now}"


def canonical_training(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A training config's settings in canonical form: renamed fields under their new names (`RENAMED_FIELDS`) and
    the anchor schedule under one spelling (`canonical_schedule`)."""
    settings = dict(settings)
    for old_name, new_name in RENAMED_FIELDS.items():
        if old_name in settings:
            settings.setdefault(new_name, settings.pop(old_name))
    return canonical_schedule(settings)


def canonical_schedule(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A training config's anchor schedule under one spelling: `adaptive` with `nca_adaptive_init=0` is the gated
    anchor, `gated` (the schedule the default was named in the registry after it ran as `adaptive`), which reads no
    `nca_adaptive_init` (so the field is left out)."""
    settings = dict(settings)
    init = settings.get("nca_adaptive_init", training_defaults().get("nca_adaptive_init"))
    if settings.get("nca_beta_schedule") == "adaptive" and isinstance(init, (int, float)) and init == 0:
        settings["nca_beta_schedule"] = "gated"
    if settings.get("nca_beta_schedule") == "gated":
        settings.pop("nca_adaptive_init", None)
    return settings


def compare_settings(old: Mapping[str, Any], new: Mapping[str, Any], kind: str = "") -> SettingsComparison:
    """Recorded settings `old` against this run's `new`, nested objects flattened as `a.b` (see the module's
    docstring for what counts as a difference and what as provenance). `kind` names what the two are when that is
    not a key above them: `training` for a training config's fields (compared in canonical form, `canonical_training`)."""
    result = SettingsComparison()
    old, new = canonical(dict(old)), canonical(dict(new))
    if kind == "training":
        old, new = canonical_training(old), canonical_training(new)
    _compare(old, new, "", _defaults_of(kind, old, new), result)
    result.versions = sorted(set(result.versions), key=lambda v: str(v[0]))
    return result


def _compare(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str, defaults, result) -> None:
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key, MISSING), new.get(key, MISSING)
        if key == VERSIONS_KEY and (isinstance(a, Mapping) or isinstance(b, Mapping)):
            a, b = a if isinstance(a, Mapping) else {}, b if isinstance(b, Mapping) else {}
            result.versions += [(lib, a.get(lib), b.get(lib)) for lib in set(a) | set(b) if a.get(lib) != b.get(lib)]
            continue
        if is_version_key(str(key)):
            if a != b:
                library = str(key)[: -len("_version")] if str(key).endswith("_version") else prefix.rstrip(".")
                result.versions.append((library or str(key), None if a == MISSING else a, None if b == MISSING else b))
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            if key == "training":
                a, b = canonical_training(a), canonical_training(b)
            _compare(a, b, f"{prefix}{key}.", _defaults_of(str(key), a, b), result)
        elif a == MISSING or b == MISSING:
            value = b if a == MISSING else a
            known = key in defaults
            if (known and jsonable(value) == defaults[key]) or (not known and _unset(value)):
                continue
            result.differences.append((f"{prefix}{key}", a, b))
        elif a != b:
            result.differences.append((f"{prefix}{key}", a, b))
