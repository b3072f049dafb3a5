"""The `trl-nca` command: one module per command (`train_command`, `compare_command`, `eval`, `analyze`,
`experience_command`), the option groups they share in `options`, and `main`, which runs one and reports bad input as
one line."""

from __future__ import annotations

import os
import sys

from ..core.console import quiet_library_bars, take_verbose_flag
from ..core.launch import end_process_group
from ..inputs import (
    BUILTIN_CONTEXTS,
    BUILTIN_DATASETS,
    FULL_DISK_ERRNOS,
    LOCAL_FORMATS,
    UNWRITABLE_ERRNOS,
    InputError,
    OutputError,
    full_disk_error,
    load_dataset_any,
    read_context,
)
from ..trainers.script_options import resume_checkpoint
from .compare_command import compare
from .config_files import CommandLineError, builtin_config_names, check_config_file, with_builtin_config
from .experience_command import experience
from .train_command import TrainingInterrupted, TrainScriptArguments, train


# The commands and the names of their modules stay importable from here; read_context, load_dataset_any and
# resume_checkpoint live in trl_nca.inputs and trl_nca.trainers.script_options.
__all__ = [
    "BUILTIN_CONTEXTS",
    "BUILTIN_DATASETS",
    "LOCAL_FORMATS",
    "CommandLineError",
    "TrainScriptArguments",
    "TrainingInterrupted",
    "builtin_config_names",
    "check_config_file",
    "compare",
    "experience",
    "load_dataset_any",
    "main",
    "read_context",
    "resume_checkpoint",
    "train",
    "with_builtin_config",
]

USAGE = """usage: trl-nca {compare,train,eval,analyze,experience} [options]

  compare train plain OPD and NCA students on a built-in task and compare them paired with the base model
          e.g. trl-nca compare --config main_quick   (a config shipped with the package; main: the README's job)
  train   on-policy context distillation with No-Context Anchoring (NCATrainer)
          e.g. trl-nca train --config quickstart     (or a YAML file's path)
  eval    paired evaluation with and without the context
          e.g. trl-nca eval --help
  analyze what distilling the context did inside the students (hidden-state cosine, view KL, updates, gradients)
          e.g. trl-nca analyze --help
  experience  extract game experience from a model's own played episodes
          e.g. trl-nca experience --help

Run `trl-nca COMMAND --help` for every option of a command; `--verbose` (any command) prints each training log's
full dict and the libraries' progress bars."""


def _name_cpu_for_deepspeed() -> None:
    """DeepSpeed, when installed, is imported by accelerate whenever a model is unwrapped; on a machine with no
    accelerator its detection warns at every run that it fell back to the CPU. Name the CPU for it there (a
    `DS_ACCELERATOR` the user set is kept, and machines with any accelerator are left to DeepSpeed's detection)."""
    if "DS_ACCELERATOR" in os.environ:
        return
    import torch

    if not torch.accelerator.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _name_cpu_for_deepspeed()
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = argv[0], take_verbose_flag(argv[1:])  # --verbose: the full log dicts and every library's bars
    quiet_library_bars()
    if command not in COMMANDS:
        print(f"trl-nca: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    try:
        result = COMMANDS[command](rest)  # train returns its trainer, compare its summary
        end_process_group()  # `accelerate launch trl-nca train ...`: exit without the backend's threads running
        return result if isinstance(result, int) else 0
    except TrainingInterrupted as error:
        print(f"trl-nca {command}: {error}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(
            f"trl-nca {command}: interrupted; run the same command again to resume what was finished.", file=sys.stderr
        )
        return 130
    except USER_ERRORS as error:
        return _user_error(command, error)
    except OSError as error:  # a full disk or a folder made unwritable anywhere (a save, a figure) is one line too
        if error.errno not in FULL_DISK_ERRNOS + UNWRITABLE_ERRNOS:
            raise
        return _user_error(command, error)


def _eval(argv: list[str]) -> int:
    from .eval import main as eval_main

    return eval_main(argv)


def _analyze(argv: list[str]) -> int:
    from .analyze import main as analyze_main

    return analyze_main(argv)


COMMANDS = {"train": train, "compare": compare, "eval": _eval, "analyze": _analyze, "experience": experience}

# what the commands report in one line (exit status 2); any other exception keeps its traceback
USER_ERRORS = (CommandLineError, InputError, OutputError)


def _user_error(command: str, error: BaseException) -> int:
    """The one error path of every command: one line on stderr, exit status 2 (`TRL_NCA_TRACEBACK=1` re-raises)."""
    if os.environ.get("TRL_NCA_TRACEBACK"):
        raise error
    if isinstance(error, OSError) and not isinstance(error, OutputError):
        if error.errno in FULL_DISK_ERRNOS:
            error = full_disk_error(error.filename or "an output file", error)
        elif error.errno in UNWRITABLE_ERRNOS:  # a read or a write outside `atomic_output`: no guess which
            error = OutputError(
                f"Cannot use {error.filename or 'a file'} ({error.strerror or error}). Check its permissions, or "
                "whether its folder became read-only during the run, and run the same command again: finished work "
                "is kept and resumed."
            )
    message = " ".join(str(error).split())
    print(f"trl-nca {command}: error: {message} (set TRL_NCA_TRACEBACK=1 to see the traceback)", file=sys.stderr)
    return 2
