"""The mechanistic measures: what distilling a context did inside a model, on fixed prompts and completions.

Every measure runs on `AnalysisItem`s: a prompt rendered without and with the context, and ONE completion (token
ids) shared by both views. The views are aligned exactly as `NCATrainer` aligns them (`trl_nca.core.views`): each view
is `[left-padded prompt of that view | the same right-padded completion ids]`, positions restart at 0 on each row's
first real token, and the hidden state at column `prompt_width - 1 + t` is the one that predicts completion token t.

- `compare_views`: per layer, the cosine similarity of the two views' hidden states at those positions (the output
  of each decoder layer; the last one is after the final norm, as Transformers returns it), and the per-token
  KL(q_x || q_c) between the two views' next-token distributions along the completion, computed in vocabulary
  chunks by `trl_nca.core.losses.token_divergences` (no (batch x sequence x vocabulary) tensor).
- `update_norms`: per layer and module type, ||W_student - W_base||_F / ||W_base||_F, from full weights or from a
  PEFT adapter (LoRA deltas B @ A * scaling as PEFT computes them, or a merged copy for other adapters).
- `opd_nca_gradient_cosine`: the cosine between the gradients of the OPD and the NCA token means (the trainer's
  divergences, `trl_nca.core.losses.DivergenceSpec`) flattened over the trainable parameters, on a batch of items.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from peft.tuners.lora import LoraLayer

from ..console import progress_bar
from ..core.gradients import compare_gradients, loss_gradients
from ..core.losses import DivergenceSpec, LMHead, token_divergences
from ..core.views import View, build_view, completion_hidden, left_pad, right_pad


@dataclass
class AnalysisItem:
    """One prompt in its two renderings and the completion both views score.

    `completion_source` says where the completion ids come from: `"sampled"` (generated here), `"records:ids"`
    (token ids stored in an evaluation record) or `"records:retokenized"` (re-tokenised from a record's text).
    """

    item_id: str
    prompt_ids_x: list[int]
    prompt_ids_xc: list[int]
    completion_ids: list[int]
    completion_source: str = "sampled"


@dataclass
class _Batch:
    view_x: View
    view_c: View
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor


def _batch(items: Sequence[AnalysisItem], pad_id: int, device) -> _Batch:
    """The trainer's alignment: each view's left-padded prompts joined to the same right-padded completions."""
    prompts_x, mask_x = left_pad([it.prompt_ids_x for it in items], pad_id)
    prompts_c, mask_c = left_pad([it.prompt_ids_xc for it in items], pad_id)
    ids, mask = right_pad([it.completion_ids for it in items], pad_id)
    ids, mask = ids.to(device), mask.to(device)
    view_x = build_view(prompts_x.to(device), mask_x.to(device), ids, mask)
    view_c = build_view(prompts_c.to(device), mask_c.to(device), ids, mask)
    return _Batch(view_x, view_c, ids, mask)


class DecoderStates(NamedTuple):
    """The decoder stack's output on a view: the final hidden states, and every layer's (None unless asked for;
    `layers[0]` is the embedding output)."""

    last: torch.Tensor
    layers: tuple[torch.Tensor, ...] | None


def _decoder(model, view: View, hidden_states: bool) -> DecoderStates:
    out = model.get_decoder()(
        input_ids=view.input_ids,
        attention_mask=view.attention_mask,
        position_ids=view.position_ids,
        use_cache=False,
        output_hidden_states=hidden_states,
    )
    return DecoderStates(out.last_hidden_state, out.hidden_states if hidden_states else None)


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _chunks(items: Sequence[Any], size: int):
    if size < 1:
        raise ValueError(f"batch_size must be at least 1, got {size}.")
    for start in range(0, len(items), size):
        yield start, items[start : start + size]


def _check_items(items: Sequence[AnalysisItem]) -> None:
    if not items:
        raise ValueError("No items to analyse: give at least one prompt with its completion.")
    for item in items:
        if not item.prompt_ids_x or not item.prompt_ids_xc:
            raise ValueError(f"Item {item.item_id!r} has an empty prompt in one of its views.")


def _progress(total: int, enabled: bool, desc: str):
    return progress_bar(total, desc, "item", enabled)


# ----------------------------------------------------------------------------------------------------------------------
# Hidden-state cosine and view KL


@dataclass
class TopToken:
    """A completion token where the context changes the next-token distribution most (largest KL(q_x || q_c))."""

    item_index: int
    position: int
    kl: float
    token_id: int
    logp_x: float = math.nan  # log q_x(token), the no-context view's log-probability of the completion token
    logp_c: float = math.nan  # log q_c(token)
    top_x: int = -1  # the no-context view's most likely token there, and its log-probability
    top_x_logp: float = math.nan
    top_c: int = -1  # the context view's most likely token there
    top_c_logp: float = math.nan


@dataclass
class ViewComparison:
    """Per-token results of `compare_views`, in item order then position order.

    `layer_cosine[n, l]` is the cosine of the two views' hidden states of token n at the output of decoder layer l
    (0-based, the index in the parameter names `model.layers.<l>`);
    `kl[n]` is KL(q_x || q_c) at token n (nats, at the given temperature); `item_index[n]` and `position[n]` say which
    item and which completion position (0-based) token n is.
    """

    layer_cosine: torch.Tensor
    kl: torch.Tensor
    item_index: torch.Tensor
    position: torch.Tensor
    top: list[TopToken] = field(default_factory=list)

    @property
    def num_layers(self) -> int:
        return self.layer_cosine.shape[1]

    def layer_summary(self, percentile: float = 5.0) -> dict[str, Any]:
        """Per decoder layer (0-based): the token-mean cosine, its `percentile`-th percentile (linear interpolation)
        and its minimum over tokens."""
        if not 0 <= percentile <= 100:
            raise ValueError(f"percentile must be within [0, 100], got {percentile}.")
        cos = self.layer_cosine.double()
        if cos.shape[0] == 0:
            nan = [math.nan] * self.num_layers
            return {"layers": list(range(self.num_layers)), "mean": nan, "percentile": nan, "min": nan}
        return {
            "layers": list(range(self.num_layers)),
            "mean": cos.mean(0).tolist(),
            "percentile": torch.quantile(cos, percentile / 100.0, dim=0).tolist(),
            "min": cos.min(0).values.tolist(),
        }

    def kl_summary(self, num_positions: int = 64) -> dict[str, Any]:
        """Token mean of the KL, its mean over the items' token means, and the mean at each of the first positions."""
        kl = self.kl.double()
        by_position = []
        for t in range(num_positions):
            at = kl[self.position == t]
            if at.numel() == 0:
                break
            by_position.append({"position": t, "mean": at.mean().item(), "tokens": at.numel()})
        items = self.item_index.unique()
        item_means = [kl[self.item_index == i].mean().item() for i in items.tolist()]
        return {
            "token_mean": kl.mean().item() if kl.numel() else math.nan,
            "item_mean": sum(item_means) / len(item_means) if item_means else math.nan,
            "max": kl.max().item() if kl.numel() else math.nan,
            "tokens": kl.numel(),
            "by_position": by_position,
        }


@torch.no_grad()
def compare_views(
    model,
    items: Sequence[AnalysisItem],
    *,
    pad_id: int,
    batch_size: int = 8,
    temperature: float = 1.0,
    top_tokens: int = 10,
    vocab_chunk: int = 8192,
    progress: bool = False,
    desc: str = "views",
) -> ViewComparison:
    """Hidden-state cosine per layer and per-token KL(q_x || q_c) between the no-context and the context view.

    Both are taken at the positions that predict the completion tokens (see the module docstring), i.e. on inputs
    that are the same tokens in both views; `temperature` divides the logits as in training. The `top_tokens` tokens
    with the largest KL come with each view's log-probability of the completion token and its most likely token.
    """
    _check_items(items)
    device = _device(model)
    was_training = model.training
    model.eval()
    head = LMHead.from_model(model)
    spec = DivergenceSpec(temperature=temperature)
    stats: list[_TokenStats] = []
    best: list[_TopCandidate] = []
    try:
        with _progress(len(items), progress, desc) as bar:
            for start, chunk in _chunks(items, batch_size):
                compared = _compare_batch(model, _batch(chunk, pad_id, device), start, head, spec, vocab_chunk)
                stats.append(compared.stats)
                best = sorted(best + compared.top_candidates(top_tokens), key=lambda c: -c.kl)[:top_tokens]
                bar.update(len(chunk))
        top = _top_tokens(best, head, temperature, vocab_chunk)
    finally:
        model.train(was_training)
    if not stats:
        empty = torch.zeros(0, dtype=torch.long)
        return ViewComparison(torch.zeros(0, 0), torch.zeros(0, dtype=torch.float64), empty, empty, top)
    return ViewComparison(
        layer_cosine=torch.cat([s.layer_cosine for s in stats]),
        kl=torch.cat([s.kl for s in stats]),
        item_index=torch.cat([s.item_index for s in stats]),
        position=torch.cat([s.position for s in stats]),
        top=top,
    )


@dataclass
class _TopCandidate:
    """A completion token that may be among the largest view KLs, with both views' final hidden states there (to
    compute its log-probabilities once the top tokens are known)."""

    kl: float
    item_index: int
    position: int
    token_id: int
    hidden_x: torch.Tensor
    hidden_c: torch.Tensor


@dataclass
class _TokenStats:
    """Per completion token of a batch (row-major, on the CPU): the cosine at each layer's output, the view KL
    (float64), the item and the position."""

    layer_cosine: torch.Tensor
    kl: torch.Tensor
    item_index: torch.Tensor
    position: torch.Tensor


@dataclass
class _BatchComparison:
    """`compare_views` on one batch: the token statistics kept, and what the top-KL tokens need from the batch (the
    token ids, the KL on its device, both views' final hidden states)."""

    stats: _TokenStats
    token_id: torch.Tensor
    kl: torch.Tensor
    hidden_x: torch.Tensor
    hidden_c: torch.Tensor

    def top_candidates(self, k: int) -> list[_TopCandidate]:
        """The batch's `k` tokens with the largest KL."""
        if k <= 0 or not self.kl.numel():
            return []
        return [
            _TopCandidate(
                kl=self.kl[i].item(),
                item_index=self.stats.item_index[i].item(),
                position=self.stats.position[i].item(),
                token_id=self.token_id[i].item(),
                hidden_x=self.hidden_x[i].clone(),
                hidden_c=self.hidden_c[i].clone(),
            )
            for i in self.kl.topk(min(k, self.kl.numel())).indices.tolist()
        ]


def _compare_batch(model, batch: _Batch, start: int, head: LMHead, spec: DivergenceSpec, vocab_chunk: int):
    """Both views of one batch through the decoder, compared at the completion tokens (items numbered from `start`)."""
    states_x = _decoder(model, batch.view_x, hidden_states=True)
    states_c = _decoder(model, batch.view_c, hidden_states=True)
    mask = batch.completion_mask
    per_layer = [  # in float32 at least (bfloat16 states), float64 for a float64 model
        F.cosine_similarity(
            completion_hidden(hx, batch.view_x, mask).to(torch.promote_types(hx.dtype, torch.float32)),
            completion_hidden(hc, batch.view_c, mask).to(torch.promote_types(hc.dtype, torch.float32)),
            dim=-1,
        )
        for hx, hc in zip(states_x.layers[1:], states_c.layers[1:])  # [0] is the embedding output: the same tokens
    ]
    h_x = completion_hidden(states_x.last, batch.view_x, mask)
    h_c = completion_hidden(states_c.last, batch.view_c, mask)
    kl = token_divergences(h_x, h_x, head, head, spec, h_c=h_c, terms=("view_kl",), vocab_chunk=vocab_chunk)["view_kl"]
    row, position = mask.bool().nonzero(as_tuple=True)  # row-major: the order of completion_hidden
    stats = _TokenStats(torch.stack(per_layer, dim=1).cpu(), kl.double().cpu(), (row + start).cpu(), position.cpu())
    return _BatchComparison(stats, batch.completion_ids[row, position], kl, h_x, h_c)


def _top_tokens(best: Sequence[_TopCandidate], head: LMHead, temperature: float, vocab_chunk: int) -> list[TopToken]:
    """Each view's log-probability of the completion token and its most likely token, for the few top-KL tokens."""
    if not best:
        return []
    tokens = torch.tensor([c.token_id for c in best], device=best[0].hidden_x.device)
    x = _token_logprobs(head, torch.stack([c.hidden_x for c in best]), tokens, temperature, vocab_chunk)
    c = _token_logprobs(head, torch.stack([c.hidden_c for c in best]), tokens, temperature, vocab_chunk)
    return [
        TopToken(
            item_index=candidate.item_index,
            position=candidate.position,
            kl=candidate.kl,
            token_id=candidate.token_id,
            logp_x=x.token[i].item(),
            logp_c=c.token[i].item(),
            top_x=x.top_id[i].item(),
            top_x_logp=x.top[i].item(),
            top_c=c.top_id[i].item(),
            top_c_logp=c.top[i].item(),
        )
        for i, candidate in enumerate(best)
    ]


class TokenLogprobs(NamedTuple):
    """Per row: log q(token), the id of the most likely token, and its log-probability."""

    token: torch.Tensor
    top_id: torch.Tensor
    top: torch.Tensor


def _token_logprobs(
    head: LMHead, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float, chunk: int
) -> TokenLogprobs:
    """log q(token), the argmax id and log q(argmax) per row, walking the vocabulary in chunks."""
    rows = hidden.shape[0]
    lse = hidden.new_full((rows,), float("-inf"), dtype=torch.float64)
    best = hidden.new_full((rows,), float("-inf"), dtype=torch.float64)
    best_id = torch.zeros(rows, dtype=torch.long, device=hidden.device)
    token_logit = hidden.new_full((rows,), float("nan"), dtype=torch.float64)
    for start in range(0, head.vocab_size, chunk):
        z = head.logits(hidden, start, start + chunk).double() / temperature
        lse = torch.logaddexp(lse, torch.logsumexp(z, dim=-1))
        value, index = z.max(dim=-1)
        better = value > best
        best = torch.where(better, value, best)
        best_id = torch.where(better, index + start, best_id)
        inside = (tokens >= start) & (tokens < start + z.shape[1])
        if inside.any():
            local = (tokens - start).clamp(0, z.shape[1] - 1)
            token_logit = torch.where(inside, z.gather(1, local[:, None])[:, 0], token_logit)
    return TokenLogprobs(token_logit - lse, best_id, best - lse)


# ----------------------------------------------------------------------------------------------------------------------
# Update norms

_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)\.")


