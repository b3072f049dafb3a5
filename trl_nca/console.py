"""What a `trl-nca` command prints, apart from any Trainer: the opening and closing lines, one named progress bar per
phase, durations in words, the log level (`--quiet`, the default, `--full_log`, `--verbose`), the name of the unit a
line belongs to (`opd/org0/seed1` in a comparison of several students), and the estimate of a whole job updated as
its units finish.

Printing only: nothing here changes what a run computes or records. What knows a Trainer (its callbacks, the compact
line of each training log, the training estimate) is `trl_nca.trainers.console`.

Log levels (`TRL_NCA_LOG`, set by the commands' flags and inherited by the processes they start):

- `quiet` (`--quiet`): only a command's opening line, its result table and its closing line (and warnings);
- `units` (`trl-nca compare`'s default): besides, each unit's start, training estimate and end, and the whole job's
  estimate as units finish;
- `steps` (the default elsewhere, `trl-nca compare --full_log`): besides, one compact line per training log and per
  tracking evaluation;
- `TRL_NCA_VERBOSE=1` (`--verbose`): besides, each log's full dict and the libraries' own progress bars.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any


VERBOSE_ENV = "TRL_NCA_VERBOSE"


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


LOG_ENV = "TRL_NCA_LOG"
LOG_LEVELS = ("quiet", "units", "steps")  # each prints what the one before it does, and more


def log_level() -> str:
    """The log level (`TRL_NCA_LOG`): `quiet`, `units` or `steps` (the default); `verbose()` prints as `steps`."""
    level = os.environ.get(LOG_ENV, "steps")
    return "steps" if verbose() or level not in LOG_LEVELS else level


def shows(level: str) -> bool:
    """Whether lines of `level` (`units`: a unit's start and end; `steps`: a training log or tracking evaluation) are
    printed at the current log level."""
    return LOG_LEVELS.index(log_level()) >= LOG_LEVELS.index(level)


def take_output_flags(argv: list[str], default: str | None = None) -> list[str]:
    """`argv` without `--quiet`, `--full_log` and `--verbose`, which set the log level for this process and those it
    starts (`TRL_NCA_LOG`, `TRL_NCA_VERBOSE`). `default` is the command's own level when no flag is given (`units`
    for `trl-nca compare`); an inherited `TRL_NCA_LOG` is kept."""
    argv = take_verbose_flag(argv)
    flags = {"--quiet": "quiet", "--full_log": "steps"}
    given = [flags[arg] for arg in argv if arg in flags]
    if given:
        os.environ[LOG_ENV] = given[-1]
    elif default is not None and LOG_ENV not in os.environ:
        os.environ[LOG_ENV] = default
    return [arg for arg in argv if arg not in flags]


_speaker: str | None = None


def speaker() -> str | None:
    """The unit this process prints for (`opd/org0/seed1`), or None."""
    return _speaker


@contextlib.contextmanager
def speaking_for(name: str | None) -> Iterator[None]:
    """Within this block, each progress line (`say`, and the progress records of `trl_nca` loggers) names `name`,
    unless it already does: the lines of several students that run at once stay readable."""
    global _speaker
    before, _speaker = _speaker, name
    try:
        yield
    finally:
        _speaker = before


def named(text: str) -> str:
    """`text` with the current unit's name in front (`[opd/org0/seed1] step 5/100 ...`), unless it names it already."""
    return text if _speaker is None or _speaker in text else f"[{_speaker}] {text}"


_training = False


def set_training(on: bool) -> None:
    """Called by the training callbacks (`trl_nca.trainers.console`) as training begins and ends."""
    global _training
    _training = on


def progress_level() -> str:
    """The log level of a progress line logged now: `steps` while a training runs (a tracking evaluation's lines) or
    within `in_detail`, else `units`."""
    return "steps" if _training else "units"


@contextlib.contextmanager
def in_detail() -> Iterator[None]:
    """Within this block, progress lines are step lines (`progress_level`): the parts of a unit that the unit's own
    lines and the whole job's estimate already cover (a student's evaluation, in a comparison)."""
    global _training
    before, _training = _training, True
    try:
        yield
    finally:
        _training = before


