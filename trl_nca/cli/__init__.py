"""The `trl-nca` command: one module per command (`train_command`, `compare_command`, `eval`, `analyze`,
`experience_command`), the option groups they share in `options`, and `main`, which runs one and reports bad input as
one line.

Importing this package, `trl-nca --help` and each command's `--help` (`trl_nca.cli.help`) import no torch,
Transformers or TRL: a command's modules are imported when it runs, and the names below are loaded on first use."""

from __future__ import annotations

import importlib
import os
import signal
import sys

from ..console import LOG_ENV, VERBOSE_ENV, take_output_flags


# name -> the module that defines it, imported on first use (`from trl_nca.cli import compare`)
_NAMES = {
    "compare": ".compare_command",
    "train": ".train_command",
    "TrainScriptArguments": ".train_command",
    "TrainingInterrupted": ".train_command",
    "experience": ".experience_command",
    "CommandLineError": ".config_files",
    "builtin_config_names": ".config_files",
    "check_config_file": ".config_files",
    "with_builtin_config": ".config_files",
    "BUILTIN_CONTEXTS": "..inputs",
    "BUILTIN_DATASETS": "..inputs",
    "LOCAL_FORMATS": "..inputs",
    "load_dataset_any": "..inputs",
    "read_context": "..inputs",
    "resume_checkpoint": "..trainers.script_options",
}
__all__ = ["main", *_NAMES]


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_NAMES[name], __name__), name)


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

Run `trl-nca COMMAND --help` for a command's options (`compare` and `train`: `--help-all` adds TRL's model and
training options). Any command: `--quiet` prints only the opening line, the result table and the closing line;
`--verbose` prints each training log's full dict and the libraries' progress bars; `compare --full_log` prints every
student's step and tracking lines."""

# command -> (module, function); the module is imported when the command runs
COMMANDS = {
    "train": (".train_command", "train"),
    "compare": (".compare_command", "compare"),
    "eval": (".eval", "main"),
    "analyze": (".analyze", "main"),
    "experience": (".experience_command", "experience"),
}
INTERRUPTED = 130  # the exit status of a command stopped by Ctrl-C (128 + SIGINT, as a shell reports it)
DEFAULT_LOG = {"compare": "units"}  # a comparison of many students prints each one's start and end, not its steps


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
    process = argv is None  # the command line's entry point (not `main` called in-process)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command = argv[0]
    if command not in COMMANDS:
        print(f"trl-nca: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    if "--help-all" in argv[1:]:  # from the help spec too
        from .help import print_help

        print_help(command, full=True)
        return 0
    if "-h" in argv[1:] or "--help" in argv[1:]:  # from the help spec: no heavy import
        from .help import print_help

        print_help(command)
        return 0
    before = {name: os.environ.get(name) for name in (LOG_ENV, VERBOSE_ENV)}
    try:  # the log level holds for this command and the processes it starts, not after it (`main` called in-process)
        code = _run(command, take_output_flags(argv[1:], DEFAULT_LOG.get(command)))
        if code == INTERRUPTED and process:
            # the run has printed its last line: a further Ctrl-C lands in the interpreter's exit (its finalisers,
            # torch's and datasets'), where it would print a traceback after that line
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        return code
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _run(command: str, rest: list[str]) -> int:
    from ..console import install_log_handler, quiet_library_bars
    from ..core.launch import end_process_group
    from ..inputs import FULL_DISK_ERRNOS, UNWRITABLE_ERRNOS, InputError, OutputError, RunStopped
    from .config_files import CommandLineError
    from .train_command import TrainingInterrupted

    _name_cpu_for_deepspeed()
    quiet_library_bars()
    install_log_handler()
    module, function = COMMANDS[command]
    run = getattr(importlib.import_module(module, __name__), function)
    try:
        result = run(rest)  # train returns its trainer, compare its summary
        end_process_group()  # `accelerate launch trl-nca train ...`: exit without the backend's threads running
        return result if isinstance(result, int) else 0
    except TrainingInterrupted as error:
        print(f"trl-nca {command}: {error}", file=sys.stderr)
        return INTERRUPTED
    except KeyboardInterrupt:
        print(
            f"trl-nca {command}: interrupted; run the same command again to resume what was finished.", file=sys.stderr
        )
        return INTERRUPTED
    except (CommandLineError, InputError, OutputError) as error:  # reported in one line (exit status 2)
        return _user_error(command, error)
    except RunStopped as error:  # a run stopped from outside (a worker killed): one line too, exit status 1
        return _user_error(command, error, status=1)
    except OSError as error:  # a full disk or a folder made unwritable anywhere (a save, a figure) is one line too
        if error.errno not in FULL_DISK_ERRNOS + UNWRITABLE_ERRNOS:
            raise
        return _user_error(command, error)


def _user_error(command: str, error: BaseException, status: int = 2) -> int:
    """The one error path of every command: one line on stderr, exit status `status` (`TRL_NCA_TRACEBACK=1`
    re-raises)."""
    from ..inputs import FULL_DISK_ERRNOS, UNWRITABLE_ERRNOS, OutputError, full_disk_error

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
    return status