class ParameterLocation(NamedTuple):
    """Where a parameter sits: its decoder layer (None outside the layers) and its module type."""

    layer: int | None
    module: str


def parameter_location(name: str) -> ParameterLocation:
    """The layer index (or None) and module type of a parameter name, e.g. `model.layers.3.self_attn.q_proj.weight`
    gives (3, "q_proj"); parameters outside the decoder layers (embeddings, final norm, LM head) have layer None."""
    parts = name.split(".")
    module = parts[-2] if len(parts) >= 2 and parts[-1] in ("weight", "bias") else parts[-1]
    match = _LAYER.search(name)
    return ParameterLocation(int(match.group(1)) if match else None, module)


@dataclass
class UpdateNorms:
    """||W_student - W_base||_F / ||W_base||_F per parameter, aggregated by (layer, module type), layer and module.

    Aggregates are over the concatenation of their parameters: sqrt(sum ||delta||^2) / sqrt(sum ||W||^2).
    `method` says how the student's weights were obtained: "weights" (compared parameter by parameter),
    "lora_delta" (the LoRA update B @ A * scaling of each adapted layer, as PEFT computes it) or "merged" (a merged
    copy of the adapter model).
    """

    method: str
    delta_sq: dict[str, float]
    base_sq: dict[str, float]

    @staticmethod
    def _relative(delta_sq: float, base_sq: float) -> float:
        if base_sq > 0:
            return math.sqrt(delta_sq / base_sq)
        return 0.0 if delta_sq == 0 else math.inf

    def _grouped(self, key: Callable[[str], Any]) -> dict[Any, float]:
        delta: dict[Any, float] = {}
        base: dict[Any, float] = {}
        for name in self.delta_sq:
            k = key(name)
            delta[k] = delta.get(k, 0.0) + self.delta_sq[name]
            base[k] = base.get(k, 0.0) + self.base_sq[name]
        return {k: self._relative(delta[k], base[k]) for k in delta}

    @property
    def total(self) -> float:
        return self._relative(sum(self.delta_sq.values()), sum(self.base_sq.values()))

    def summary(self) -> dict[str, Any]:
        """Relative norms by (layer, module type) as a matrix, by layer, by module type, outside the layers, overall."""
        cells = self._grouped(parameter_location)
        layers = sorted({layer for layer, _ in cells if layer is not None})
        modules = list(dict.fromkeys(module for layer, module in cells if layer is not None))
        matrix = [[cells.get((layer, module), math.nan) for module in modules] for layer in layers]
        by_layer = self._grouped(lambda name: parameter_location(name).layer)
        by_module = {
            module: value
            for module, value in self._grouped(
                lambda name: parameter_location(name).module if parameter_location(name).layer is not None else None
            ).items()
            if module is not None
        }
        outside = {module: value for (layer, module), value in cells.items() if layer is None}
        absolute = math.sqrt(sum(self.delta_sq.values()))
        return {
            "method": self.method,
            "layers": layers,
            "modules": modules,
            "relative": matrix,
            "by_layer": [by_layer[layer] for layer in layers],
            "by_module": by_module,
            "outside_layers": outside,
            "total": self.total,
            "total_absolute": absolute,
            "parameters": {
                name: {"relative": self._relative(d, self.base_sq[name]), "delta_norm": math.sqrt(d)}
                for name, d in self.delta_sq.items()
            },
        }


