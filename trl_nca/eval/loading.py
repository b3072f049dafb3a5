"""What a command loads from the names it was given: model specs, models with their adapters, tokenizers, the context.

One parser (`parse_model_specs`, then `resolve_model_specs`), one loader (`load_model`, `load_tokenizer`) and one
context builder (`context_from_options`) serve `trl-nca eval`, `trl-nca analyze` and the Python callers of both.
Every error is a `trl_nca.inputs.InputError` (`EvalInputError`) that names the problem and the fix.

Model specs are `[NAME=]PATH`, and with `inline_adapters` (the syntax of every command: `trl_nca.cli.options`)
`[NAME=]PATH[:ADAPTER]`, where an empty PATH (`NAME=:ADAPTER`) means the first model's weights. Adapters may also come
separately (the `--adapter [NAME=]PATH` values of `trl-nca eval`). A model without a name is named after the last path
component of its adapter, else of its PATH (or `first_name` for the first model); names must be unique.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import SafetensorError

from ..core.views import ContextSpec
from ..inputs import BUILTIN_CONTEXTS, InputError, check_weight_files, read_context
from ..models.names import EmbeddedModelUnavailableError, ModelNotFoundError, resolve_model_name_or_path
from .errors import EvalInputError


# ----------------------------------------------------------------------------------------------------------------------
# Model specs

MODEL_NAME = re.compile(r"^[A-Za-z0-9._-]+$")  # what NAME= may be: a model's name is also its folder in the outputs
NO_ADAPTER = ("none", "-")  # an unnamed --adapter value for a model without adapter


@dataclass
class ModelSpec:
    """One model of an evaluation or an analysis: display name, weights (folder, Hub id or alias), optional adapter."""

    name: str
    path: str
    adapter: str | None = None


class NamedValue(NamedTuple):
    """A `NAME=VALUE` option value split in two; `name` is None when the value has no valid `NAME=` prefix."""

    name: str | None
    value: str


def split_name(text: str) -> NamedValue:
    """`"nca=runs/nca"` -> ("nca", "runs/nca"); a value without a valid `NAME=` prefix is all value."""
    name, sep, rest = text.partition("=")
    if sep and MODEL_NAME.match(name):
        return NamedValue(name, rest)
    return NamedValue(None, text)


class PathAndAdapter(NamedTuple):
    """A `PATH[:ADAPTER]` value split in two; `adapter` is None without one."""

    path: str
    adapter: str | None


def split_adapter(text: str) -> PathAndAdapter:
    """`"embedded:runs/nca"` -> ("embedded", "runs/nca"); a blank adapter after the colon is an error. A path that
    exists as given is never split (a local folder whose name holds a colon)."""
    if ":" in text and os.path.exists(text):
        return PathAndAdapter(text, None)
    path, _, adapter = text.partition(":")
    if adapter and not adapter.strip():
        raise EvalInputError(f"{text!r} is not PATH[:ADAPTER]: the adapter after ':' is blank.")
    return PathAndAdapter(path, adapter or None)


def last_component(path: str) -> str:
    """The last component of a path or Hub id (`runs/nca/` -> `nca`), empty for `/` or `.`."""
    return Path(path.rstrip("/\\")).name


def parse_model_specs(
    models: Sequence[str],
    adapters: Sequence[str] = (),
    *,
    inline_adapters: bool = False,
    first_name: str | None = None,
) -> list[ModelSpec]:
    """Named model specs from `--model` values (and the `--adapter` values of `trl-nca eval`); see the module
    docstring. `inline_adapters` reads `PATH:ADAPTER`; `first_name` names an unnamed first model."""
    if not models:
        raise EvalInputError("Give at least one --model.")
    given = [_parse_model(value, number, inline_adapters) for number, value in enumerate(models)]
    specs = [ModelSpec(name or "", path, adapter) for name, path, adapter in given]
    for spec in specs:
        if not spec.path:
            if specs[0] is spec:
                raise EvalInputError(
                    f"--model {models[0]!r}: the first model (the reference) needs weights, not ':ADAPTER'."
                )
            spec.path = specs[0].path
    if any(named.name is not None for named in map(split_name, adapters)):
        _name_models(specs, first_name)
        _check_unique_names(specs)
        _attach_named_adapters(specs, adapters)
    else:
        _attach_adapters_in_order(specs, adapters)
        _name_models(specs, first_name)
        _check_unique_names(specs)
    return specs


class _GivenModel(NamedTuple):
    name: str | None
    path: str
    adapter: str | None


def _parse_model(value: str, number: int, inline_adapters: bool) -> _GivenModel:
    name, rest = split_name(value)
    path, adapter = split_adapter(rest) if inline_adapters else PathAndAdapter(rest, None)
    if not rest:
        syntax = "NAME=PATH[:ADAPTER]" if inline_adapters else "NAME=PATH"
        raise EvalInputError(f"--model {value!r} gives no PATH; write {syntax}.")
    return _GivenModel(name, path, adapter)


def _name_models(specs: list[ModelSpec], first_name: str | None) -> None:
    """Give every unnamed model its default name (see the module docstring)."""
    for number, spec in enumerate(specs):
        if spec.name:
            continue
        if number == 0 and first_name is not None:
            spec.name = first_name
        else:
            spec.name = last_component(spec.adapter or spec.path) or f"model{number}"


def _attach_named_adapters(specs: list[ModelSpec], adapters: Sequence[str]) -> None:
    parsed = [split_name(value) for value in adapters]
    if any(named.name is None for named in parsed):
        raise EvalInputError("Either name every --adapter (NAME=PATH) or none of them.")
    by_name = {spec.name: spec for spec in specs}
    for name, path in parsed:
        if name not in by_name:
            raise EvalInputError(f"--adapter {name}=... names no model; the models are {sorted(by_name)}.")
        if not path:
            raise EvalInputError(f"--adapter {name}= gives no PATH; write --adapter {name}=PATH.")
        _set_adapter(by_name[name], path)


def _attach_adapters_in_order(specs: list[ModelSpec], adapters: Sequence[str]) -> None:
    if not adapters:
        return
    if len(adapters) != len(specs):
        raise EvalInputError(
            f"{len(adapters)} unnamed --adapter values for {len(specs)} models: give one per model ('none' for no "
            "adapter) or name them NAME=PATH."
        )
    for spec, path in zip(specs, adapters):
        if path.lower() not in NO_ADAPTER:
            _set_adapter(spec, path)


def _set_adapter(spec: ModelSpec, adapter: str) -> None:
    if spec.adapter is not None:
        raise EvalInputError(
            f"Model {spec.name or spec.path!r} gets two adapters ({spec.adapter!r} and {adapter!r}); give one."
        )
    spec.adapter = adapter


def _check_unique_names(specs: Sequence[ModelSpec]) -> None:
    names = [spec.name for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise EvalInputError(
            f"Model names must be unique, got {duplicates} more than once; name the models with NAME=PATH."
        )


def resolve_model_specs(specs: Sequence[ModelSpec]) -> list[ModelSpec]:
    """The specs with each PATH resolved by `trl_nca.models.names.resolve_model_name_or_path` ('embedded', 'organism',
    missing folders, Hub ids while offline) and each adapter checked, before any model is loaded; the weights files
    of local folders must be whole (`check_weights`)."""
    resolved = []
    for spec in specs:
        path = resolve_model_path(spec.path, f"Model {spec.name!r}:")
        if spec.adapter is not None:
            check_adapter(spec.adapter)
        check_weights(path, spec.adapter, f"Model {spec.name!r}")
        resolved.append(dataclasses.replace(spec, path=path))
    return resolved


def check_weights(path: str, adapter: str | None = None, what: str = "Model") -> None:
    """`trl_nca.inputs.check_weight_files` on a model folder and its adapter folder, raising `EvalInputError`."""
    try:
        check_weight_files(path, what)
        if adapter is not None:
            check_weight_files(adapter, f"{what}'s adapter")
    except InputError as error:
        raise EvalInputError(str(error)) from None


def resolve_model_path(name: str, what: str = "Model") -> str:
    """`trl_nca.models.names.resolve_model_name_or_path`, the resolver of every command, raising `EvalInputError`."""
    try:
        return resolve_model_name_or_path(name, what)
    except (ModelNotFoundError, EmbeddedModelUnavailableError) as error:
        raise EvalInputError(str(error)) from error


def check_adapter(adapter: str) -> None:
    """Fail early on an adapter that cannot load: a local path that does not exist, or a name that is no folder while
    the Hub is offline (Hub adapters pass)."""
    if Path(adapter).expanduser().exists():
        return
    if adapter.startswith(("/", "./", "../", "~")):
        raise EvalInputError(f"Adapter {adapter!r} not found: no such folder.")
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise EvalInputError(f"Adapter {adapter!r} not found (no such folder, and the Hub is offline).")


# ----------------------------------------------------------------------------------------------------------------------
# Models and tokenizers

DTYPES = ("auto", "float32", "bfloat16", "float16")


def load_model(
    model: str,
    adapter: str | None = None,
    *,
    dtype: str = "auto",
    device: str | None = None,
    trust_remote_code: bool = False,
    trainable_adapter: bool = False,
    base=None,
):
    """A causal LM in eval mode, with its PEFT adapter when given, on `device` (default: cuda if available).

    `dtype` is one of `DTYPES`. `trainable_adapter` loads the adapter's parameters with requires_grad (to
    differentiate them). With `base` (a model already loaded from `model`), the adapter goes onto a copy of it
    instead of loading the weights again.
    """
    if dtype not in DTYPES:
        raise EvalInputError(f"--dtype must be one of {list(DTYPES)}, got {dtype!r}.")
    loaded = copy.deepcopy(base) if base is not None else _load_weights(model, dtype, device, trust_remote_code)
    if adapter is not None:
        loaded = _load_adapter(loaded, adapter, trainable_adapter)
    loaded.eval()
    return loaded


def _load_weights(model: str, dtype: str, device: str | None, trust_remote_code: bool):
    from transformers import AutoModelForCausalLM

    model = resolve_model_path(model, "Model")
    torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)

    try:
        loaded = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, SafetensorError) as error:  # ValueError: an id the Hub client rejects as malformed
        raise EvalInputError(
            f"Model {model!r} could not be loaded ({_first_line(error)}). Give a local folder that holds a "
            "config.json and the weights (what `save_pretrained` writes), or a Hub id that is reachable or cached."
        ) from error
    return loaded.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def _load_adapter(model, adapter: str, trainable: bool):
    from peft import PeftModel

    check_adapter(adapter)
    try:
        return PeftModel.from_pretrained(model, adapter, is_trainable=trainable)
    except (OSError, ValueError) as error:
        raise EvalInputError(f"Adapter {adapter!r} could not be loaded: {error}") from error


def load_tokenizer(path: str, trust_remote_code: bool = False):
    """The tokenizer saved with a model (folder, Hub id or alias), with an error that names it when it cannot load."""
    from transformers import AutoTokenizer

    path = resolve_model_path(path, "Tokenizer")
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise EvalInputError(
            f"Tokenizer {path!r} could not be loaded ({_first_line(error)}). Give the folder or Hub id the tokenizer "
            "was saved with (tokenizer.json or tokenizer_config.json)."
        ) from error


def release_memory() -> None:
    """Free what models that were just dropped still hold: Python garbage, and cached CUDA blocks."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _first_line(error: BaseException) -> str:
    text = str(error)
    return f"{error.__class__.__name__}: {text.splitlines()[0]}" if text else error.__class__.__name__


