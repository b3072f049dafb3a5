"""Schedules of the anchor weight `nca_beta`, set once per optimizer step.

- `constant`: the paper's method, `nca_beta` from the first step to the last.
- `warmup`: `nca_beta * min(1, s / nca_warmup_steps)` during optimizer step s + 1 (s steps done), so the anchor is
  off at the first step and full after the warm-up.
- `adaptive` (beyond the paper): a bounded multiplicative controller in the manner of the adaptive KL controller of
  RLHF (Ziegler et al., 2019). After each step it compares the measured gap between the student's two views with the
  gap between the no-context view and the teacher:

      ratio = view_kl / (target * opd_loss)        (token means of the step just done)
      e     = clip(ratio - 1, -0.2, 0.2)
      beta  = clip(beta * (1 + e / horizon), nca_adaptive_min, nca_beta)

  In self-distillation the context view starts equal to the teacher, so ratio = 1 at the first step. While the
  no-context view is still learning what the context teaches, pulling the context view towards it would drag the
  context view away from the teacher (ratio < 1 then means the views have moved towards each other faster than the
  no-context view has moved towards the teacher): the anchor relaxes. Once the no-context view has caught up with the
  teacher and the context view has drifted away from it (ratio > 1: the context view is farther from the no-context
  view than the teacher is), the anchor grows, up to `nca_beta`. So the anchor follows internalisation instead of
  fighting it. `target` > 1 tolerates more drift; `horizon` > 1 makes the updates smaller. With
  `nca_adaptive_init=0` the anchor starts off and stays off until the first step with ratio > target, then starts
  at `nca_adaptive_min`: the forward-KL anchor's gradient does not vanish when the two views disagree confidently
  (the reverse-KL OPD gradient does), so even a small weight can move the context view early in training.

Every schedule keeps its state in `state_dict()` (saved in each checkpoint as `nca_schedule.json`) so a resumed run
continues with exactly the weights the uninterrupted run would have used.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


SCHEDULES = ("constant", "warmup", "adaptive")
# The default anchor: the gated one (`adaptive` off until the views drift apart), chosen in docs/results.md section 10.
DEFAULT_SCHEDULE = "adaptive"
ADAPTIVE_INIT = 0.0
ADAPTIVE_MIN = 0.05
ADAPTIVE_TARGET = 1.1
ADAPTIVE_STEP_LIMIT = 0.2  # the largest relative change of one update (before dividing by the horizon)
STATE_FILE = "nca_schedule.json"
# The config fields a schedule reads (`schedule_from_config`), besides `nca_beta`, and the schedules that read each.
SCHEDULE_READS = {
    "nca_beta_schedule": SCHEDULES,
    "nca_warmup_steps": ("warmup",),
    "nca_adaptive_init": ("adaptive",),
    "nca_adaptive_min": ("adaptive",),
    "nca_adaptive_target": ("adaptive",),
    "nca_adaptive_horizon": ("adaptive",),
}
SCHEDULE_FIELDS = tuple(SCHEDULE_READS)


@dataclass
class BetaSchedule:
    """The anchor weight of the current optimizer step and how it evolves.

    `kind` is one of `SCHEDULES`; `beta` is the constant value, the value after warm-up, or the adaptive upper bound.
    """

    kind: str = "constant"
    beta: float = 0.5
    warmup_steps: int = 0
    adaptive_init: float = ADAPTIVE_INIT
    adaptive_min: float = ADAPTIVE_MIN
    adaptive_target: float = ADAPTIVE_TARGET
    adaptive_horizon: float = 1.0
    steps_done: int = 0
    current: float | None = None

    def __post_init__(self):
        if self.kind not in SCHEDULES:
            raise ValueError(f"nca_beta_schedule must be one of {SCHEDULES}, got {self.kind!r}.")
        if self.kind == "warmup" and self.warmup_steps < 1:
            raise ValueError("nca_beta_schedule='warmup' needs nca_warmup_steps >= 1 (steps to reach nca_beta).")
        if self.kind == "adaptive":
            if self.beta <= 0:
                raise ValueError("nca_beta_schedule='adaptive' needs nca_beta > 0: it is the anchor's upper bound.")
            if not (0 < self.adaptive_min <= self.beta and 0 <= self.adaptive_init <= self.beta) or (
                0 < self.adaptive_init < self.adaptive_min
            ):
                raise ValueError(
                    "The adaptive anchor needs 0 < nca_adaptive_min <= nca_beta and nca_adaptive_init either 0 (off until "
                    "the views drift apart) or in [nca_adaptive_min, nca_beta], got "
                    f"min={self.adaptive_min}, init={self.adaptive_init}, nca_beta={self.beta}."
                )
            if not (0 < self.adaptive_target < math.inf and 0 < self.adaptive_horizon < math.inf):
                raise ValueError(
                    "nca_adaptive_target and nca_adaptive_horizon must be finite and > 0, got "
                    f"target={self.adaptive_target}, horizon={self.adaptive_horizon}."
                )
        if self.current is None:
            self.current = self._initial()

    def _initial(self) -> float:
        if self.kind == "adaptive":
            return float(self.adaptive_init)
        if self.kind == "warmup":
            return 0.0
        return float(self.beta)

    @property
    def active(self) -> bool:
        """Whether the NCA term can be on at some step (the trainer then computes the context view every step)."""
        return self.beta > 0

    @property
    def needs_measurements(self) -> bool:
        """Whether `update` reads the step's measured terms (then `view_kl` must be computed every step)."""
        return self.kind == "adaptive"

    @property
    def value(self) -> float:
        """The anchor weight of the optimizer step in progress."""
        return float(self.current)

    def update(self, measured: dict[str, float] | None = None, steps_done: int | None = None) -> float:
        """Advance by one finished optimizer step and return the weight of the next one.

        `measured` holds the step's token means `opd_loss` and `view_kl` (needed by the adaptive schedule only).
        `steps_done` is the trainer's count of optimizer steps done, this one included (`state.global_step`); by
        default the schedule counts one more.
        """
        self.steps_done = self.steps_done + 1 if steps_done is None else int(steps_done)
        if self.kind == "warmup":
            self.current = self.beta * min(1.0, self.steps_done / self.warmup_steps)
        elif self.kind == "adaptive":
            if measured is None or "view_kl" not in measured or "opd_loss" not in measured:
                raise ValueError("The adaptive anchor needs the step's opd_loss and view_kl.")
            ratio = measured["view_kl"] / max(self.adaptive_target * measured["opd_loss"], 1e-12)
            error = min(max(ratio - 1.0, -ADAPTIVE_STEP_LIMIT), ADAPTIVE_STEP_LIMIT)
            if not math.isfinite(error):  # a non-finite measurement leaves the weight unchanged
                error = 0.0
            if self.current == 0.0:  # off (nca_adaptive_init=0) until the context view drifts: then switch on
                self.current = self.adaptive_min if error > 0 else 0.0
            else:
                updated = self.current * (1.0 + error / self.adaptive_horizon)
                self.current = min(max(updated, self.adaptive_min), self.beta)
        return self.value

    def never_on(self, views_equal_teacher: bool) -> str | None:
        """Why this schedule can never turn the anchor on, or None. `views_equal_teacher`: the teacher is the student's
        own context view under the OPD divergence of `view_kl` (a live self-teacher with reverse-KL OPD), so that
        `view_kl` equals `opd_loss` at every step and the gated anchor's ratio is exactly 1."""
        gated = self.kind == "adaptive" and self.adaptive_init == 0 and self.beta > 0
        if gated and views_equal_teacher and self.adaptive_target >= 1:
            return (
                f"nca_beta_schedule='adaptive' with nca_adaptive_init=0 can never turn the anchor on here: with "
                "self_teacher='live' and reverse-KL OPD the teacher is the student's own context view, so view_kl equals "
                f"opd_loss at every step and the gate (view_kl > nca_adaptive_target x opd_loss, target "
                f"{self.adaptive_target}) never opens. Set nca_adaptive_init > 0, nca_adaptive_target < 1 or "
                "self_teacher='initial'."
            )
        return None

    def describe(self) -> str:
        """One sentence on how this schedule weighed the anchor, for a model card."""
        if self.beta == 0:
            return "The anchor was off (`nca_beta=0`): plain on-policy context distillation (OPD)."
        if self.kind == "constant":
            return f"The anchor was the paper's constant one: `nca_beta={self.beta:g}` at every optimizer step."
        if self.kind == "warmup":
            return (
                f"The anchor warmed up linearly from 0 to `nca_beta={self.beta:g}` over {self.warmup_steps} optimizer "
                "steps (beyond the paper, whose anchor is constant)."
            )
        start = (
            f"was off until the student's two views drifted apart (`view_kl` above {self.adaptive_target:g} x "
            f"`opd_loss`), then started at {self.adaptive_min:g}"
            if self.adaptive_init == 0
            else f"started at {self.adaptive_init:g}"
        )
        name = "trl-nca's default gated anchor" if self.adaptive_init == 0 else "an adaptive anchor"
        return (
            f"The anchor was {name} (beyond the paper): it {start} and followed the views' gap, within "
            f"[{self.adaptive_min:g}, {self.beta:g}] (`nca_beta_schedule='adaptive'`; docs/results.md section 10 of "
            "trl-nca). The paper's anchor is constant (`nca_beta_schedule='constant'`)."
        )

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "steps_done": self.steps_done, "current": self.current}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.kind:
            raise ValueError(
                f"The checkpoint's anchor schedule is {state.get('kind')!r} but this run's is {self.kind!r}; resume "
                "with the same nca_beta_schedule."
            )
        self.steps_done = int(state["steps_done"])
        self.current = float(state["current"])


def schedule_from_config(args, kind: str | None = None) -> BetaSchedule:
    """The schedule an `NCAConfig` describes (`kind` overrides its `nca_beta_schedule`). With `nca_beta=0` (plain OPD)
    there is no anchor to schedule: the weight is 0 at every step, whatever the schedule settings."""
    kind = args.nca_beta_schedule if kind is None else kind
    return BetaSchedule(
        kind="constant" if float(args.nca_beta) == 0 else kind,
        beta=float(args.nca_beta),
        warmup_steps=int(args.nca_warmup_steps),
        adaptive_init=float(args.nca_adaptive_init),
        adaptive_min=float(args.nca_adaptive_min),
        adaptive_target=float(args.nca_adaptive_target),
        adaptive_horizon=float(args.nca_adaptive_horizon),
    )


def schedule_left_at_default(args) -> bool:
    """Whether every schedule field of the config dataclass `args` (`SCHEDULE_FIELDS`) has its default value."""
    defaults = {f.name: f.default for f in dataclasses.fields(args)}
    return all(getattr(args, name) == defaults.get(name) for name in SCHEDULE_FIELDS)