def _base_state(base) -> dict[str, torch.Tensor]:
    """The reference model's parameters by plain name (a PEFT model's base weights, adapter left out)."""
    if _is_peft(base):
        raise ValueError(
            "The reference (base) model carries a PEFT adapter; compare against plain weights. Merge the adapter "
            "into a copy (`merge_and_unload()`) and pass that as the base."
        )
    return dict(base.named_parameters())


def _is_peft(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


@torch.no_grad()
def update_norms(base, student, method: str = "auto") -> UpdateNorms:
    """Relative Frobenius norm of the student's update per parameter, against the base model's weights.

    `student` is a full model with the base's parameter names, or a PEFT model on (a copy of) the base. `method`:
    "auto" (LoRA deltas when every adapted layer is plain LoRA, else a merged copy), "lora_delta", "merged" or
    "weights". Parameters the two models share by name must have the same shape; any other difference in the
    parameter set is an error naming the parameters.
    """
    base_params = _base_state(base)
    student_weights = _student_weights(student, method)
    _check_same_parameters(base_params, student_weights.weights)
    delta_sq, base_sq = {}, {}
    for name, weight in base_params.items():
        value, lora_delta = student_weights.weights[name]
        if value.shape != weight.shape:
            raise ValueError(
                f"Parameter {name} has shape {tuple(value.shape)} in the student and {tuple(weight.shape)} in the base."
            )
        w = weight.detach().double()
        delta = value.detach().double().to(w.device) - w
        if lora_delta is not None:
            delta = delta + lora_delta.double().to(w.device)
        delta_sq[name] = float((delta * delta).sum())
        base_sq[name] = float((w * w).sum())
    return UpdateNorms(method=student_weights.method, delta_sq=delta_sq, base_sq=base_sq)


class StudentWeight(NamedTuple):
    """A student parameter by the base model's name: the layer's own weight, and the LoRA delta added to it (None
    for full weights and merged copies)."""

    weight: torch.Tensor
    lora_delta: torch.Tensor | None


class _StudentWeights(NamedTuple):
    method: str  # the `UpdateNorms.method` they were obtained by
    weights: dict[str, StudentWeight]


def _student_weights(student, method: str) -> _StudentWeights:
    """The student's parameters by the base model's names, by `method` ("auto" chosen here)."""
    if not _is_peft(student):
        if method not in ("auto", "weights"):
            raise ValueError(f"A full student is compared by its weights ('auto' or 'weights'), not {method!r}.")
        return _StudentWeights("weights", {name: StudentWeight(p, None) for name, p in student.named_parameters()})
    if method == "auto":
        method = "lora_delta" if _plain_lora(student) else "merged"
    if method == "lora_delta":
        return _StudentWeights(method, _lora_effective(student))
    if method == "merged":
        merged = copy.deepcopy(student).merge_and_unload()
        return _StudentWeights(method, {name: StudentWeight(p, None) for name, p in merged.named_parameters()})
    raise ValueError(f"A PEFT student is compared by 'lora_delta' or 'merged' (or 'auto'), not {method!r}.")


def _check_same_parameters(base_params: Mapping[str, Any], student_params: Mapping[str, Any]) -> None:
    missing = sorted(set(base_params) - set(student_params))
    extra = sorted(set(student_params) - set(base_params))
    if missing or extra:
        raise ValueError(
            "The student's parameters do not match the base model's: "
            + "; ".join(
                part
                for part in (
                    f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}" if missing else "",
                    f"not in the base {extra[:5]}{' ...' if len(extra) > 5 else ''}" if extra else "",
                )
                if part
            )
            + ". Compare models of the same architecture and size (a student trained from this base)."
        )


