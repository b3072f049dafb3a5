"""Exact shared-prefix reuse: the tokens every row of a view begins with are run once, at batch size 1.

The rows of a micro-batch usually begin with the same tokens: the chat template's opening, a system message, a
context shared by the whole batch (one system prompt for a dataset, one experience text for every game step). A view
(`trl_nca.core.views.View`: left-padded prompts, then the shared completion block) is split into

    prefix  the longest run of tokens that every row's prompt starts with, one row, positions 0..P-1
    suffix  each row's remaining prompt tokens, left-padded again, then the same completion block; positions continue
            at P; the attention mask covers the prefix's P columns (all ones) and then the suffix's own columns

The prefix runs once and leaves its keys and values (after the rotary embedding) in a cache; the suffix runs against
them, each layer reading `cat(prefix expanded to the batch, suffix)`. So the padding sits between prefix and suffix,
every real token has the position and sees exactly the keys it has in the unshared view, and the hidden states of the
completion tokens equal those of the unshared forward (to float rounding: a float64 model agrees to about 1e-15). The
prefix's keys and values keep their autograd history, and the backward of `expand` sums the rows' gradients into the
one prefix pass, so a student's prefix runs its backward once too.

The cache the suffix reads is read-only (`update` returns the concatenation and stores nothing), so it can be read
again: by a layer recomputed under non-reentrant gradient checkpointing, and, for a teacher whose weights and prefix
have not changed, by the next step (`PrefixSharing.completion_states(..., persist=...)`).

Where sharing cannot be exact the forward runs unshared, and the reason is logged once (`PrefixSharing.unshared`):
sliding-window or other non-full attention layers (key distances count the padding between prefix and suffix), a
decoder whose forward takes no cache or no position ids, attention implementations other than eager and sdpa (not
verified here), active dropout (the rows would share the prefix's dropout draws), reentrant gradient checkpointing
(the cache is not a checkpointed input, so the prefix would get no gradient), and a model that ignored the cache
(detected after the forward, which is then redone unshared).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.cache_utils import Cache, CacheLayerMixin

from .launch import agreed_min
from .views import View, completion_hidden, completion_states, position_ids_from_mask


logger = logging.getLogger(__name__)

SUPPORTED_ATTENTION = ("eager", "sdpa")


@dataclass
class SplitView:
    """A view split into its shared prefix (one row) and the rows' suffixes (`suffix.position_ids` start at
    `length`; `suffix.attention_mask` covers the suffix columns only)."""

    prefix_ids: torch.Tensor
    suffix: View

    @property
    def length(self) -> int:
        return self.prefix_ids.shape[1]


def shared_prefix_length(view: View) -> int:
    """Tokens that every row's prompt starts with, at most the shortest prompt minus one (so each row's last prompt
    token, whose hidden state predicts the first completion token, stays in its suffix). 0 for a single row, or when
    the prompts are not left-padded."""
    width = view.prompt_width
    ids, mask = view.input_ids[:, :width], view.attention_mask[:, :width].bool()
    rows = ids.shape[0]
    if rows < 2 or width == 0:
        return 0
    lengths = mask.sum(1)
    starts = width - lengths
    columns = torch.arange(width, device=ids.device)
    if not torch.equal(mask, columns[None, :] >= starts[:, None]):
        return 0  # not left-padded: no common start column to line the rows up on
    limit = int(lengths.min()) - 1
    if limit <= 0:
        return 0
    heads = ids.gather(1, starts[:, None] + torch.arange(limit, device=ids.device)[None, :])
    same = (heads == heads[:1]).all(0)
    return limit if bool(same.all()) else int((~same).nonzero()[0, 0])


def split_view(view: View, length: int) -> SplitView:
    """Split `view` after its first `length` shared prompt tokens (`0 < length <= shared_prefix_length(view)`)."""
    width = view.prompt_width
    mask = view.attention_mask
    lengths = mask[:, :width].sum(1)
    start = int((width - lengths).min())  # first column any row uses
    prefix_ids = view.input_ids[:1, width - int(lengths[0]) : width - int(lengths[0]) + length]
    # Keep the columns from the first suffix token of the longest row on; in each row, columns before its own suffix
    # (its prefix tokens or its padding) are masked out and become padding between prefix and suffix.
    first = start + length
    suffix_width = width - first
    columns = torch.arange(first, view.input_ids.shape[1], device=mask.device)
    keep = columns[None, :] >= (width - lengths + length)[:, None]
    suffix_mask = mask[:, first:] * keep.to(mask.dtype)
    suffix_ids = view.input_ids[:, first:]
    positions = position_ids_from_mask(suffix_mask) + length
    return SplitView(prefix_ids, View(suffix_ids, suffix_mask, positions, suffix_width))


class _RecordingLayer(CacheLayerMixin):
    """Cache layer of the prefix pass: keeps the keys and values it is given (overwriting, so a layer recomputed
    under gradient checkpointing records the same thing again) and returns them unchanged."""

    is_sliding = False
    is_compileable = False
    supports_early_init = False

    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        self.keys, self.values, self.is_initialized = key_states, value_states, True
        return key_states, value_states

    def get_seq_length(self) -> int:
        return 0  # the prefix pass starts from an empty cache

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0

    def get_max_length(self) -> int:
        return -1


class _PrefixLayer(_RecordingLayer):
    """Cache layer of the suffix pass: returns `cat(prefix keys expanded to the batch, new keys)` and stores nothing,
    so it can be read any number of times; counts its reads (a model that ignores the cache reads it zero times)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.keys, self.values, self.is_initialized = keys, values, True
        self.reads = 0

    def update(self, key_states, value_states, *args, **kwargs):
        self.reads += 1
        rows = key_states.shape[0]
        keys = torch.cat([self.keys.expand(rows, -1, -1, -1), key_states], dim=-2)
        values = torch.cat([self.values.expand(rows, -1, -1, -1), value_states], dim=-2)
        return keys, values

    def get_seq_length(self) -> int:
        return self.keys.shape[-2]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[-2] + query_length, 0


