"""The option groups several commands share, declared once: `--model` (one model-spec syntax), `--dtype` and the
context options. `trl-nca eval`, `trl-nca analyze` and `trl-nca experience` add them with these functions.

Where a command's default shapes its numbers, it keeps its own (passed in by the command, with the reason at the call):
`--dtype` is `auto` for `eval` and `experience` and `float32` for `analyze`, and `analyze` leaves the context options
unset (None) so that a `--task` brings its own context.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..core.views import ContextSpec
from ..eval.loading import DTYPES


MODEL_SPEC = "[NAME=]PATH[:ADAPTER]"  # the one model-spec syntax (`trl_nca.eval.loading.parse_model_specs`)
MODEL_SPEC_HELP = (
    "A model folder, Hub id or alias ('embedded': the built-in SmolLM2-135M-Instruct; 'organism', or a shipped "
    "organism by its name, e.g. 'organism-rules-s2'), optionally with a "
    "PEFT adapter folder after a colon (a PATH that exists as given is never split). NAME= sets its name in the "
    "report (default: the last path component of its adapter, else of PATH; names must be unique); NAME=:ADAPTER "
    "puts an adapter on the first model's weights."
)

_CONTEXT = ContextSpec()
# `trl-nca eval`'s context defaults: ContextSpec's own, stored in the parsed options
DEFAULT_TEMPLATE = _CONTEXT.template
DEFAULT_SEPARATOR = _CONTEXT.separator
CONTEXT_DEFAULTS = {
    "context_column": _CONTEXT.column,
    "placement": _CONTEXT.placement,
    "template": DEFAULT_TEMPLATE,
    "separator": DEFAULT_SEPARATOR,
}
# the destinations of the context options (`trl_nca.eval.loading.context_from_args` reads them)
CONTEXT_OPTIONS = ("context_column", "context_text", "context_file", "placement", "template", "separator")


def json_object_arg(text: str) -> dict[str, Any]:
    """argparse type of the `--chat-template-kwargs` options: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON: {error.msg}") from error
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object, e.g. '{\"enable_thinking\": false}'")
    return value


def add_model_options(group, help_suffix: str = "", *, one: bool = False) -> None:
    """`--model` in the one model-spec syntax: repeatable (`eval`, `analyze`), or with `one` a single required model
    without a name (`experience`: `PATH[:ADAPTER]`)."""
    if one:
        group.add_argument(
            "--model", required=True, metavar="PATH[:ADAPTER]", help=MODEL_SPEC_HELP.split(" NAME=")[0] + help_suffix
        )
        return
    group.add_argument(
        "--model",
        action="append",
        default=[],
        metavar=MODEL_SPEC,
        help=f"{MODEL_SPEC_HELP} Repeat for several models.{help_suffix}",
    )


def add_dtype_option(group, default: str, why: str = "") -> None:
    """`--dtype`, one of `trl_nca.eval.loading.DTYPES`; each command passes its own default (see the module
    docstring)."""
    group.add_argument(
        "--dtype", default=default, choices=list(DTYPES), help=f"Weights dtype (default {default}{why})."
    )


def add_context_options(parser: argparse.ArgumentParser, title: str = "context", defaults: dict | None = None) -> None:
    """The context options: `--context-column`, `--context-text` or `--context-file` (one of them), `--placement`,
    `--template`, `--separator` and `--chat-template-kwargs`. `defaults` (`CONTEXT_DEFAULTS`, or None for every
    option) is what the parsed options hold when an option is not given."""
    given = defaults or {}
    context = parser.add_argument_group(title)
    source = context.add_mutually_exclusive_group()
    source.add_argument(
        "--context-column",
        default=given.get("context_column"),
        help="Column with each item's context (default: context).",
    )
    source.add_argument("--context-text", help="One fixed context string for every item (e.g. a system prompt).")
    source.add_argument(
        "--context-file",
        help="A UTF-8 text file holding one fixed context for every item, or a built-in one: 'medical' or 'safety'.",
    )
    context.add_argument(
        "--placement",
        default=given.get("placement"),
        choices=["system", "user"],
        help="Put the context in the system message (default) or inside the first user message.",
    )
    context.add_argument(
        "--template",
        default=given.get("template"),
        help="With --placement user: how context and prompt are joined; must contain {context} and {prompt}.",
    )
    context.add_argument(
        "--separator",
        default=given.get("separator"),
        help="With --placement system: joins the context and an existing system message.",
    )
    context.add_argument(
        "--chat-template-kwargs",
        type=json_object_arg,
        default={},
        metavar="JSON",
        help="Extra chat template variables, e.g. '{\"enable_thinking\": false}'.",
    )