def _plain_lora(model) -> bool:
    """Whether every adapted layer of a PEFT model is plain LoRA (no DoRA, no other tuner, no modules_to_save)."""
    for module in model.modules():
        if hasattr(module, "modules_to_save") and getattr(module, "modules_to_save", None) is not None:
            if isinstance(module.modules_to_save, torch.nn.ModuleDict) and len(module.modules_to_save):
                return False
        if isinstance(module, LoraLayer):
            if any(module.use_dora.get(a, False) for a in module.active_adapters):
                return False
        elif type(module).__module__.startswith("peft.tuners") and hasattr(module, "get_base_layer"):
            return False  # an adapter layer of another tuner
    return any(isinstance(m, LoraLayer) for m in model.modules())


def _strip_peft_name(name: str) -> str:
    name = name.removeprefix("base_model.model.")
    return name.replace(".base_layer.", ".")


def _lora_effective(model) -> dict[str, StudentWeight]:
    """The student's parameters by the base model's names, each with the LoRA delta added to it."""
    deltas: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        delta = None
        for adapter in module.active_adapters:
            if adapter in module.lora_A or adapter in getattr(module, "lora_embedding_A", {}):
                d = module.get_delta_weight(adapter)
                delta = d if delta is None else delta + d
        if delta is not None:
            deltas[_strip_peft_name(name) + ".weight"] = delta
    out = {}
    for name, p in model.named_parameters():
        if ".lora_" in name:
            continue
        plain = _strip_peft_name(name)
        out[plain] = StudentWeight(p, deltas.pop(plain, None))
    if deltas:
        raise ValueError(f"LoRA deltas without a matching base weight: {sorted(deltas)[:5]}.")
    return out


