"""What a training run prints, from the Trainer's callbacks: one named progress bar, one compact line per training log
(named for its student when several run at once: `trl_nca.console.speaking_for`), and a training estimate from this
run's own first steps. What prints apart from a Trainer (opening and closing lines, durations, the log level) is
`trl_nca.console`.

Printing only: nothing here changes what a run computes or records. `trainer.state.log_history`, `trainer_state.json`
and the `report_to` integrations get every logged value as before; only the text on the terminal is shorter. The
full dicts come back with `TRL_NCA_VERBOSE=1` (what `--verbose` of every `trl-nca` command sets).

`explain_training(trainer)` installs it on a `transformers.Trainer` (`NCATrainer` and `NCADistillationTrainer` call
it, so the example scripts print the same way). It keeps TRL's `disable_tqdm` meaning: with `disable_tqdm=True` the
trainer has no bar, and each log is printed as one line (`PrinterCallback`'s place); otherwise the log lines are
written above the bar (`ProgressCallback`'s place). A notebook's progress callback is left as it is.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from transformers.trainer_callback import PrinterCallback, ProgressCallback, TrainerCallback

from ..console import duration, format_number, named, plural, progress_bar, say, set_training, shows, verbose


ESTIMATE_STEPS = 2  # the training estimate is printed after this many steps, from the last one's time


# (logged key, printed name) of a training step's compact line, in this order
STEP_TERMS = (
    ("loss", "loss"),
    ("opd_loss", "opd"),
    ("nca_loss", "nca"),
    ("nca_beta", "beta"),
    ("learning_rate", "lr"),
)
TRACK_KEYS = ("paired/n", "paired/n_correct_x", "paired/n_correct_xc", "paired/harm_count", "paired/help_count")


def _rate(count: float, of: float) -> str:
    """A rate in % with its count, as the tables print it: `16.7% (8/48)`; `n/a (0/0)` with nothing to divide by."""
    counted = f"({format_number(count)}/{format_number(of)})"
    return f"{100 * count / of:.1f}% {counted}" if of else f"n/a {counted}"


def track_terms(logs: Mapping[str, Any]) -> list[str]:
    """A tracking evaluation's rates, each in % with its count (the counts are expected counts, fractional, with
    several samples per view): `Acc_x 0.0% (0/48)  Acc_xc 16.7% (8/48)  Harm n/a (0/0)  Help 16.7% (8/48)`."""
    n, right_x = logs["paired/n"], logs["paired/n_correct_x"]
    return [
        f"Acc_x {_rate(right_x, n)}",
        f"Acc_xc {_rate(logs['paired/n_correct_xc'], n)}",
        f"Harm {_rate(logs['paired/harm_count'], right_x)}",
        f"Help {_rate(logs['paired/help_count'], n - right_x)}",
    ]


def compact_log_line(logs: Mapping[str, Any], step: int, max_steps: int, seconds_per_step: float | None) -> str:
    """One line of a training log dict: `step 3/30  loss 0.41  opd 0.4  nca 0.01  beta 0.05  lr 0.001  3.2 s/step`
    for a training step, `track step 10/40  Acc_x 50.0% (16/32) ...` for a paired tracking evaluation (`track_terms`:
    the tables' rates and counts), `eval
    step ...` for an evaluation, and the closing summary of `Trainer.train` in words. A log of other keys is printed
    as `name value` pairs."""
    where = f"step {step}/{max_steps}"
    if "train_runtime" in logs:
        rate = f" ({format_number(logs['train_runtime'] / step)} s/step)" if step else ""
        loss = f", mean loss {format_number(logs['train_loss'])}" if "train_loss" in logs else ""
        return f"trained to step {step}/{max_steps} in {duration(logs['train_runtime'])}{rate}{loss}"
    if all(key in logs for key in TRACK_KEYS):
        return "  ".join([f"track {where}", *track_terms(logs)])
    if any(key.startswith("eval_") for key in logs):
        terms = [
            (key, value)
            for key, value in logs.items()
            if key.startswith("eval_") and "runtime" not in key and "per_second" not in key
        ]
        return "  ".join([f"eval {where}", *(f"{key} {format_number(value)}" for key, value in terms)])
    if "loss" in logs:
        terms = [(name, logs[key]) for key, name in STEP_TERMS if key in logs]
        if logs.get("nca/stall"):
            terms.append(("stall", "on"))
        parts = [where, *(f"{name} {format_number(value)}" for name, value in terms)]
        if seconds_per_step is not None:
            parts.append(f"{format_number(seconds_per_step)} s/step")
        return "  ".join(parts)
    shown = [(key, value) for key, value in logs.items() if key not in ("epoch", "total_flos")]
    return "  ".join([where, *(f"{key} {format_number(value)}" for key, value in shown)])


class _StepClock:
    """Seconds per optimizer step between two logs (the first log: since the run began)."""

    def __init__(self):
        self.time, self.step = None, 0

    def begin(self, state) -> None:
        self.time, self.step = time.perf_counter(), state.global_step

    def lap(self, state) -> float | None:
        if self.time is None or state.global_step <= self.step:
            return None
        now = time.perf_counter()
        rate = (now - self.time) / (state.global_step - self.step)
        self.time, self.step = now, state.global_step
        return rate


class PhaseProgressCallback(ProgressCallback):
    """Transformers' progress bar, named for its phase (`training opd/seed0`), with each log written above it as one
    compact line (`compact_log_line`; the full dict when `verbose()`)."""

    def __init__(self, phase: str = "training", max_str_len: int = 100):
        super().__init__(max_str_len=max_str_len)
        self.phase, self.clock = phase, _StepClock()

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:  # the base class's bar, with the phase's name from its first draw
            self.training_bar = progress_bar(state.max_steps, self.phase, "step")
        self.current_step = 0
        self.clock.begin(state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if verbose():
            return super().on_log(args, state, control, logs=logs, **kwargs)
        if state.is_world_process_zero and self.training_bar is not None:
            rate = self.clock.lap(state) if "loss" in logs and "train_runtime" not in logs else None
            line = compact_log_line(logs, state.global_step, state.max_steps, rate)
            if shows("steps"):  # a comparison says when each student ends (JobEstimate)
                self.training_bar.write(named(line))


class CompactPrinterCallback(PrinterCallback):
    """`PrinterCallback` (the trainer's printer under `disable_tqdm=True`), printing each log as one compact line
    (`compact_log_line`; the full dict when `verbose()`)."""

    def __init__(self):
        self.clock = _StepClock()

    def on_train_begin(self, args, state, control, **kwargs):
        self.clock.begin(state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if verbose():
            return super().on_log(args, state, control, logs=logs, **kwargs)
        _ = logs.pop("total_flos", None)  # as PrinterCallback does, so later callbacks see the same logs
        if state.is_local_process_zero:
            rate = self.clock.lap(state) if "loss" in logs and "train_runtime" not in logs else None
            line = compact_log_line(logs, state.global_step, state.max_steps, rate)
            if shows("steps"):  # a comparison says when each student ends (JobEstimate)
                print(named(line), flush=True)


def training_estimate_line(
    phase: str, first: float, second: float, steps_left: int, max_steps: int, tracks: tuple[int, float] | None
) -> str:
    """The estimate a training run prints after its second step: the second step's measured time (the first holds
    one-time warm-up costs, so it is shown but not extrapolated) times the steps left, plus `tracks` = (evaluations
    left, seconds each) of a tracking callback. Measured on this machine in this run."""
    more, also = second * steps_left, ""
    if tracks is not None and tracks[0] > 0:
        more += tracks[0] * tracks[1]
        also = f" and {plural(tracks[0], 'tracking evaluation')} of {tracks[1]:.1f} s"
    return (
        f"{phase[:1].upper() + phase[1:]}: the first step took {first:.1f} s (with one-time warm-up), the second "
        f"{second:.2f} s, so about {duration(more)} more for the {steps_left} steps left of {max_steps}{also} "
        "(the second step's rate, measured in this run; not a bound)."
    )


class TrainingEstimate(TrainerCallback):
    """Times the first two optimizer steps of a run and prints the training estimate (`training_estimate_line`) once,
    after the second. A tracking callback (one with `eval_steps` and `eval_on_start`, such as
    `trl_nca.eval.PairedEvalCallback`) adds its evaluations: the one before the first step is timed (from the start of
    training to this callback's own start, it being the last in the list) and counted once per evaluation left; one
    that ends the second step is taken out of that step's time. A run with no steps left after the second prints
    none: its end is as near as the estimate."""

    def __init__(self, handler=None, phase: str = "training"):
        self.handler, self.phase = handler, phase
        self.begun, self.start_time, self.start_step, self.laps, self.line = None, None, 0, [], None

    def _tracker(self):
        callbacks = [] if self.handler is None else self.handler.callbacks
        found = [cb for cb in callbacks if getattr(cb, "eval_steps", 0) > 0 and hasattr(cb, "eval_on_start")]
        return found[0] if found else None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start_time, self.start_step, self.laps, self.line = time.perf_counter(), state.global_step, [], None

    def on_step_end(self, args, state, control, **kwargs):
        if self.line is not None or self.start_time is None or len(self.laps) >= ESTIMATE_STEPS:
            return
        self.laps.append(time.perf_counter())
        left = state.max_steps - state.global_step
        if len(self.laps) < ESTIMATE_STEPS or left <= 0:
            return
        first, second = self.laps[0] - self.start_time, self.laps[1] - self.laps[0]
        tracks, tracker = None, self._tracker()
        if tracker is not None and tracker.eval_on_start and self.begun is not None:
            each = self.start_time - self.begun  # the evaluation before the first step
            if state.global_step % tracker.eval_steps == 0:  # the second step ended with one
                second = max(second - each, 0.0)
            later = state.max_steps // tracker.eval_steps - state.global_step // tracker.eval_steps
            tracks = (later, each)
        self.line = training_estimate_line(self.phase, first, second, left, state.max_steps, tracks)
        if state.is_world_process_zero:
            say(self.line, level="units")


class _TrainBegins(TrainerCallback):
    """First in the callback list: when training begins, before any other callback's start (a tracking evaluation)."""

    def __init__(self, estimate: TrainingEstimate):
        self.estimate = estimate

    def on_train_begin(self, args, state, control, **kwargs):
        self.estimate.begun = time.perf_counter()
        set_training(True)  # the tracking evaluations' lines are step lines (`trl_nca.console.progress_level`)

    def on_train_end(self, args, state, control, **kwargs):
        set_training(False)


def explain_training(trainer, phase: str | None = None) -> None:
    """Install this module's printing on `trainer` (idempotent): the named bar or the compact printer in place of
    transformers' own (same position in the callback list), and the training estimate. `phase` names the bar and the
    estimate (default "training")."""
    callbacks = trainer.callback_handler.callbacks
    for index, callback in enumerate(callbacks):
        if type(callback) is ProgressCallback:
            callbacks[index] = PhaseProgressCallback(max_str_len=callback.max_str_len)
        elif type(callback) is PrinterCallback:
            callbacks[index] = CompactPrinterCallback()
    if not any(isinstance(callback, TrainingEstimate) for callback in callbacks):
        estimate = TrainingEstimate(trainer.callback_handler)
        callbacks.insert(0, _TrainBegins(estimate))
        trainer.add_callback(estimate)
    if phase is not None:
        for callback in callbacks:
            if isinstance(callback, (PhaseProgressCallback, TrainingEstimate)):
                callback.phase = phase
