"""Schedules of the anchor weight `nca_beta`, set once per optimizer step.

- `constant`: the paper's method, `nca_beta` from the first step to the last.
- `warmup`: `nca_beta * min(1, s / nca_warmup_steps)` during optimizer step s + 1 (s steps done), so the anchor is
  off at the first step and full after the warm-up.
- `gated` (beyond the paper; the default): `adaptive` below, off until the views drift apart (`nca_adaptive_init=0`).
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
  fighting it. `target` > 1 tolerates more drift; `horizon` > 1 makes the updates smaller. Gated (`gated`, or
  `adaptive` with `nca_adaptive_init=0`: the same schedule, `recipes.identity` reads both as `gated`), the anchor
  starts off and stays off until the first step with ratio > target, then starts at `nca_adaptive_min`: the
  forward-KL anchor's gradient does not vanish when the two views disagree confidently (the reverse-KL OPD gradient
  does), so even a small weight can move the context view early in training.

Every schedule keeps its state in `state_dict()` (saved in each checkpoint as `nca_schedule.json`) so a resumed run
continues with exactly the weights the uninterrupted run would have used.

Each schedule is a small class, registered under its `kind` in `SCHEDULES` (`register_schedule`): it declares the
config fields it reads (`reads`; the field `nca_<name>` fills the class's field `<name>`), checks them, gives the weight
of each step and says in one sentence what the run did (`describe`, for the model card). The config's choices, its
warnings about fields the run's schedule does not read and the docs come from the registry (docs/extending.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar


# The default anchor: the gated one (off until the views drift apart), chosen in docs/results.md section 10.
DEFAULT_SCHEDULE = "gated"
ADAPTIVE_INIT = 0.0
ADAPTIVE_MIN = 0.05
ADAPTIVE_TARGET = 1.1
ADAPTIVE_STEP_LIMIT = 0.2  # the largest relative change of one update (before dividing by the horizon)
# The step means the adaptive anchor reads are float32 (float64 only for a float64 student): a view_kl is at most
# 3.4e38 and a positive opd_loss at least 1.4e-45, so above their ratio no step can have view_kl > target x opd_loss
# (but one whose opd_loss is exactly 0, where the student already equals the teacher on every token).
FLOAT32_TINY = 1.401298464324817e-45  # the smallest positive float32
ADAPTIVE_TARGET_MAX = 3.4028234663852886e38 / FLOAT32_TINY
# A view_kl, a KL between two softmax distributions, is at most the spread of the context view's logits plus the log of
# the vocabulary size: some hundreds of nats per token for a trained model. Above this target even the smallest positive
# opd_loss asks a step for a view_kl over VIEW_KL_PLAUSIBLE, so the gate opens at no plausible step (a warning).
VIEW_KL_PLAUSIBLE = 1e4
ADAPTIVE_TARGET_PLAUSIBLE = VIEW_KL_PLAUSIBLE / FLOAT32_TINY
STATE_FILE = "nca_schedule.json"


@dataclass
class BetaSchedule:
    """The anchor weight of the current optimizer step and how it evolves: the base of the registered schedules.

    `beta` is `nca_beta` (the constant value, the value after warm-up or the adaptive upper bound). A subclass sets
    `kind` (its `nca_beta_schedule` name), `reads` (the config fields it reads besides `nca_beta`, each `nca_<name>`
    for its dataclass field `<name>`), `summary` (its sentence in the config's help) and overrides what differs:
    `check`, `initial`, `next_value`, `describe` and, where they apply, `cannot_act` and `never_on`.
    """

    kind: ClassVar[str] = ""
    reads: ClassVar[tuple[str, ...]] = ()
    summary: ClassVar[str] = ""
    # Whether `update` reads the step's measured terms (then `view_kl` must be computed every step).
    needs_measurements: ClassVar[bool] = False

    beta: float = 0.5
    steps_done: int = field(default=0, init=False)
    current: float = field(default=0.0, init=False)

    def __post_init__(self):
        self.check()
        self.current = self.initial()

    @classmethod
    def from_config(cls, args) -> BetaSchedule:
        """The schedule of a config with the NCA fields: `nca_beta` and the fields of `reads`, each converted to the
        type of the class field's default."""
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        settings = {}
        for name in cls.reads:
            attribute = name.removeprefix("nca_")
            settings[attribute] = type(defaults[attribute])(getattr(args, name))
        return cls(beta=float(args.nca_beta), **settings)

    def check(self) -> None:
        """Refuse settings this schedule cannot run with (a ValueError naming the field and the fix)."""

    def initial(self) -> float:
        """The weight of the first optimizer step."""
        return float(self.beta)

    def next_value(self, measured: dict[str, float] | None) -> float:
        """The weight of the next optimizer step, once `steps_done` counts the step just finished (whose measured
        token means are `measured`)."""
        return self.value

    @property
    def active(self) -> bool:
        """Whether the NCA term can be on at some step (the trainer then computes the context view every step)."""
        return self.beta > 0

    @property
    def value(self) -> float:
        """The anchor weight of the optimizer step in progress."""
        return float(self.current)

    def update(self, measured: dict[str, float] | None = None, steps_done: int | None = None) -> float:
        """Advance by one finished optimizer step and return the weight of the next one.

        `measured` holds the step's token means `opd_loss` and `view_kl` (read where `needs_measurements`).
        `steps_done` is the trainer's count of optimizer steps done, this one included (`state.global_step`); by
        default the schedule counts one more.
        """
        self.steps_done = self.steps_done + 1 if steps_done is None else int(steps_done)
        self.current = self.next_value(measured)
        return self.value

    def cannot_act(self, max_steps: int, length: str | None = None) -> list[str]:
        """One line per setting that cannot act within a run of `max_steps` optimizer steps (`length` says how the
        run's length was set, by default `max_steps=N`), each naming the field and the fix; a line that depends on the
        length only when it is known (`max_steps > 0`). Warnings: the run is still valid."""
        return []

    def never_on(self, views_equal_teacher: bool) -> str | None:
        """Why this schedule can never turn the anchor on, or None. `views_equal_teacher`: the teacher is the student's
        own context view under the OPD divergence of `view_kl` (a live self-teacher with reverse-KL OPD), so that
        `view_kl` equals `opd_loss` at every step."""
        return None

    def describe(self) -> str:
        """One sentence on how this schedule weighed the anchor in the steps done so far, for a model card."""
        return f"The anchor followed the `{self.kind}` schedule with `nca_beta={self.beta:g}` (beyond the paper)."

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


# The anchor schedules by `nca_beta_schedule` name, in the order the docs list them. `register_schedule` adds one.
SCHEDULES: dict[str, type[BetaSchedule]] = {}


def register_schedule(cls: type[BetaSchedule]) -> type[BetaSchedule]:
    """Class decorator: register a `BetaSchedule` subclass under its `kind`. The config accepts the name from then on;
    a name already taken, or a read field the class does not declare, is refused."""
    if not (isinstance(cls, type) and issubclass(cls, BetaSchedule)) or not str(cls.kind).isidentifier():
        raise ValueError(f"A schedule is a BetaSchedule subclass whose `kind` is a Python identifier, got {cls!r}.")
    if cls.kind in SCHEDULES:
        raise ValueError(f"The anchor schedule {cls.kind!r} is already registered; choose another kind.")
    declared = {f.name for f in dataclasses.fields(cls)}
    missing = [n for n in cls.reads if not n.startswith("nca_") or n.removeprefix("nca_") not in declared]
    if missing:
        raise ValueError(f"{cls.__name__} reads {missing} but declares no field for each (nca_<name> fills <name>).")
    SCHEDULES[cls.kind] = cls
    return cls


def schedule_names() -> tuple[str, ...]:
    """The registered schedules, in registration order."""
    return tuple(SCHEDULES)


@register_schedule
@dataclass
class ConstantSchedule(BetaSchedule):
    """`nca_beta` at every optimizer step: the paper's anchor."""

    kind: ClassVar[str] = "constant"
    summary: ClassVar[str] = "`'constant'` is the paper's anchor (`nca_beta` throughout)."

    def describe(self) -> str:
        if self.beta == 0:  # the schedule of every run with nca_beta=0 (`schedule_from_config`)
            return "The anchor was off (`nca_beta=0`): plain on-policy context distillation (OPD)."
        return f"The anchor was the paper's constant one: `nca_beta={self.beta:g}` at every optimizer step."


@register_schedule
@dataclass
class WarmupSchedule(BetaSchedule):
    """`nca_beta * min(1, s / warmup_steps)` during optimizer step s + 1."""

    kind: ClassVar[str] = "warmup"
    reads: ClassVar[tuple[str, ...]] = ("nca_warmup_steps",)
    summary: ClassVar[str] = "`'warmup'` goes from 0 up to `nca_beta` linearly over `nca_warmup_steps`."

    warmup_steps: int = 0

    def check(self) -> None:
        if self.warmup_steps < 1:
            raise ValueError("nca_beta_schedule='warmup' needs nca_warmup_steps >= 1 (steps to reach nca_beta).")

    def initial(self) -> float:
        return 0.0

    def next_value(self, measured=None) -> float:
        return self.beta * min(1.0, self.steps_done / self.warmup_steps)

    def cannot_act(self, max_steps: int, length: str | None = None) -> list[str]:
        if max_steps <= 0 or self.warmup_steps < max_steps:
            return []
        last = self.beta * (max_steps - 1) / self.warmup_steps
        below = "max_steps" if length is None else f"the run's {max_steps} steps"
        return [
            f"nca_warmup_steps={self.warmup_steps} is not shorter than the run ({length or f'max_steps={max_steps}'}): "
            f"the anchor never reaches nca_beta={self.beta:g}, its last step weighs it at {last:g}. Set "
            f"nca_warmup_steps below {below}, or nca_beta_schedule='constant'."
        ]

    def describe(self) -> str:
        if self.steps_done > self.warmup_steps:  # a step ran at the full weight
            return (
                f"The anchor warmed up linearly from 0 to `nca_beta={self.beta:g}` over {self.warmup_steps} optimizer "
                "steps (beyond the paper, whose anchor is constant)."
            )
        last = self.beta * max(self.steps_done - 1, 0) / self.warmup_steps
        ran = (
            "no optimizer step was run"
            if self.steps_done == 0
            else f"the run ended after {self.steps_done} optimizer step{'s' if self.steps_done > 1 else ''}, the last "
            f"weighing the anchor at {last:g}" + (" (it never acted)" if last == 0 else "")
        )
        return (
            f"The anchor was to warm up linearly from 0 to `nca_beta={self.beta:g}` over {self.warmup_steps} optimizer "
            f"steps (beyond the paper, whose anchor is constant), but {ran}."
        )


@register_schedule
@dataclass
class AdaptiveSchedule(BetaSchedule):
    """The bounded multiplicative controller of the module docstring, gated when `adaptive_init=0`."""

    kind: ClassVar[str] = "adaptive"
    reads: ClassVar[tuple[str, ...]] = (
        "nca_adaptive_init",
        "nca_adaptive_min",
        "nca_adaptive_target",
        "nca_adaptive_horizon",
    )
    summary: ClassVar[str] = (
        "`'adaptive'` starts at `nca_adaptive_init` and multiplies the weight after each step by `1 + clip(view_kl / "
        "(nca_adaptive_target * opd_loss) - 1, -0.2, 0.2) / nca_adaptive_horizon`, within `[nca_adaptive_min, "
        "nca_beta]` (see `trl_nca.core.schedule`); with `nca_adaptive_init=0` it is `'gated'`."
    )
    needs_measurements: ClassVar[bool] = True

    adaptive_init: float = ADAPTIVE_INIT
    adaptive_min: float = ADAPTIVE_MIN
    adaptive_target: float = ADAPTIVE_TARGET
    adaptive_horizon: float = 1.0

    def check(self) -> None:
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
        if self.adaptive_target > ADAPTIVE_TARGET_MAX:
            effect = "the gate would never open" if self.adaptive_init == 0 else "the anchor could only fall"
            raise ValueError(
                f"nca_adaptive_target={self.adaptive_target:g} can never be reached: the anchor grows only at a step "
                f"whose view_kl exceeds nca_adaptive_target x opd_loss, and no float32 step mean is above "
                f"{ADAPTIVE_TARGET_MAX:.2g} times another positive one, so {effect}. Set a target near 1 (default "
                f"{ADAPTIVE_TARGET}), or nca_beta=0 for plain OPD (with nca_monitor=True to still log view_kl)."
            )

    def cannot_act(self, max_steps: int, length: str | None = None) -> list[str]:
        if self.adaptive_target <= ADAPTIVE_TARGET_PLAUSIBLE:
            return []
        effect = "the gate most likely never opens" if self.adaptive_init == 0 else "the anchor most likely only falls"
        return [
            f"nca_adaptive_target={self.adaptive_target:g} is out of reach in practice: the anchor grows only at a step "
            "whose view_kl exceeds nca_adaptive_target x opd_loss, which even at the smallest positive float32 "
            f"opd_loss ({FLOAT32_TINY:.2g}) is {self.adaptive_target * FLOAT32_TINY:.2g} nats per token, and a view_kl "
            "is at most the spread of the logits plus log(vocabulary size), some hundreds for a trained model; so "
            f"{effect} (it can only at a step whose opd_loss is exactly 0). Set a target near 1 (default "
            f"{ADAPTIVE_TARGET}), or nca_beta=0 for plain OPD (with nca_monitor=True to still log view_kl)."
        ]

    def initial(self) -> float:
        return float(self.adaptive_init)

    def next_value(self, measured: dict[str, float] | None) -> float:
        if measured is None or "view_kl" not in measured or "opd_loss" not in measured:
            raise ValueError("The adaptive anchor needs the step's opd_loss and view_kl.")
        ratio = measured["view_kl"] / max(self.adaptive_target * measured["opd_loss"], 1e-12)
        error = min(max(ratio - 1.0, -ADAPTIVE_STEP_LIMIT), ADAPTIVE_STEP_LIMIT)
        if not math.isfinite(error):  # a non-finite measurement leaves the weight unchanged
            error = 0.0
        if self.current == 0.0:  # off (nca_adaptive_init=0) until the context view drifts: then switch on
            return self.adaptive_min if error > 0 else 0.0
        updated = self.current * (1.0 + error / self.adaptive_horizon)
        return min(max(updated, self.adaptive_min), self.beta)

    @property
    def gated(self) -> bool:
        return self.adaptive_init == 0 and self.beta > 0

    def never_on(self, views_equal_teacher: bool) -> str | None:
        if self.gated and views_equal_teacher and self.adaptive_target >= 1:
            return (
                f"nca_beta_schedule='{self.kind}'"
                + (" with nca_adaptive_init=0" if self.kind == "adaptive" else "")
                + " can never turn the anchor on here: with "
                "self_teacher='live' and reverse-KL OPD the teacher is the student's own context view, so view_kl equals "
                f"opd_loss at every step and the gate (view_kl > nca_adaptive_target x opd_loss, target "
                f"{self.adaptive_target}) never opens. Set nca_beta_schedule='adaptive' with nca_adaptive_init > 0, "
                "nca_adaptive_target < 1 or self_teacher='initial'."
            )
        return None

    def describe(self) -> str:
        if self.gated and self.steps_done > 0 and self.current == 0.0:  # once open, the weight stays >= the minimum
            return (
                f"The anchor was trl-nca's default gated anchor (beyond the paper; `nca_beta_schedule='{self.kind}'`, "
                f"docs/results.md section 10 of trl-nca), off until the student's two views drifted apart (`view_kl` "
                f"above {self.adaptive_target:g} x `opd_loss`): they never did in the {self.steps_done} optimizer "
                f"step{'s' if self.steps_done > 1 else ''} run, so the anchor never acted and the run was plain "
                "on-policy context distillation (OPD)."
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
            f"[{self.adaptive_min:g}, {self.beta:g}] (`nca_beta_schedule='{self.kind}'`; docs/results.md section 10 of "
            "trl-nca). The paper's anchor is constant (`nca_beta_schedule='constant'`)."
        )


@register_schedule
@dataclass
class GatedSchedule(AdaptiveSchedule):
    """The default anchor: the adaptive controller, off until the student's two views drift apart (its weight starts
    at 0, `adaptive_init` is not read)."""

    kind: ClassVar[str] = "gated"
    reads: ClassVar[tuple[str, ...]] = ("nca_adaptive_min", "nca_adaptive_target", "nca_adaptive_horizon")
    summary: ClassVar[str] = (
        "`'gated'` (the default) keeps the anchor off until the first step whose `view_kl` exceeds "
        "`nca_adaptive_target * opd_loss`, then starts it at `nca_adaptive_min` and follows `'adaptive'` from there."
    )


def schedule_from_config(args, kind: str | None = None) -> BetaSchedule:
    """The schedule an `NCAConfig` describes (`kind` overrides its `nca_beta_schedule`). With `nca_beta=0` (plain OPD)
    there is no anchor to schedule: the weight is 0 at every step, whatever the schedule settings."""
    kind = args.nca_beta_schedule if kind is None else kind
    kind = "constant" if float(args.nca_beta) == 0 else kind
    if kind not in SCHEDULES:
        raise ValueError(f"nca_beta_schedule must be one of {schedule_names()}, got {kind!r}.")
    return SCHEDULES[kind].from_config(args)


def schedule_reads() -> dict[str, tuple[str, ...]]:
    """The config fields a schedule reads (`schedule_from_config`), besides `nca_beta`, and the schedules that read
    each: `nca_beta_schedule` (read by all), then each registered schedule's `reads`."""
    reads: dict[str, tuple[str, ...]] = {"nca_beta_schedule": schedule_names()}
    for kind, cls in SCHEDULES.items():
        for name in cls.reads:
            reads[name] = (*reads.get(name, ()), kind)
    return reads


def schedule_left_at_default(args) -> bool:
    """Whether every schedule field of the config dataclass `args` (`schedule_reads`) has its default value."""
    defaults = {f.name: f.default for f in dataclasses.fields(args)}
    return all(getattr(args, name) == defaults.get(name) for name in schedule_reads())


def unread_settings(args, kinds: Iterable[str] | None = None) -> list[str]:
    """One line per schedule field of the config dataclass `args` set away from its default that no schedule in
    `kinds` reads, naming the field and the fix. `kinds` defaults to the run's own schedule: `nca_beta_schedule`, or
    none with `nca_beta=0` (plain OPD schedules no anchor). A run of several methods passes the schedules of all of
    them, so a field some method reads is not named."""
    if kinds is None:
        kinds = () if float(args.nca_beta) == 0 else (args.nca_beta_schedule,)
    kinds = tuple(kinds)
    defaults = {f.name: f.default for f in dataclasses.fields(args)}
    lines = []
    for name, readers in schedule_reads().items():
        if name == "nca_beta_schedule" or getattr(args, name) == defaults.get(name) or set(readers) & set(kinds):
            continue
        if not kinds:
            why, fix = "nca_beta=0 (plain OPD) schedules no anchor", "nca_beta > 0 and "
        elif len(kinds) == 1:
            why, fix = f"nca_beta_schedule={kinds[0]!r} does not read it", ""
        else:
            why, fix = f"none of the schedules {', '.join(map(repr, kinds))} reads it", ""
        use = " or ".join(f"nca_beta_schedule={kind!r}" for kind in readers)
        lines.append(f"{name}={getattr(args, name)!r} is set but {why}. Remove it, or set {fix}{use} to use it.")
    return lines
