"""The per-item record of a paired evaluation: one test item run once without and once with the context."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ViewOutcome:
    """What one view (no context `x`, or context `xc`) produced for one item."""

    completion: str
    answer: str | None
    correct: bool
    num_tokens: int
    truncated: bool
    format_failure: bool
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PairedRecord:
    """One item: its id, the two view outcomes, and item-level metadata (seed, subject, game stats, ...)."""

    item_id: str
    x: ViewOutcome
    xc: ViewOutcome
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PairedRecord:
        return cls(
            item_id=str(data["item_id"]),
            x=ViewOutcome(**data["x"]),
            xc=ViewOutcome(**data["xc"]),
            meta=dict(data.get("meta", {})),
        )
