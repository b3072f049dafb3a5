"""The `--config` YAML file of `trl-nca train` and `trl-nca compare`: a config shipped with the package by name, the
file read and checked before TrlParser reads it, and the error type both commands raise on bad input."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import typing
from importlib.resources import files
from pathlib import Path

import yaml

from ..inputs import InputError, output_folder_lock, read_utf8_text


class CommandLineError(ValueError):
    """Bad input to `trl-nca train` or `trl-nca compare`, found before training starts (and, for compare, before any
    model loads or file is written); `main` prints it as one line (exit status 2)."""


def builtin_config_names() -> list[str]:
    """The configs shipped inside the package (`trl_nca/resources/configs/`, also `examples/configs/` in the
    repository), by name."""
    return sorted(
        p.name[: -len(".yaml")] for p in (files("trl_nca.resources") / "configs").iterdir() if p.name.endswith(".yaml")
    )


def with_builtin_config(argv: list[str] | None) -> list[str]:
    """`--config NAME` for a config shipped with the package (`trl-nca compare --config main_quick`), so the commands
    work from the wheel, where `examples/` does not exist: a NAME that is no file here and names a shipped config
    becomes that file's path. Anything else is left for `check_config_file`."""
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


def parse_command_line(parser, argv: list[str]) -> tuple:
    """`parser.parse_args_and_config(args=argv)` of `trl-nca train` or `compare` (a `TrlParser`), its `--config` file
    read and checked first (`check_config_file`): every mistake is one `CommandLineError` line naming the option, the
    file and the fix, never argparse's usage listing of some 190 lines before its error."""
    configs = check_config_file(argv, parser.dataclass_types)

    def error(message: str):
        raise CommandLineError(_argparse_error(message, argv, configs))

    parser.error = error  # argparse reports a bad value (also a config's default it converts) through `error`
    try:
        return parser.parse_args_and_config(args=argv)
    except (ValueError, TypeError) as error:
        raise CommandLineError(str(error)) from error


def _argparse_error(message: str, argv: list[str], configs: dict[str, dict]) -> str:
    """argparse's error `message` as one line; a bad value set in a `--config` file (not on the command line) names
    the file and its line."""
    found = re.match(r"argument (--[\w-]+)", message)
    key = found.group(1)[2:].replace("-", "_") if found else None
    given = {arg.split("=", 1)[0][2:].replace("-", "_") for arg in argv if arg.startswith("--")}
    for path, data in configs.items():
        if key is not None and key in data and key not in given:
            return f"In the config {path!r}, `{key}: {data[key]!r}` is refused: {message}. Fix that line."
    return f"{message}. See --help for the options."


def _config_paths(argv: list[str]) -> list[str]:
    values = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--config"]
    return values + [arg.split("=", 1)[1] for arg in argv if arg.startswith("--config=")]


class _DuplicateKey(Exception):
    def __init__(self, key, first: int, again: int):
        super().__init__(key)
        self.key, self.first, self.again = key, first, again


def _unique_key_loader():
    """A YAML safe loader that refuses a key set twice in one mapping (the plain loader keeps the last silently)."""

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            lines = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                line = key_node.start_mark.line + 1
                try:
                    if key in lines:
                        raise _DuplicateKey(key, lines[key], line)
                    lines[key] = line
                except TypeError:  # an unhashable key: the base loader reports it
                    pass
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader


def check_config_file(argv: list[str] | None, types=()) -> dict[str, dict]:
    """The `--config` file of `trl-nca train` or `compare`, read before TrlParser reads it: a missing file, a folder,
    a byte that is not UTF-8, YAML that does not parse, a key set twice, a YAML boolean where a word is meant and one
    value where the option (a field of the dataclasses `types`) takes a list are each a `CommandLineError` naming the
    file, the line and the fix (TrlParser would raise a bare OSError or a YAML traceback, keep the last of two keys and
    pass a lone string on). Returns each config's settings, by the path given."""
    argv = list(sys.argv[2:] if argv is None else argv)
    read = {}
    for value in _config_paths(argv):
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
            data = yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 (a SafeLoader)
        except InputError as error:
            raise CommandLineError(str(error)) from None
        except _DuplicateKey as twice:
            raise CommandLineError(
                f"The config {value!r} sets `{twice.key}` twice (lines {twice.first} and {twice.again}); YAML would "
                "keep the last one without a word. Keep one of them."
            ) from None
        except yaml.YAMLError as error:
            raise CommandLineError(_yaml_error(value, error)) from None
        if data is not None and not isinstance(data, dict):
            raise CommandLineError(
                f"The config {value!r} holds a YAML {type(data).__name__}, not settings; write one `name: value` per line."
            )
        _check_values(value, data or {}, _list_fields(types))
        read[value] = data or {}
    return read


def _yaml_error(value: str, error) -> str:
    mark, start = getattr(error, "problem_mark", None), getattr(error, "context_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    if where and start is not None and start.line != mark.line:
        where += f"; {getattr(error, 'context', None) or 'it starts'} at line {start.line + 1}"
    where += ")" if where else ""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return f"The config {value!r} is not valid YAML: {problem}{where}. Fix that line (one `name: value` per line)."


def _list_fields(types) -> set[str]:
    """The fields of the dataclasses `types` that take a list only (`list[...]`, or that or None)."""
    fields = set()
    for cls in types:
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            kinds = [k for k in typing.get_args(hints[field.name]) if k is not type(None)] or [hints[field.name]]
            if all(typing.get_origin(kind) is list or kind is list for kind in kinds):
                fields.add(field.name)
    return fields


PEFT_WORDS = ("all-linear",)  # the one string PEFT's `target_modules` takes as a word, not a pattern


def _check_values(value: str, data: dict, lists: set[str]) -> None:
    for key, setting in data.items():
        if isinstance(setting, bool) and (str(key).endswith("_strategy") or key == "report_to"):
            word = "no" if setting is False else "yes"
            raise CommandLineError(
                f"In the config {value!r}, `{key}` is the boolean {setting} (YAML reads an unquoted {word} or "
                f"{'off' if setting is False else 'on'} as a boolean), but it takes a word. Quote it: "
                f'`{key}: "{word}"`.'
            )
        if key not in lists or setting is None or isinstance(setting, list) or setting in PEFT_WORDS:
            continue
        why = ""
        if key == "lora_target_modules" and isinstance(setting, str):
            why = (
                " (PEFT reads a lone string as a pattern that must match a module's whole name, such as "
                "model.layers.0.self_attn.q_proj, so it would match no module)"
            )
        raise CommandLineError(
            f"In the config {value!r}, `{key}: {setting}` is one value, but `{key}` takes a list{why}. Write "
            f"`{key}: [{setting}]`."
        )


def main_process_lock(output_dir: str, command: str):
    """The output folder's lock, taken by the main process of a launch (the others write into the same folder)."""
    rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))
    return output_folder_lock(output_dir, command) if rank in ("0", "-1", "") else contextlib.nullcontext()