def _cache(layers) -> Cache:
    return Cache(layers=list(layers))


def _recording_cache(num_layers: int):
    return _cache(_RecordingLayer() for _ in range(num_layers))


@dataclass
class _Prefix:
    """The recorded keys and values of one prefix, per layer, (1, kv_heads, P, head_dim) each."""

    ids: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    def cache(self):
        return _cache(_PrefixLayer(k, v) for k, v in zip(self.keys, self.values))


def _text_config(model):
    config = model.config
    return config.get_text_config(decoder=True)


def _layer_kinds(config) -> list[str]:
    kinds = getattr(config, "layer_types", None)
    if kinds is None:
        if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
            return ["sliding_attention"]
        if getattr(config, "attention_chunk_size", None) is not None:
            return ["chunked_attention"]
        return ["full_attention"]
    return list(kinds)


def active_dropout(model: nn.Module, config=None, training: bool | None = None) -> str | None:
    """The first dropout of `model` that a forward in training mode draws (`training`: whether the model is in training
    mode; default: its current mode), as "module NAME (p=P)" or "config.KEY=P"; None without one.

    The dropout of a LoRA layer whose adapters are disabled is not drawn (the layer runs its base layer alone: the
    LoRA self-teacher), so it does not count."""
    if not (model.training if training is None else training):
        return None
    config = _text_config(model) if config is None else config
    skipped: set[int] = set()
    for module in model.modules():
        if getattr(module, "disable_adapters", False) is True and isinstance(
            getattr(module, "lora_dropout", None), nn.Module
        ):
            skipped.update(id(m) for m in module.lora_dropout.modules())
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0 and id(module) not in skipped:
            return f"module {name} (p={module.p})"
    for key, value in config.to_dict().items():
        if "dropout" in key and isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return f"config.{key}={value}"
    return None


