"""Per-token OPD and NCA divergences computed from hidden states, chunked over tokens and the vocabulary.

Notation per completion token (all logits divided by the temperature T):
    q_x = student(. | x, y<t)      no-context view      (`h_x`)
    q_c = student(. | x, c, y<t)   context view         (`h_c`)
    f   = teacher(. | x, c, y<t)   no gradient          (`h_t`)

    OPD  (GKD's generalized JSD, `beta`):  beta=1 KL(q_x || f),  beta=0 KL(f || q_x),
         otherwise  beta * KL(f || m) + (1 - beta) * KL(q_x || m),  m = beta * f + (1 - beta) * q_x
    NCA  (default):  KL(sg[q_x] || q_c) = sum_v p(v) (log p(v) - log q_c(v)),  p = q_x detached
         options: anchor p = f ("DualOPD"), no stop-gradient, symmetric KL(p || q_c) + KL(q_c || p)

Total loss = mean over valid tokens of OPD + nca_beta * NCA (assembled by the trainer).

Output layers of different sizes: models that share a tokenizer may pad their output layers differently (Qwen2.5-7B
has 152064 rows, Qwen2.5-3B 151936, for 151665 tokens). The divergences then run over the first
V = min(V_student, V_teacher) rows, and every distribution is renormalised over those rows (its log-normaliser is the
logsumexp over them only); rows past V get no probability and no gradient. The caller checks that V covers the
tokenizer.

Logits never exist for the whole (batch x sequence x vocab): callers pass only the hidden states of valid completion
tokens, and each (tokens x vocab-chunk) tile is rebuilt from the hidden states when the backward pass needs it. The
log-normalisers come from a two-pass logsumexp whose backward also walks the vocabulary chunk by chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch.utils.checkpoint import checkpoint
from trl.trainer.utils import maybe_gather_lm_head_ctx


@dataclass(frozen=True)
class DivergenceSpec:
    """Which divergences to compute; see the module docstring for the formulas."""

    beta: float = 1.0
    temperature: float = 1.0
    top_k: int | None = None
    renormalize: bool = False
    nca_target: Literal["student", "teacher"] = "student"
    nca_divergence: Literal["forward_kl", "symmetric_kl"] = "forward_kl"
    nca_stop_gradient: bool = True


@dataclass
class LMHead:
    """How hidden states become logits: `softcap(scale * (h @ weight.T + bias))`, as the model's own head does.

    `constant=True` detaches the weight and bias at every use (the parameters themselves are kept, so that ZeRO-3 can
    still gather them): a teacher's head is a constant even when it is the student's own head (live self-teacher, tied
    or shared weights). `rows` restricts the head to its first `rows` output rows (the distribution is then the
    softmax over those rows only).
    """

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    scale: float = 1.0
    softcap: float | None = None
    constant: bool = False
    rows: int | None = None

    @classmethod
    def from_model(cls, model) -> LMHead:
        head = model.get_output_embeddings()
        if hasattr(head, "base_layer") or hasattr(head, "modules_to_save"):
            raise ValueError(
                "The output layer (lm_head) is wrapped by a PEFT adapter, which the chunked loss does not apply. Leave "
                "lm_head out of `target_modules` and `modules_to_save`."
            )
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        scale = _logit_multiplier(config)
        return cls(head.weight, getattr(head, "bias", None), scale, getattr(config, "final_logit_softcapping", None))

    @property
    def full_rows(self) -> int:
        """Rows of the weight (its full shape under ZeRO-3, where the parameter itself is an empty shard)."""
        return getattr(self.weight, "ds_shape", self.weight.shape)[0]

    @property
    def vocab_size(self) -> int:
        """Rows the distribution is defined over: `rows` when set, else every row of the weight."""
        return self.full_rows if self.rows is None else min(self.rows, self.full_rows)

    def logits(self, hidden: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Logits (at least float32) of the vocabulary slice [start, stop), before the temperature."""
        stop = self.vocab_size if stop is None else min(stop, self.vocab_size)
        # Under DeepSpeed ZeRO-3 the head's weight is sharded outside its module's forward: gather it for each tile.
        with maybe_gather_lm_head_ctx(self.weight, self.bias):
            weight = self.weight[start:stop]
            bias = None if self.bias is None else self.bias[start:stop]
            if self.constant:
                weight, bias = weight.detach(), None if bias is None else bias.detach()
            out = torch.nn.functional.linear(hidden, weight, bias)
        out = out.to(torch.promote_types(out.dtype, torch.float32))
        if self.scale != 1.0:
            out = out * self.scale
        if self.softcap is not None:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out


