"""Every measure on one model (`analyze_model`, the Python API behind `trl-nca analyze`), and the models' specs and
loading with the analysis' settings (the shared `trl_nca.eval.loading`)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..core.losses import DivergenceSpec
from ..eval import loading
from ..eval.loading import ModelSpec
from ..inputs import InputError
from .items import AnalysisInputError
from .measures import AnalysisItem, compare_views, opd_nca_gradient_cosine, update_norms


def parse_model_specs(values: Sequence[str]) -> list[ModelSpec]:
    """`[NAME=]PATH[:ADAPTER]` values; the first is the reference (named `base` unless named). An empty PATH
    (`NAME=:ADAPTER`) means the reference's weights. Other names default to the last path component of the adapter,
    else of the path (`trl_nca.eval.loading.parse_model_specs`, the parser of `trl-nca eval` too)."""
    with _as_analysis_input_error():
        return loading.parse_model_specs(values, inline_adapters=True, first_name="base")


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
    gradient measure differentiates), in float32 by default (cosines near 1 need the precision). With `base` (a model
    already loaded from `path`), the adapter goes onto a copy of it instead of loading the weights again. The loader
    of `trl-nca eval` too (`trl_nca.eval.loading.load_model`)."""
    with _as_analysis_input_error():
        return loading.load_model(
            path,
            adapter,
            dtype=dtype,
            device=device,
            trust_remote_code=trust_remote_code,
            trainable_adapter=True,
            base=base,
        )


@contextlib.contextmanager
def _as_analysis_input_error():
    """Bad input found by the shared loading code, raised as the analysis' error type."""
    try:
        yield
    except AnalysisInputError:
        raise
    except InputError as error:
        raise AnalysisInputError(str(error)) from error


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


def _top_token(tokenizer, items: Sequence[AnalysisItem], top) -> dict[str, Any]:
    """One of the tokens where the views differ most (`compare_views`' `top`), with its tokens decoded."""
    return {
        "item_id": items[top.item_index].item_id,
        "position": top.position,
        "kl": top.kl,
        "token": _decode(tokenizer, top.token_id),
        "token_id": top.token_id,
        "logp_x": top.logp_x,
        "logp_c": top.logp_c,
        "top_x": _decode(tokenizer, top.top_x),
        "top_x_logp": top.top_x_logp,
        "top_c": _decode(tokenizer, top.top_c),
        "top_c_logp": top.top_c_logp,
    }


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
        model,
        items,
        pad_id=pad_id,
        batch_size=options.batch_size,
        temperature=options.temperature,
        top_tokens=options.top_tokens,
        vocab_chunk=options.vocab_chunk,
        progress=options.progress,
        desc=f"{name}: views",
    )
    kl = views.kl_summary(options.kl_positions)
    kl["top_tokens"] = [_top_token(tokenizer, items, t) for t in views.top]
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
            model,
            teacher,
            items[: options.grad_items],
            pad_id=pad_id,
            spec=spec,
            batch_size=options.batch_size,
            vocab_chunk=options.vocab_chunk,
            progress=options.progress,
            desc=f"{name}: gradients",
        )
    if reference is not None and reference is not model:
        result["update"] = update_norms(reference, model).summary()
    return result