# ----------------------------------------------------------------------------------------------------------------------
# Context


@dataclass(frozen=True)
class ContextChoice:
    """The context a command was given, and where it came from for the provenance: `builtin:NAME`, `file:PATH`,
    `text` or `column:NAME`."""

    spec: ContextSpec
    source: str


def context_from_options(
    *,
    column: str | None = None,
    text: str | None = None,
    file: str | None = None,
    placement: str | None = None,
    template: str | None = None,
    separator: str | None = None,
) -> ContextChoice:
    """The context of the options `--context-column`, `--context-text`, `--context-file` (a UTF-8 file, or a built-in
    context: 'medical', 'safety'), `--placement`, `--template` and `--separator`. A file wins over a text, a text over
    a column; None takes `ContextSpec`'s default (column `context`, system placement, its template and separator)."""
    layout = {"placement": placement, "template": template, "separator": separator}
    if column is None:
        column = ContextSpec().column
    try:
        if file:
            source = f"builtin:{file}" if file in BUILTIN_CONTEXTS else f"file:{Path(file)}"
            return ContextChoice(ContextSpec.from_options(column=None, text=read_context(file), **layout), source)
        if text is not None:
            return ContextChoice(ContextSpec.from_options(column=None, text=text, **layout), "text")
        return ContextChoice(ContextSpec.from_options(column=column, **layout), f"column:{column}")
    except EvalInputError:
        raise
    except (ValueError, TypeError, OSError) as error:
        raise EvalInputError(str(error)) from error


def context_from_args(args) -> ContextChoice:
    """`context_from_options` on a parsed command line with the context options of `trl-nca eval` and `trl-nca
    analyze` (`args.context_column`, `context_text`, `context_file`, `placement`, `template`, `separator`)."""
    return context_from_options(
        column=args.context_column,
        text=args.context_text,
        file=args.context_file,
        placement=args.placement,
        template=args.template,
        separator=args.separator,
    )


def check_device(device: str | None, option: str = "--device") -> None:
    """A `--device` this machine has: `cuda...` without a CUDA GPU visible to torch is an error naming the fix (it would
    fail only once the model is loaded)."""
    if device and str(device).startswith("cuda") and not torch.cuda.is_available():
        raise EvalInputError(
            f"{option} {device} asks for a CUDA GPU, and torch sees none on this machine. Give {option} cpu, or leave "
            f"{option} out (a GPU is used when there is one)."
        )