def _logit_multiplier(config) -> float:
    """The factor some architectures apply to the LM head's output before any softcap (1.0 for most)."""
    for name in ("logit_scale", "output_multiplier", "lm_head_multiplier"):  # Cohere, Muse Glimmer, Falcon-H1
        if getattr(config, name, None) is not None:
            return float(getattr(config, name))
    if getattr(config, "logits_scaling", None) is not None:  # Granite, MiniCPM3 divide; HyperCLOVA X multiplies
        scaling = float(config.logits_scaling)
        return scaling if getattr(config, "model_type", None) == "hyperclovax" else 1.0 / scaling
    return 1.0


class _ChunkedLogSumExp(torch.autograd.Function):
    """logsumexp over the vocabulary of `head(hidden) / T`, restricted to `support` when given, chunk by chunk."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, head, inv_t, support, chunk):
        lse = torch.full((hidden.shape[0],), float("-inf"), device=hidden.device, dtype=_acc(hidden))
        for start in range(0, head.vocab_size, chunk):
            logits = head.logits(hidden, start, start + chunk) * inv_t
            if support is not None:
                logits = logits.masked_fill(~_support_mask(support, start, logits.shape[1]), float("-inf"))
            lse = torch.logaddexp(lse, torch.logsumexp(logits, dim=-1))
        ctx.save_for_backward(hidden, lse)
        ctx.head, ctx.inv_t, ctx.support, ctx.chunk = head, inv_t, support, chunk
        return lse

    @staticmethod
    def backward(ctx, grad_lse):
        # d lse / d z_v = softmax(z)_v with z = head(h) / T; the chain rule through the head is written out so each
        # vocabulary slice costs two matmuls and writes its own rows of the weight gradient (no full-size zero fill).
        hidden, lse = ctx.saved_tensors
        head, inv_t, support, chunk = ctx.head, ctx.inv_t, ctx.support, ctx.chunk
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        grad_h = torch.zeros_like(hidden, dtype=_acc(hidden)) if need_h else None
        with maybe_gather_lm_head_ctx(head.weight, head.bias):
            # Allocated inside the gather: under ZeRO-3 the parameter is an empty shard outside it, while the gradient
            # must have the full shape that autograd recorded in the (gathered) forward.
            grad_w = torch.empty_like(head.weight) if need_w else None
            grad_b = torch.empty_like(head.bias) if need_b else None
            for grad in (grad_w, grad_b):
                if grad is not None:
                    grad[head.vocab_size :] = 0  # rows past the common vocabulary take no part
            _lse_backward_slices(hidden, lse, grad_lse, head, inv_t, support, chunk, grad_h, grad_w, grad_b)
        if grad_h is not None:
            grad_h = grad_h.to(hidden.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def _lse_backward_slices(hidden, lse, grad_lse, head, inv_t, support, chunk, grad_h, grad_w, grad_b):
    """Accumulate the gradients of `_ChunkedLogSumExp` slice by slice into the given buffers."""
    for start in range(0, head.vocab_size, chunk):
        z = head.logits(hidden, start, start + chunk)
        grad_z = torch.exp(z * inv_t - lse[:, None]) * (grad_lse[:, None] * inv_t)
        if support is not None:
            grad_z = grad_z * _support_mask(support, start, z.shape[1])
        grad_raw = grad_z * head.scale
        if head.softcap is not None:
            grad_raw = grad_raw * (1 - (z / head.softcap) ** 2)
        stop = start + z.shape[1]
        if grad_h is not None:
            grad_h += grad_raw @ head.weight[start:stop].to(grad_raw.dtype)
        if grad_w is not None:
            grad_w[start:stop] = (grad_raw.T @ hidden.to(grad_raw.dtype)).to(grad_w.dtype)
        if grad_b is not None:
            grad_b[start:stop] = grad_raw.sum(0).to(grad_b.dtype)


def _acc(t: torch.Tensor) -> torch.dtype:
    """Accumulation dtype: float32, or float64 when the inputs already are."""
    return torch.promote_types(t.dtype, torch.float32)


def _support_mask(support: torch.Tensor, start: int, width: int) -> torch.Tensor:
    """Boolean (tokens, width) mask of the support ids that fall in the vocabulary slice [start, start + width)."""
    mask = torch.zeros(support.shape[0], width, dtype=torch.bool, device=support.device)
    local = support - start
    inside = (local >= 0) & (local < width)
    rows = torch.arange(support.shape[0], device=support.device)[:, None].expand_as(support)
    mask[rows[inside], local[inside]] = True
    return mask


def _lse(hidden, head: LMHead, inv_t: float, support, chunk: int) -> torch.Tensor:
    return _ChunkedLogSumExp.apply(hidden, head.weight, head.bias, head, inv_t, support, chunk)


@torch.no_grad()
def top_k_support(hidden: torch.Tensor, head: LMHead, k: int, chunk: int) -> torch.Tensor:
    """Ids of the k largest logits per token, found chunk by chunk without building the full row."""
    best_val = hidden.new_full((hidden.shape[0], 0), float("-inf"), dtype=_acc(hidden))
    best_idx = torch.zeros((hidden.shape[0], 0), dtype=torch.long, device=hidden.device)
    for start in range(0, head.vocab_size, chunk):
        logits = head.logits(hidden, start, start + chunk)
        idx = torch.arange(start, start + logits.shape[1], device=hidden.device).expand_as(logits)
        vals, pos = torch.cat([best_val, logits], 1).topk(min(k, best_val.shape[1] + logits.shape[1]), dim=-1)
        best_val, best_idx = vals, torch.cat([best_idx, idx], 1).gather(1, pos)
    return best_idx


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """Elementwise terms of KL(p || q) from (finite) log-probabilities."""
    return p_log.exp() * (p_log - q_log)


def _opd_terms(ls: torch.Tensor, lt: torch.Tensor, beta: float) -> torch.Tensor:
    if beta == 1.0:
        return _kl(ls, lt)
    if beta == 0.0:
        return _kl(lt, ls)
    lm = torch.logaddexp(ls + math.log1p(-beta), lt + math.log(beta))
    return beta * _kl(lt, lm) + (1.0 - beta) * _kl(ls, lm)


def _chunk_terms(h_x, h_c, h_t, lse_x, lse_c, lse_t, start, width, student, teacher, spec, support, want):
    """Per-token partial sums over the vocabulary slice [start, start + width) of the requested divergences."""
    inv_t = 1.0 / spec.temperature
    stop = start + width
    ls = student.logits(h_x, start, stop) * inv_t - lse_x[:, None]
    lt = teacher.logits(h_t, start, stop) * inv_t - lse_t[:, None]
    mask = None if support is None else _support_mask(support, start, ls.shape[1])

    def total(terms):
        return (terms if mask is None else terms * mask).sum(-1)

    out = []
    if "opd" in want:
        out.append(total(_opd_terms(ls, lt, spec.beta)))
    if h_c is not None:
        lc = student.logits(h_c, start, stop) * inv_t - lse_c[:, None]
        if "nca" in want:
            anchor = lt if spec.nca_target == "teacher" else (ls.detach() if spec.nca_stop_gradient else ls)
            nca = _kl(anchor, lc)
            if spec.nca_divergence == "symmetric_kl":
                nca = nca + _kl(lc, anchor)
            out.append(total(nca))
        if "view_kl" in want:
            out.append(total(_kl(ls.detach(), lc.detach())))
    if "entropy" in want:
        lx = ls.detach()
        out.append(total(-(lx.exp() * lx)))  # entropy of q_x, -sum_v q_x(v) log q_x(v), no gradient
    return tuple(out)


def token_divergences(
    h_x: torch.Tensor,
    h_t: torch.Tensor,
    student: LMHead,
    teacher: LMHead,
    spec: DivergenceSpec,
    h_c: torch.Tensor | None = None,
    want: tuple[str, ...] = ("opd", "nca", "view_kl"),
    vocab_chunk: int = 8192,
    token_chunk: int = 2048,
) -> dict[str, torch.Tensor]:
    """Per-token divergences (each of shape (num_tokens,)) for the tokens whose hidden states are given.

    `h_x`, `h_c` are the student's hidden states of the same completion tokens in the no-context and context views,
    `h_t` the teacher's. The teacher is a constant: neither `h_t` nor the teacher's head receives gradient, also when
    the teacher's head is the student's own (a live self-teacher). `want` selects among "opd", "nca", "view_kl"
    (KL(q_x || q_c), no gradient, for monitoring) and "entropy" (of q_x, no gradient; over the support with top-k);
    "nca" and "view_kl" need `h_c`. Gradients reach `h_x` only through OPD (and NCA without stop-gradient)
    and `h_c` only through NCA.
    """
    # In the order _chunk_terms appends them; the context terms only with a context view.
    order = ("opd", "nca", "view_kl", "entropy")
    want = tuple(w for w in order if w in want and (w in ("opd", "entropy") or h_c is not None))
    # Output layers padded to different sizes: both distributions live on the first `vocab` rows (module docstring).
    vocab = min(student.vocab_size, teacher.vocab_size)
    student = replace(student, rows=vocab)
    # The teacher is a constant in every parameter, also when its head is the student's (live self-teacher).
    teacher = replace(teacher, constant=True, rows=vocab)
    results: dict[str, list[torch.Tensor]] = {w: [] for w in want}
    inv_t = 1.0 / spec.temperature
    h_t = h_t.detach()
    # Under ZeRO-3 the heads stay gathered for the whole forward, so autograd records their full shapes; the tiles
    # that the backward pass rebuilds gather them again (see LMHead.logits).
    with maybe_gather_lm_head_ctx(student.weight, student.bias, teacher.weight, teacher.bias):
        for t0 in range(0, h_x.shape[0], token_chunk):
            hx, ht = h_x[t0 : t0 + token_chunk], h_t[t0 : t0 + token_chunk]
            hc = None if h_c is None else h_c[t0 : t0 + token_chunk]
            support = top_k_support(hx, student, spec.top_k, vocab_chunk) if spec.top_k else None
            lse_support = support if spec.renormalize else None
            lse_x = _lse(hx, student, inv_t, lse_support, vocab_chunk)
            lse_c = None if hc is None else _lse(hc, student, inv_t, lse_support, vocab_chunk)
            with torch.no_grad():
                lse_t = _lse(ht, teacher, inv_t, lse_support, vocab_chunk)
            sums = [hx.new_zeros(hx.shape[0], dtype=_acc(hx)) for _ in want]
            for start in range(0, vocab, vocab_chunk):
                width = min(vocab_chunk, vocab - start)
                parts = checkpoint(
                    _chunk_terms,
                    hx, hc, ht, lse_x, lse_c, lse_t, start, width, student, teacher, spec, support, want,
                    use_reentrant=False,
                )  # fmt: skip
                sums = [s + p for s, p in zip(sums, parts)]
            for name, value in zip(want, sums):
                results[name].append(value)
        # An empty completion block still returns tensors wired to the student, so a backward pass (and DDP's
        # reducer) sees every parameter; built while the head is gathered, so its gradient has the full shape.
        wired = student.weight.sum() + (0 if student.bias is None else student.bias.sum())
        empty = (h_x.sum(-1) + wired).to(_acc(h_x)) * 0
    return {name: torch.cat(chunks) if chunks else empty for name, chunks in results.items()}
