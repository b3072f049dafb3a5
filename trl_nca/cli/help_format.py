"""How the commands' help is written, shared by the commands and the help spec (`trl_nca.cli.help`): the log options
every command lists, and the formatter that shows each option's default. Imports only argparse."""

from __future__ import annotations

import argparse
import re


OUTPUT_OPTIONS = (
    ("--quiet", "Print only the opening line, the result table and the closing line (and warnings)."),
    (
        "--full_log",
        "compare: print every student's step and tracking lines (the default prints each student's start, estimate "
        "and end, and the whole job's estimate).",
    ),
    ("--verbose", "Print each training log's full dict and the libraries' own progress bars."),
)


def says_default(text: str) -> bool:
    """Whether an option's help gives its default itself ("(default: test)", "Default: 1024", "(default auto)")."""
    return re.search(r"\(default\b|\bdefault\s*:", text, re.IGNORECASE) is not None


class CommandHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The help of `eval`, `analyze` and `experience`: the description and examples as written, and each option's
    default after its help, unless the help gives it or there is none to give (a flag, an option unset by default)."""

    def _get_help_string(self, action):
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == [] or not action.option_strings
        if says_default(text) or unset or action.default == argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)"


def add_log_options(parser: argparse.ArgumentParser, full_log: bool = False) -> None:
    """The log options every command takes (`trl_nca.console.take_output_flags` reads them from the command line
    before the command's own parser does), listed in its help."""
    group = parser.add_argument_group("log options (any command)")
    for flag, text in OUTPUT_OPTIONS:
        if full_log or flag != "--full_log":
            group.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=text)
