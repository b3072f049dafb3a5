"""A stall signal for anchored runs: the no-context view has stopped short of the teacher while the anchor holds the
two views together (docs/results.md section 10).

A stalled run neither internalises the context nor keeps it: the anchor pulls the context view onto a no-context view
that has not learnt what the context teaches, so the two views agree (`view_kl` small) while both stay far from the
teacher (`opd_loss` high). A run that internalises drives `opd_loss` towards 0; a stalled one ends with a large part of
its initial gap left. From the step means of `opd_loss` and `view_kl` (the values the trainer already logs), over
trailing windows of `STALL_WINDOW` optimizer steps:

    gap_left   = mean opd_loss of the last window / mean opd_loss of the first window
    view_share = mean view_kl of the last window / mean opd_loss of the last window
    stall      = gap_left > STALL_GAP_LEFT and view_share < STALL_VIEW_SHARE      (once two windows are done)

Early in every anchored run `stall` is 1 (the views agree before the no-context view has learnt); a run that
internalises turns it to 0, a stalled one ends with it at 1, and the trainer warns once at the end of training. The
signal is a recording: it never changes a step. Its thresholds were read off the runs of docs/results.md sections 8
and 9; section 10.4 gives how well it separates stalled runs from the others, docs/configuration.md ("When the anchor
stalls") how often a run stalls and what to change.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any


STALL_WINDOW = 10  # optimizer steps in each window
STALL_GAP_LEFT = 0.05  # the share of the initial OPD gap above which the no-context view has not arrived
STALL_VIEW_SHARE = 0.1  # view_kl below this share of opd_loss: the anchor holds the two views together
STATE_FILE = "nca_stall.json"


class StallMonitor:
    """The stall signal of one run, updated once per optimizer step with that step's token means (`update`)."""

    def __init__(self, window: int = STALL_WINDOW):
        self.window = window
        self.first: list[float] = []  # opd_loss of the first `window` steps
        self.recent: deque[tuple[float, float]] = deque(maxlen=window)  # (opd_loss, view_kl) of the last steps
        self.steps = 0
        self.last: dict[str, float] | None = None

    def update(self, opd_loss: float, view_kl: float) -> dict[str, float]:
        """Add one step's means; returns the values to log (`nca/gap_left`, `nca/view_share` once the first window
        is done, and `nca/stall`)."""
        self.steps += 1
        if len(self.first) < self.window:
            self.first.append(opd_loss)
        self.recent.append((opd_loss, view_kl))
        if len(self.first) < self.window:
            return {"nca/stall": 0.0}
        opd = sum(o for o, _ in self.recent) / len(self.recent)
        kl = sum(v for _, v in self.recent) / len(self.recent)
        start = sum(self.first) / len(self.first)
        gap_left = opd / start if start > 0 else 0.0
        view_share = kl / opd if opd > 0 else math.inf
        stalled = self.steps >= 2 * self.window and gap_left > STALL_GAP_LEFT and view_share < STALL_VIEW_SHARE
        self.last = {"nca/gap_left": gap_left, "nca/view_share": view_share, "nca/stall": float(stalled)}
        return self.last

    @property
    def stalled(self) -> bool:
        """Whether the last step was flagged."""
        return bool(self.last and self.last["nca/stall"])

    def message(self) -> str:
        """The warning of a run that ends stalled (`stalled`)."""
        last = self.last or {}
        return (
            f"Training ended stalled: opd_loss over the last {self.window} steps is "
            f"{100 * last.get('nca/gap_left', 0):.1f}% of its first {self.window} steps' while view_kl is "
            f"{100 * last.get('nca/view_share', 0):.1f}% of opd_loss, so the anchor holds the context view on a "
            "no-context view that has not learnt the context. Evaluate Acc_x; docs/configuration.md (When the anchor "
            "stalls) says what to change."
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "first": list(self.first),
            "recent": [list(r) for r in self.recent],
            "steps": self.steps,
            "last": self.last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.window = int(state["window"])
        self.first = [float(v) for v in state["first"]]
        self.recent = deque((tuple(map(float, r)) for r in state["recent"]), maxlen=self.window)
        self.steps = int(state["steps"])
        self.last = state["last"]