PROGRESS = "trl_nca_progress"
"""The `extra` key that marks a log record as a progress line (`logger.warning(line, extra={PROGRESS: "units"})`):
printed at that log level and above, with the unit's name (`ProgressFilter`)."""


class ProgressFilter(logging.Filter):
    """On the handler of the `trl_nca` loggers (`install_log_handler`): a progress record is dropped below its log
    level, and named for the current unit."""

    def filter(self, record: logging.LogRecord) -> bool:
        level = getattr(record, PROGRESS, None)
        if level is None:
            return True
        if not shows(level):
            return False
        record.msg, record.args = named(record.getMessage()), None
        return True


def install_log_handler() -> None:
    """Print the `trl_nca` loggers' records (warnings and above, and progress records) as bare lines on stderr, the
    way Python prints a warning without a logging configuration, through `ProgressFilter`. Idempotent; a command
    calls it."""
    root = logging.getLogger("trl_nca")
    if any(isinstance(h, _Handler) for h in root.handlers):
        return
    handler = _Handler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.addFilter(ProgressFilter())
    root.addHandler(handler)


class _Handler(logging.StreamHandler):
    """A stream handler that writes to the `sys.stderr` of the moment (pytest's capture, a redirected stream)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def on_terminal() -> bool:
    """Whether progress bars are drawn: on a terminal (stderr), or always when `verbose()`. In a log file a bar is
    redrawn at every update and every line written above it (tqdm's own default, `disable=None`, leaves bars out
    there too); the compact lines and the estimates say the progress."""
    return verbose() or sys.stderr.isatty()


def progress_bar(total: int, desc: str, unit: str, enabled: bool = True):
    """A tqdm bar for one phase of a run, named for it; drawn only `on_terminal()`."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, disable=not (enabled and on_terminal()))


def say(text: str, level: str | None = None) -> None:
    """Print one line on stdout without breaking a progress bar drawn at the time (tqdm's write). A progress line
    gives its `level` (`units` or `steps`): it is printed at that log level and above, named for the current unit
    (`named`)."""
    from tqdm.auto import tqdm

    if level is not None:
        if not shows(level):
            return
        text = named(text)
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


def format_number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e6:
        return str(int(value))
    if value != 0 and abs(value) < 0.01:
        mantissa, exponent = f"{value:.1e}".split("e")
        return f"{mantissa.removesuffix('.0')}e{int(exponent)}"
    return f"{value:.3g}"


class JobEstimate:
    """The estimate of a whole job of `total` units (the students of a comparison), printed as each one finishes: the
    mean time of a unit so far (each unit's own time, from its start to its end), times the units left, divided by the
    `workers` that run them at once (by as many as are left, when fewer). It measures the job's own pace on this
    machine; not a bound. A unit still running counts as a whole unit left, so the estimate errs long by at most one
    unit's time."""

    def __init__(self, total: int, what: str = "student", workers: int = 1):
        self.total, self.what, self.workers = total, what, max(1, int(workers))
        self.done, self.start, self.seconds = 0, time.perf_counter(), []

    def finished(self, name: str, seconds: float | None = None) -> str:
        """The line for unit `name` having finished after `seconds` of its own (counted once per call; without
        `seconds`, the time since the job began divided by the units finished, as one worker's pace)."""
        self.done += 1
        elapsed = time.perf_counter() - self.start
        if seconds is not None:
            self.seconds.append(float(seconds))
        pace = sum(self.seconds) / len(self.seconds) if len(self.seconds) == self.done else elapsed / self.done
        left = self.total - self.done
        head = f"{name} finished ({self.done} of {plural(self.total, self.what)}, {duration(elapsed)} since the start)"
        if left <= 0:
            return f"{head}; every {self.what} is done."
        at_once = min(self.workers, left)
        more = pace * left / at_once
        workers = f", {at_once} at a time" if at_once > 1 else ""
        return (
            f"{head}; the whole job: about {duration(more)} more for the {plural(left, self.what)} left{workers} (this "
            "job's pace so far, measured in this run; not a bound)."
        )