# ----------------------------------------------------------------------------------------------------------------------
# OPD vs NCA gradient cosine


def trainable_parameters(model) -> list[torch.Tensor]:
    """The parameters training would update: those with requires_grad (a PEFT model's adapter, else every weight)."""
    return [p for p in model.parameters() if p.requires_grad]


def opd_nca_gradient_cosine(
    student,
    teacher,
    items: Sequence[AnalysisItem],
    *,
    pad_id: int,
    spec: DivergenceSpec | None = None,
    params: Sequence[torch.Tensor] | None = None,
    batch_size: int = 8,
    vocab_chunk: int = 8192,
    progress: bool = False,
    desc: str = "gradients",
) -> dict[str, Any]:
    """Cosine between the gradients of the OPD and the NCA token means over `items`, flattened over `params`.

    The losses are the trainer's (`token_divergences` with `spec`, default: reverse-KL OPD, NCA = KL(sg[q_x] || q_c)),
    averaged over every completion token of `items` (one batch, processed `batch_size` items at a time, gradients
    summed). The teacher scores the context view without gradient. `params` defaults to the student's trainable
    parameters. No `.grad` is written.
    """
    _check_items(items)
    spec = spec or DivergenceSpec()
    params = list(params) if params is not None else trainable_parameters(student)
    if not params:
        raise ValueError("The student has no trainable parameter (requires_grad=True) to take the gradients over.")
    device = _device(student)
    tokens = sum(len(it.completion_ids) for it in items)
    if tokens == 0:
        raise ValueError("The items have no completion token: there is no loss to differentiate.")
    sums = {"opd": [torch.zeros_like(p) for p in params], "nca": [torch.zeros_like(p) for p in params]}
    values = {"opd": 0.0, "nca": 0.0}
    was_training = student.training
    student.eval()
    teacher.eval()
    student_head, teacher_head = LMHead.from_model(student), LMHead.from_model(teacher)
    try:
        with _progress(len(items), progress, desc) as bar:
            for _, chunk in _chunks(items, batch_size):
                batch = _batch(chunk, pad_id, device)
                terms = _opd_and_nca_terms(student, teacher, batch, student_head, teacher_head, spec, vocab_chunk)
                for name in ("opd", "nca"):
                    loss = terms[name].sum() / tokens
                    values[name] += loss.item()
                    grads = loss_gradients(loss, params, retain_graph=name == "opd")
                    for acc, g in zip(sums[name], grads):
                        acc.add_(g)
                bar.update(len(chunk))
    finally:
        student.train(was_training)
    result = compare_gradients(sums["opd"], sums["nca"])
    return {
        "cosine": result.cosine,
        "norm_opd": result.norm_a,
        "norm_nca": result.norm_b,
        "opd_loss": values["opd"],
        "nca_loss": values["nca"],
        "num_params": result.num_params,
        "items": len(items),
        "tokens": tokens,
    }


def _opd_and_nca_terms(student, teacher, batch: _Batch, student_head, teacher_head, spec, vocab_chunk: int):
    """The per-token OPD and NCA divergences of one batch, with the student's graph (the teacher without gradient)."""
    mask = batch.completion_mask
    h_x = completion_hidden(_decoder(student, batch.view_x, False).last, batch.view_x, mask)
    h_c = completion_hidden(_decoder(student, batch.view_c, False).last, batch.view_c, mask)
    with torch.no_grad():
        h_t = completion_hidden(_decoder(teacher, batch.view_c, False).last, batch.view_c, mask)
    return token_divergences(
        h_x, h_t, student_head, teacher_head, spec, h_c=h_c, terms=("opd", "nca"), vocab_chunk=vocab_chunk
    )
