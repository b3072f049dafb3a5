"""The `--config` YAML file of `trl-nca train` and `trl-nca compare`: a config shipped with the package by name, the
file read and checked before TrlParser reads it, and the error type both commands raise on bad input."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from ..inputs import InputError, output_folder_lock, read_utf8_text


class CommandLineError(ValueError):
    """Bad input to `trl-nca train` or `trl-nca compare`, found before training starts (and, for compare, before any
    model loads or file is written); `main` prints it as one line (exit status 2)."""


def builtin_config_names() -> list[str]:
    """The configs shipped inside the package (`trl_nca/resources/configs/`, also `examples/configs/` in the
    repository), by name."""
    from importlib.resources import files

    return sorted(
        p.name[: -len(".yaml")] for p in (files("trl_nca.resources") / "configs").iterdir() if p.name.endswith(".yaml")
    )


def with_builtin_config(argv: list[str] | None) -> list[str]:
    """`--config NAME` for a config shipped with the package (`trl-nca compare --config main_quick`), so the commands
    work from the wheel, where `examples/` does not exist: a NAME that is no file here and names a shipped config
    becomes that file's path. Anything else is left for `check_config_file`."""
    from importlib.resources import files

    argv = list(sys.argv[2:] if argv is None else argv)
    names = builtin_config_names()
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--config" and i + 1 < len(argv) else None
        if arg.startswith("--config="):
            value = arg.split("=", 1)[1]
        if value is None or Path(value).exists() or value.removesuffix(".yaml") not in names:
            continue
        path = str(files("trl_nca.resources") / "configs" / f"{value.removesuffix('.yaml')}.yaml")
        if arg == "--config":
            argv[i + 1] = path
        else:
            argv[i] = f"--config={path}"
    return argv


def check_config_file(argv: list[str] | None) -> None:
    """The `--config` file of `trl-nca train` or `compare`, read before TrlParser reads it: a missing file, a folder,
    a byte that is not UTF-8 or YAML that does not parse is a `CommandLineError` naming the file, the line and the
    fix (TrlParser would raise a bare OSError or a YAML traceback)."""
    import yaml

    argv = list(sys.argv[2:] if argv is None else argv)
    values = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--config"]
    values += [arg.split("=", 1)[1] for arg in argv if arg.startswith("--config=")]
    for value in values:
        path = Path(value)
        if path.is_dir():
            raise CommandLineError(
                f"--config {value!r} is a folder; give the YAML file of the settings (e.g. examples/configs/quickstart.yaml, or a shipped config's name: quickstart)."
            )
        if not path.is_file():
            raise CommandLineError(
                f"--config {value!r} does not exist; give the path of a YAML file of settings, or the name of a "
                f"shipped config ({', '.join(builtin_config_names())})."
            )
        try:
            text = read_utf8_text(path, f"the config {value!r}")
            data = yaml.safe_load(text)
        except InputError as error:
            raise CommandLineError(str(error)) from None
        except yaml.YAMLError as error:
            mark, start = getattr(error, "problem_mark", None), getattr(error, "context_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            if where and start is not None and start.line != mark.line:
                where += f"; {getattr(error, 'context', None) or 'it starts'} at line {start.line + 1}"
            where += ")" if where else ""
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            raise CommandLineError(
                f"The config {value!r} is not valid YAML: {problem}{where}. Fix that line (one `name: value` per line)."
            ) from None
        if data is not None and not isinstance(data, dict):
            raise CommandLineError(
                f"The config {value!r} holds a YAML {type(data).__name__}, not settings; write one `name: value` per line."
            )
        for key, setting in (data or {}).items():  # YAML reads unquoted no/yes/off/on as booleans
            if isinstance(setting, bool) and (str(key).endswith("_strategy") or key == "report_to"):
                word = "no" if setting is False else "yes"
                raise CommandLineError(
                    f"In the config {value!r}, `{key}` is the boolean {setting} (YAML reads an unquoted {word} or "
                    f"{'off' if setting is False else 'on'} as a boolean), but it takes a word. Quote it: "
                    f'`{key}: "{word}"`.'
                )


def main_process_lock(output_dir: str, command: str):
    """The output folder's lock, taken by the main process of a launch (the others write into the same folder)."""
    rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))
    return output_folder_lock(output_dir, command) if rank in ("0", "-1", "") else contextlib.nullcontext()
