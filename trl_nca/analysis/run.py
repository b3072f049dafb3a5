"""Loading the models of an analysis and running every measure on one model (the Python API behind
`trl-nca analyze`)."""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..eval.cli import ModelSpec
from ..losses import DivergenceSpec
from .items import AnalysisInputError
from .measures import AnalysisItem, compare_views, opd_nca_gradient_cosine, update_norms


_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def parse_model_specs(values: Sequence[str]) -> list[ModelSpec]:
    """`NAME=PATH[:ADAPTER]` values; the first is the reference (named `base` unless named). An empty PATH
    (`NAME=:ADAPTER`) means the reference's weights. Names default to the adapter's or the path's last component."""
    if not values:
        raise AnalysisInputError("Give at least one --model (the first one is the reference, e.g. base=embedded).")
    specs: list[ModelSpec] = []
    for number, value in enumerate(values):
        name, sep, rest = value.partition("=")
        if not sep or not _NAME.match(name):
            name, rest = None, value
        path, _, adapter = rest.partition(":")
        adapter = adapter or None
        if not path:
            if not specs:
                raise AnalysisInputError(
                    f"--model {value!r}: the first model (the reference) needs weights, not ':ADAPTER'."
                )
            path = specs[0].path
        if not path or (adapter is not None and not adapter.strip()):
            raise AnalysisInputError(f"--model {value!r} is not NAME=PATH[:ADAPTER].")
        if name is None:
            name = "base" if number == 0 else (Path((adapter or path).rstrip("/\\")).name or f"model{number}")
        specs.append(ModelSpec(name, path, adapter))
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise AnalysisInputError(f"Model names must be unique, got {duplicates} more than once; name them NAME=PATH.")
    return specs


_DTYPES = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(
    path: str,
    adapter: str | None = None,
    *,
    dtype: str = "float32",
    device: str | None = None,
    base=None,
    trust_remote_code: bool = False,
):
    """A causal LM, with its PEFT adapter loaded trainable (its parameters are the ones training updates, which the
    gradient measure differentiates). With `base` (a model already loaded from `path`), the adapter goes onto a copy
    of it instead of loading the weights again."""
    from transformers import AutoModelForCausalLM

    from ..models import EmbeddedModelUnavailableError, ModelNotFoundError, resolve_model_name_or_path

    if dtype not in _DTYPES:
        raise AnalysisInputError(f"--dtype must be one of {sorted(_DTYPES)}, got {dtype!r}.")
    if base is not None:
        model = copy.deepcopy(base)
    else:
        try:
            resolved = resolve_model_name_or_path(path, "Model")
        except (ModelNotFoundError, EmbeddedModelUnavailableError) as error:
            raise AnalysisInputError(str(error)) from error
        try:
            model = AutoModelForCausalLM.from_pretrained(
                resolved, dtype=_DTYPES[dtype], trust_remote_code=trust_remote_code
            )
        except (OSError, ValueError) as error:
            raise AnalysisInputError(f"Model {path!r} could not be loaded: {str(error).splitlines()[0]}") from error
        model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if adapter is not None:
        from peft import PeftModel

        if not Path(adapter).expanduser().exists():
            raise AnalysisInputError(f"Adapter {adapter!r} not found: no such folder.")
        try:
            model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
        except (OSError, ValueError) as error:
            raise AnalysisInputError(f"Adapter {adapter!r} could not be loaded: {error}") from error
    model.eval()
    return model


@dataclass
class AnalysisOptions:
    """Settings shared by every measure.

    batch_size: items per forward. temperature: divides the logits before the KL and the divergences (as in
    training). percentile: the low percentile of the per-token hidden-state cosine reported per layer.
    top_tokens: rows of the table of tokens with the largest view KL. kl_positions: completion positions of the
    KL-by-position curve. grad_items: items (the first ones) forming the batch of the gradient cosine; 0 skips it.
    beta: the OPD divergence of the gradient measure (1 reverse KL, 0 forward KL, in between the generalized JSD).
    vocab_chunk: vocabulary columns per tile of the chunked divergences.
    """

    batch_size: int = 8
    temperature: float = 1.0
    percentile: float = 5.0
    top_tokens: int = 10
    kl_positions: int = 64
    grad_items: int = 8
    beta: float = 1.0
    vocab_chunk: int = 8192
    progress: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _decode(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False) if token_id >= 0 else ""


def analyze_model(
    name: str,
    model,
    items: Sequence[AnalysisItem],
    *,
    tokenizer,
    reference=None,
    teacher=None,
    options: AnalysisOptions | None = None,
) -> dict[str, Any]:
    """Every measure on one model: hidden-state cosine per layer, view KL (with the top tokens), the OPD-vs-NCA
    gradient cosine (teacher: `teacher`, default `reference`, default the model itself), and the update against
    `reference` (skipped when `reference` is None or the model itself)."""
    options = options or AnalysisOptions()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    views = compare_views(
        model, items, pad_id=pad_id, batch_size=options.batch_size, temperature=options.temperature,
        top_tokens=options.top_tokens, vocab_chunk=options.vocab_chunk, progress=options.progress,
        desc=f"{name}: views",
    )  # fmt: skip
    kl = views.kl_summary(options.kl_positions)
    kl["top_tokens"] = [
        {
            "item_id": items[t.item_index].item_id,
            "position": t.position,
            "kl": t.kl,
            "token": _decode(tokenizer, t.token_id),
            "token_id": t.token_id,
            "logp_x": t.logp_x,
            "logp_c": t.logp_c,
            "top_x": _decode(tokenizer, t.top_x),
            "top_x_logp": t.top_x_logp,
            "top_c": _decode(tokenizer, t.top_c),
            "top_c_logp": t.top_c_logp,
        }
        for t in views.top
    ]
    result: dict[str, Any] = {
        "items": len(items),
        "tokens": int(views.kl.numel()),
        "hidden_cosine": views.layer_summary(options.percentile),
        "view_kl": kl,
    }
    if options.grad_items > 0:
        teacher = teacher if teacher is not None else (reference if reference is not None else model)
        spec = DivergenceSpec(beta=options.beta, temperature=options.temperature)
        result["grad_cosine"] = opd_nca_gradient_cosine(
            model, teacher, items[: options.grad_items], pad_id=pad_id, spec=spec, batch_size=options.batch_size,
            vocab_chunk=options.vocab_chunk, progress=options.progress, desc=f"{name}: gradients",
        )  # fmt: skip
    if reference is not None and reference is not model:
        result["update"] = update_norms(reference, model).summary()
    return result