def _checkpointed_layers(decoder: nn.Module) -> list[nn.Module]:
    """The decoder's layers that checkpoint their forward (transformers' `GradientCheckpointingLayer`s). Imported here:
    `transformers.modeling_layers` imports transformers' whole modeling stack (measured: about as long as importing
    this module and everything it imports), which the evaluation and the games, which import this module, never
    need."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in decoder.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


def _checkpoint_problem(layers: list[nn.Module], gradients: bool) -> str | None:
    """None when every checkpointed layer can be told to keep a cache and, for a forward with `gradients`, uses
    non-reentrant torch checkpointing (without gradients nothing is recomputed, so any checkpoint function is fine)."""
    for layer in layers:
        if not hasattr(type(layer), "_can_checkpoint_with_cache"):
            return (
                f"gradient checkpointing is on and this transformers version drops the cache inside a checkpointed "
                f"{type(layer).__name__}"
            )
        if not gradients:
            continue
        func = getattr(layer, "_gradient_checkpointing_func", None)
        if not (
            isinstance(func, functools.partial)
            and func.func is checkpoint
            and func.keywords.get("use_reentrant") is False
        ):
            return (
                "gradient checkpointing is reentrant (or not torch's own), and a reentrant checkpoint passes no "
                "gradient to the prefix's keys and values; set gradient_checkpointing_kwargs={'use_reentrant': False}"
            )
    return None


@contextmanager
def _cache_kept_under_checkpointing(layers: list[nn.Module]) -> Iterator[None]:
    """transformers drops the cache of a checkpointed layer unless the layer says it only reads it (a recomputed layer
    would write a second time). Both caches here can be written twice with the same result (the recording layer
    overwrites, the prefix layer stores nothing), so the layers may keep them while these passes are built.

    Which forwards drop it depends on the transformers version: up to 5.17 (at least) a checkpointed layer drops the
    cache whenever the module is in training mode, even under `no_grad` (a self-teacher's or a teacher's forward in a
    training step); later versions only when gradients are enabled. So the layers are told in training mode, with or
    without gradients, and sharing holds on every version `pyproject.toml` admits."""
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache


def tensor_versions(tensors: Iterable[torch.Tensor]) -> tuple:
    """Changes whenever one of `tensors` is modified in place (an optimizer step, `load_state_dict`) or given new
    storage: their version counters and data pointers."""
    return tuple((t._version, t.data_ptr()) for t in tensors)


def sharing_problem(model: nn.Module) -> tuple[str, str] | None:
    """(kind, reason) that makes shared-prefix reuse inexact or unsupported for `model` in its current mode (training or
    evaluation, gradients on or off); None when its prefix can be shared. Also used for sampling
    (`trl_nca.core.sampling.shared_prefill`)."""
    decoder = model.get_decoder()
    params = inspect.signature(decoder.forward).parameters
    if not ({"cache", "past_key_values"} & set(params)) or "position_ids" not in params:
        return "no-cache", f"{type(decoder).__name__}.forward takes no key/value cache or no position ids"
    config = _text_config(model)
    kinds = _layer_kinds(config)
    if any(kind != "full_attention" for kind in kinds):
        return "attention-kind", (
            f"its layers are {sorted(set(kinds))}, not all full attention: a sliding or chunked window counts "
            "the padding between prefix and suffix as distance"
        )
    implementation = getattr(config, "_attn_implementation", None) or "eager"
    if implementation not in SUPPORTED_ATTENTION:
        return "attention-implementation", (
            f"the attention implementation {implementation!r} is not verified with it (only {SUPPORTED_ATTENTION})"
        )
    dropout = active_dropout(model, config)
    if dropout is not None:
        return "dropout", f"dropout is active ({dropout}): the rows would share the prefix's dropout draws"
    if model.training:  # checkpointed layers may drop the cache in training mode, gradients or not
        problem = _checkpoint_problem(_checkpointed_layers(decoder), gradients=torch.is_grad_enabled())
        if problem is not None:
            return "checkpointing", problem
    return None


class PrefixSharing:
    """Runs the views of a trainer with their shared prefix once (see the module docstring), or unshared.

    `enabled=False` always runs unshared. A prefix shorter than `min_tokens` is not worth a separate pass and runs
    unshared. Each reason for running unshared is logged once per view name (`what`).
    """

    def __init__(self, enabled: bool = True, min_tokens: int = 32):
        self.enabled = enabled
        self.min_tokens = min_tokens
        self._logged: set[tuple[str, str]] = set()
        self._kept: dict[str, tuple[Hashable, _Prefix]] = {}
        self.last_shared: dict[str, int] = {}  # prefix length of the last forward of each view (0: unshared)

    def unshared(self, what: str, kind: str, reason: str, level: int = logging.WARNING) -> None:
        """Log once per (view, kind) why `what` runs without prefix sharing."""
        if (what, kind) in self._logged:
            return
        self._logged.add((what, kind))
        logger.log(level, "Shared-prefix reuse is off for the %s: %s. It runs unshared (logged once).", what, reason)

    def problem(self, model: nn.Module) -> tuple[str, str] | None:
        """(kind, reason) that makes sharing inexact or unsupported for `model` now; None when it can share."""
        return sharing_problem(model)

    def completion_states(
        self, model: nn.Module, view: View, completion_mask: torch.Tensor, what: str, persist: Hashable | None = None
    ) -> torch.Tensor:
        """`trl_nca.core.views.completion_states` of `view`, with its shared prefix run once when that is exact.

        `persist`: a key that stays equal while the model's weights do (see `tensor_versions`); without gradient,
        the prefix's keys and values are then kept for the next call with the same key and the same prefix tokens.
        """
        self.last_shared[what] = 0
        if not self.enabled:
            return completion_states(model, view, completion_mask)
        length = self._local_length(model, view, what)
        # Under ZeRO-3 every module call is a collective: all ranks share a prefix of one agreed length, or none does.
        agreed = agreed_min([length], view.input_ids.device)[0]
        if agreed < length:
            self.unshared(
                what,
                "other-rank",
                "another process cannot share as long a prefix (its rows share fewer tokens, or "
                "its forward cannot share), and every process must run the same forwards",
                level=logging.INFO,
            )
        length = agreed
        if length == 0:
            return completion_states(model, view, completion_mask)
        split = split_view(view, length)
        decoder = model.get_decoder()
        config = _text_config(model)
        cache_arg = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
        checkpointed = _checkpointed_layers(decoder) if model.training else []
        with _cache_kept_under_checkpointing(checkpointed):
            prefix = self._prefix(decoder, config, split, cache_arg, what, persist)
            if prefix is None:
                return completion_states(model, view, completion_mask)
            cache = prefix.cache()
            suffix = split.suffix
            rows = suffix.input_ids.shape[0]
            ones = suffix.attention_mask.new_ones(rows, split.length)
            output = decoder(
                input_ids=suffix.input_ids,
                attention_mask=torch.cat([ones, suffix.attention_mask], dim=1),
                position_ids=suffix.position_ids,
                use_cache=False,
                **{cache_arg: cache},
            )
        if any(layer.reads == 0 for layer in cache.layers):
            self._kept.pop(what, None)
            self.unshared(what, "cache-ignored", f"{type(decoder).__name__} ignored the key/value cache")
            return completion_states(model, view, completion_mask)
        self.last_shared[what] = split.length
        return completion_hidden(output[0], suffix, completion_mask)

    def _local_length(self, model: nn.Module, view: View, what: str) -> int:
        """The prefix length this process could share (0: none), before the processes agree."""
        length = shared_prefix_length(view)
        if length == 0 and view.input_ids.shape[0] < 2:
            return 0
        if length < self.min_tokens:
            self.unshared(
                what,
                "short",
                f"its rows share only {length} prompt tokens, fewer than share_prefix_min_tokens={self.min_tokens}",
                level=logging.INFO,
            )
            return 0
        problem = self.problem(model)
        if problem is not None:
            self.unshared(what, *problem)
            return 0
        return length

    def _prefix(self, decoder, config, split: SplitView, cache_arg: str, what: str, persist) -> _Prefix | None:
        """The prefix's keys and values: kept from an earlier call (same key, same tokens, no gradient) or recorded.
        A kept prefix is reused only where every process can reuse its own, so all run the prefix pass or none does."""
        keep = persist is not None and not torch.is_grad_enabled()
        if keep:
            kept = self._kept.get(what)
            reusable = kept is not None and kept[0] == persist and torch.equal(kept[1].ids, split.prefix_ids)
            if agreed_min([reusable], split.prefix_ids.device)[0]:
                return kept[1]
        self._kept.pop(what, None)
        layers = config.num_hidden_layers
        cache = _recording_cache(layers)
        ids = split.prefix_ids
        decoder(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            position_ids=torch.arange(ids.shape[1], device=ids.device)[None, :],
            use_cache=False,
            **{cache_arg: cache},
        )
        recorded = cache.layers
        if len(recorded) != layers or any(
            layer.keys is None or layer.keys.shape[-2] != ids.shape[1] or layer.keys.shape[0] != 1 for layer in recorded
        ):
            self.unshared(what, "cache-not-filled", f"{type(decoder).__name__} ignored the key/value cache")
            return None
        prefix = _Prefix(ids.clone(), [layer.keys for layer in recorded], [layer.values for layer in recorded])
        if keep:
            self._kept[what] = (persist, prefix)
        return prefix
