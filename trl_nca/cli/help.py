"""Each command's `--help`, printed without importing torch, Transformers or TRL.

A command's options are declared once, in its parser (argparse for `eval`, `analyze` and `experience`; TrlParser over
dataclasses for `train` and `compare`), and building those parsers imports the heavy libraries (TrlParser is
Transformers' `HfArgumentParser`; `NCAConfig` is a `TrainingArguments`). So the help text is rendered from the real
parsers once, written to `trl_nca/resources/cli_help.json`, and `--help` prints that file: a cheap spec of the
parsers. `tests/cli/test_help.py` checks that the file equals what the parsers render now; after a change of an
option, rewrite it with `python -m trl_nca.cli.help`.

`train --help` and `compare --help` lead with the command's own options (`--config` first), then the NCA options of
`NCAConfig`, then the log options; TRL's `ModelConfig` and the `TrainingArguments` / `GKDConfig` options follow under
`--help-all`, which the spec holds too (rendering it builds the real parser: seconds). A `--no_X` flag that HfArgumentParser adds for a boolean field
whose default is True says only that it turns `--X` off, instead of repeating `--X`'s paragraph.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib.resources import files

from .help_format import OUTPUT_OPTIONS, says_default


COMMANDS = ("compare", "train", "eval", "analyze", "experience")
SPEC = "cli_help.json"  # in trl_nca/resources/

CONFIG_HELP = (
    "A YAML file of options (`name: value` per line), or the name of a config shipped with the package (e.g. "
    "main_quick, main, quickstart). Options given on the command line override the file's."
)


def _dataclass_parser(command: str):
    """The TrlParser of `train` or `compare` and its dataclasses (heavy imports)."""
    from trl import ModelConfig, TrlParser

    from ..trainers.nca_config import NCAConfig

    if command == "compare":
        from ..recipes import CompareArguments as Own
    else:
        from .train_command import TrainScriptArguments as Own
    return TrlParser((Own, NCAConfig, ModelConfig), prog=f"trl-nca {command}"), (Own, NCAConfig, ModelConfig)


def turn_off_help(parser: argparse.ArgumentParser) -> None:
    """Each `--no_X` flag of HfArgumentParser (a boolean field whose default is True) says what it does in one line,
    instead of repeating `--X`'s paragraph."""
    for action in parser._actions:
        names = [s for s in action.option_strings if s.startswith("--no_")]
        if names and isinstance(action, argparse._StoreFalseAction):
            action.help = f"Turn `--{names[0].removeprefix('--no_')}` off."


def _sections(command: str, full: bool) -> tuple[argparse.ArgumentParser, list[tuple[str, list]]]:
    """The help sections of `train` or `compare`: its own options (`--config` first), the NCA options, the log
    options, and with `full` TRL's model options and the training options."""
    import dataclasses

    from ..trainers.field_docs import field_names

    parser, (own, config, model) = _dataclass_parser(command)
    turn_off_help(parser)
    extra = argparse.ArgumentParser(add_help=False)
    config_action = extra.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help=CONFIG_HELP)
    outputs = [
        extra.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=text)
        for flag, text in (*OUTPUT_OPTIONS, ("--help-all", "Also list TRL's model options and the training options."))
    ]
    by_dest: dict[str, list] = {}
    for action in parser._actions:
        by_dest.setdefault(action.dest, []).append(action)

    def actions(names):
        return [action for name in names for action in by_dest.get(name, [])]

    own_names = [f.name for f in dataclasses.fields(own)]
    nca_names = [n for n in field_names(config) if n not in own_names]
    model_names = [f.name for f in dataclasses.fields(model)]
    shown = set(own_names) | set(nca_names)
    training_names = [f.name for f in dataclasses.fields(config) if f.name not in shown]
    sections = [
        (f"{command} options", [config_action, *actions(own_names)]),
        ("NCA options (NCAConfig)", actions(nca_names)),
        ("log options (any command)", outputs),
    ]
    if full:
        sections += [
            ("model options (TRL's ModelConfig)", actions([n for n in model_names if n not in shown])),
            ("training options (transformers' TrainingArguments and TRL's GKDConfig)", actions(training_names)),
        ]
    return parser, sections


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """TrlParser's formatter (each option's default after its help), except where the help already says its default."""

    def _get_help_string(self, action):
        text = action.help or ""
        said = says_default(text) or isinstance(action, argparse._StoreFalseAction)  # `--no_X`: one line
        return text if said else super()._get_help_string(action)


WIDTH = "120"  # the columns the help is rendered for, whatever the terminal that renders it (the spec is compared)


def render(command: str, full: bool = False) -> str:
    """The help text of `command`, from its real parser (imports what the parser needs), `WIDTH` columns wide."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        return _render(command, full)
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def _render(command: str, full: bool) -> str:
    if command in ("train", "compare"):
        parser, sections = _sections(command, full)
        formatter = _Formatter(parser.prog)
        formatter.add_usage(f"trl-nca {command} [--config FILE] [options]", None, [])
        description = {
            "compare": "Train plain OPD and NCA students on a built-in task and compare them paired with the base.",
            "train": "On-policy context distillation with No-Context Anchoring (NCATrainer).",
        }[command]
        formatter.add_text(description)
        for title, actions in sections:
            formatter.start_section(title)
            formatter.add_arguments(actions)
            formatter.end_section()
        if not full:
            formatter.add_text(
                f"TRL's model and LoRA options (--model_name_or_path, --use_peft, --lora_r, ...) and the training "
                f"options of transformers' TrainingArguments (--max_steps, --learning_rate, "
                f"--per_device_train_batch_size, ...): `trl-nca {command} --help-all`."
            )
        return formatter.format_help()
    if command == "eval":
        from .eval import build_parser
    elif command == "analyze":
        from .analyze import build_parser
    else:
        from .experience_command import build_parser
    return build_parser().format_help()


FULL_HELP = ("compare", "train")  # the commands whose `--help-all` lists more than `--help` (TRL's options)


def spec_keys() -> list[str]:
    """The spec's entries: each command's `--help`, and `COMMAND --help-all` for the commands of `FULL_HELP`."""
    return [*COMMANDS, *(f"{command} --help-all" for command in FULL_HELP)]


def read_spec() -> dict[str, str]:
    return json.loads((files("trl_nca.resources") / SPEC).read_text(encoding="utf-8"))


def print_help(command: str, full: bool = False) -> None:
    """Print `command`'s help (with `full`, its `--help-all`) from the spec (no heavy import). A command whose
    `--help` lists every option says so under `--help-all`."""
    spec = read_spec()
    if full and command in FULL_HELP:
        sys.stdout.write(spec[f"{command} --help-all"])
        return
    sys.stdout.write(spec[command])
    if full:
        sys.stdout.write(
            f"\n`--help-all`: every option of `trl-nca {command}` is listed above (it adds TRL's model and training "
            f"options to {' and '.join(FULL_HELP)}).\n"
        )


def write_spec(path=None) -> dict[str, str]:
    """Render every command's help from its parser (and the full help of `FULL_HELP`) and write the spec."""
    spec = {key: render(key.split()[0], full=key.endswith("--help-all")) for key in spec_keys()}
    target = path or str(files("trl_nca.resources") / SPEC)
    with open(target, "w", encoding="utf-8") as handle:
        json.dump(spec, handle, indent=1, ensure_ascii=False)
        handle.write("\n")
    return spec


if __name__ == "__main__":
    write_spec()
    print(f"Wrote {files('trl_nca.resources') / SPEC}")
