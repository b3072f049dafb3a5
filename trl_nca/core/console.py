"""What a run prints: an opening line, one named progress bar per phase, one compact line per training log, a
training estimate from this run's own first steps, and a closing line with the wall time and the outputs.

Printing only: nothing here changes what a run computes or records. `trainer.state.log_history`, `trainer_state.json`
and the `report_to` integrations get every logged value as before; only the text on the terminal is shorter. The
full dicts come back with `TRL_NCA_VERBOSE=1` (what `--verbose` of every `trl-nca` command sets).

`explain_training(trainer)` installs it on a `transformers.Trainer` (`NCATrainer` and `NCADistillationTrainer` call
it, so the example scripts print the same way). It keeps TRL's `disable_tqdm` meaning: with `disable_tqdm=True` the
trainer has no bar, and each log is printed as one line (`PrinterCallback`'s place); otherwise the log lines are
written above the bar (`ProgressCallback`'s place). A notebook's progress callback is left as it is.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from transformers.trainer_callback import PrinterCallback, ProgressCallback, TrainerCallback


VERBOSE_ENV = "TRL_NCA_VERBOSE"
ESTIMATE_STEPS = 2  # the training estimate is printed after this many steps, from the last one's time


def verbose() -> bool:
    """Whether the full log dicts and the libraries' own progress bars are printed (`TRL_NCA_VERBOSE=1`)."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0", "false", "False")


def take_verbose_flag(argv: list[str]) -> list[str]:
    """`argv` without `--verbose`; when it was there, `TRL_NCA_VERBOSE=1` is set (for this process and any it
    launches)."""
    if "--verbose" not in argv:
        return argv
    os.environ[VERBOSE_ENV] = "1"
    return [arg for arg in argv if arg != "--verbose"]


def on_terminal() -> bool:
    """Whether progress bars are drawn: on a terminal (stderr), or always when `verbose()`. In a log file a bar is
    redrawn at every update and every line written above it (tqdm's own default, `disable=None`, leaves bars out
    there too); the compact lines and the estimates say the progress."""
    return verbose() or sys.stderr.isatty()


def progress_bar(total: int, desc: str, unit: str, enabled: bool = True):
    """A tqdm bar for one phase of a run, named for it; drawn only `on_terminal()`."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, disable=not (enabled and on_terminal()))


def say(text: str) -> None:
    """Print one line on stdout without breaking a progress bar drawn at the time (tqdm's write)."""
    from tqdm.auto import tqdm

    tqdm.write(text, file=sys.stdout)
    sys.stdout.flush()


def quiet_library_bars() -> None:
    """Turn off the bars transformers and datasets draw for each weights load, shard write and dataset map (a
    comparison draws dozens), unless `verbose()`. The run's own phases keep their bars."""
    if verbose():
        return
    import transformers

    transformers.utils.logging.disable_progress_bar()
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a dependency of TRL
        return
    datasets.disable_progress_bars()


def duration(seconds: float) -> str:
    """A duration as a person reads it: 4.2 s, 38 s, 12 min, 3.1 h, 2.0 days."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def closing_line(command: str, seconds: float, outputs: Mapping[str, Any]) -> str:
    """`trl-nca COMMAND: done in 3 min 12 s; model: out/, report: out/report.md` (outputs whose value is None are left
    out)."""
    minutes, secs = divmod(int(round(seconds)), 60)
    took = f"{minutes} min {secs} s" if minutes else f"{seconds:.1f} s"
    written = "; ".join(f"{name}: {path}" for name, path in outputs.items() if path is not None)
    return f"trl-nca {command}: done in {took}" + (f"; {written}" if written else "") + "."


class Stopwatch:
    """The wall time of a command, from its creation."""

    def __init__(self):
        self.start = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e6:
        return str(int(value))
    if value != 0 and abs(value) < 0.01:
        mantissa, exponent = f"{value:.1e}".split("e")
        return f"{mantissa.removesuffix('.0')}e{int(exponent)}"
    return f"{value:.3g}"


# (logged key, printed name) of a training step's compact line, in this order
STEP_TERMS = (
    ("loss", "loss"),
    ("opd_loss", "opd"),
    ("nca_loss", "nca"),
    ("nca_beta", "beta"),
    ("learning_rate", "lr"),
)
TRACK_TERMS = (("paired/acc_x", "acc_x"), ("paired/acc_xc", "acc_xc"), ("paired/harm_count", "harm"),
               ("paired/help_count", "help"), ("paired/n", "items"))  # fmt: skip


def compact_log_line(logs: Mapping[str, Any], step: int, max_steps: int, seconds_per_step: float | None) -> str:
    """One line of a training log dict: `step 3/30  loss 0.41  opd 0.4  nca 0.01  beta 0.05  lr 0.001  3.2 s/step`
    for a training step, `track step 10/40  acc_x 0.5  acc_xc 0.25 ...` for a paired tracking evaluation, `eval
    step ...` for an evaluation, and the closing summary of `Trainer.train` in words. A log of other keys is printed
    as `name value` pairs."""
    where = f"step {step}/{max_steps}"
    if "train_runtime" in logs:
        rate = f" ({_number(logs['train_runtime'] / step)} s/step)" if step else ""
        loss = f", mean loss {_number(logs['train_loss'])}" if "train_loss" in logs else ""
        return f"trained to step {step}/{max_steps} in {duration(logs['train_runtime'])}{rate}{loss}"
    if any(key in logs for key, _ in TRACK_TERMS):
        terms = [(name, logs[key]) for key, name in TRACK_TERMS if key in logs]
        return "  ".join([f"track {where}", *(f"{name} {_number(value)}" for name, value in terms)])
    if any(key.startswith("eval_") for key in logs):
        terms = [(key, value) for key, value in logs.items() if key.startswith("eval_") and "runtime" not in key
                 and "per_second" not in key]  # fmt: skip
        return "  ".join([f"eval {where}", *(f"{key} {_number(value)}" for key, value in terms)])
    if "loss" in logs:
        terms = [(name, logs[key]) for key, name in STEP_TERMS if key in logs]
        if logs.get("nca/stall"):
            terms.append(("stall", "on"))
        parts = [where, *(f"{name} {_number(value)}" for name, value in terms)]
        if seconds_per_step is not None:
            parts.append(f"{_number(seconds_per_step)} s/step")
        return "  ".join(parts)
    shown = [(key, value) for key, value in logs.items() if key not in ("epoch", "total_flos")]
    return "  ".join([where, *(f"{key} {_number(value)}" for key, value in shown)])


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
            self.training_bar.write(compact_log_line(logs, state.global_step, state.max_steps, rate))


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
            print(compact_log_line(logs, state.global_step, state.max_steps, rate), flush=True)


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
            say(self.line)


class _TrainBegins(TrainerCallback):
    """First in the callback list: when training begins, before any other callback's start (a tracking evaluation)."""

    def __init__(self, estimate: TrainingEstimate):
        self.estimate = estimate

    def on_train_begin(self, args, state, control, **kwargs):
        self.estimate.begun = time.perf_counter()


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
