"""Per-token OPD and NCA divergences computed from hidden states, chunked over tokens and the vocabulary.

Notation per completion token (all logits divided by the temperature T):
    q_x = student(. | x, y<t)      no-context view      (`h_x`)
    q_c = student(. | x, c, y<t)   context view         (`h_c`)
    f   = teacher(. | x, c, y<t)   no gradient          (`h_t`)

    OPD  (GKD's generalized JSD, `beta`):  beta=1 KL(q_x || f),  beta=0 KL(f || q_x),
         otherwise  beta * KL(f || m) + (1 - beta) * KL(q_x || m),  m = beta * f + (1 - beta) * q_x
    NCA  (default):  KL(sg[q_x] || q_c) = sum_v p(v) (log p(v) - log q_c(v)),  p = q_x detached
         options: anchor p = f ("DualOPD"), no stop-gradient, and the divergence between p and q_c, by name from
         `NCA_DIVERGENCES` (`forward_kl`: the KL above; `symmetric_kl`: KL(p || q_c) + KL(q_c || p))

Total loss = mean over valid tokens of OPD + nca_beta * NCA (assembled by the trainer).

Output layers of different sizes: models that share a tokenizer may pad their output layers differently (Qwen2.5-7B
has 152064 rows, Qwen2.5-3B 151936, for 151665 tokens). The divergences then run over the first
V = min(V_student, V_teacher) rows, and every distribution is renormalised over those rows (its log-normaliser is the
logsumexp over them only); rows past V get no probability and no gradient. The caller checks that V covers the
tokenizer.

Logits never exist for the whole (batch x sequence x vocab): callers pass only the hidden states of valid completion
tokens, and each (tokens x vocab-chunk) tile is built from the hidden states when it is needed, in the forward and
again in the backward pass (`_TiledDivergences`). Under DeepSpeed ZeRO-3 the output layers are gathered once for the
forward of a call and once for its backward.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

import torch
from torch.autograd.function import once_differentiable
from trl.trainer.utils import maybe_gather_lm_head_ctx


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """Elementwise terms of KL(p || q) from (finite) log-probabilities."""
    return p_log.exp() * (p_log - q_log)


@dataclass(frozen=True)
class AnchorDivergence:
    """One divergence the NCA term can use between its anchor and the context view q_c.

    `terms(anchor, context)` takes the log-probabilities of one (tokens x vocabulary-slice) tile, the anchor's (already
    detached where the anchor is a constant) and q_c's, and returns the tile's elementwise terms: the tiling sums them
    over the vocabulary (or the top-k support) and autograd derives their gradient, so the function is all a new
    divergence needs. It must be a sum over the vocabulary of elementwise terms (as every f-divergence is), written
    with torch operations that keep the input's dtype. `help` is its sentence in the config's help and the docs.
    """

    name: str
    terms: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    help: str


# The NCA term's divergences by name (`DivergenceSpec.nca_divergence`, the config's `nca_divergence`), in the order the
# docs list them. `register_divergence` adds one.
NCA_DIVERGENCES: dict[str, AnchorDivergence] = {}


def register_divergence(name: str, help: str):
    """Decorator: register `terms(anchor, context) -> elementwise terms` as the NCA divergence `name` (see
    `AnchorDivergence`). The config accepts the name from then on; a name already taken is refused."""

    def register(terms):
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"A divergence's name must be a Python identifier (it is a config value), got {name!r}.")
        if name in NCA_DIVERGENCES:
            raise ValueError(f"The NCA divergence {name!r} is already registered; choose another name.")
        NCA_DIVERGENCES[name] = AnchorDivergence(name, terms, help)
        return terms

    return register


def divergence_names() -> tuple[str, ...]:
    """The registered NCA divergences, in registration order."""
    return tuple(NCA_DIVERGENCES)


@register_divergence("forward_kl", "KL(anchor || q_c), the expectation under the anchor.")
def _forward_kl(anchor: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    return _kl(anchor, context)


@register_divergence("symmetric_kl", "KL(anchor || q_c) + KL(q_c || anchor) (an ablation).")
def _symmetric_kl(anchor: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    return _kl(anchor, context) + _kl(context, anchor)


@dataclass(frozen=True)
class DivergenceSpec:
    """Which divergences to compute; see the module docstring for the formulas. `nca_divergence` names one of
    `NCA_DIVERGENCES`."""

    beta: float = 1.0
    temperature: float = 1.0
    top_k: int | None = None
    renormalize: bool = False
    top_k_of: Literal["student", "teacher"] = "student"
    nca_target: Literal["student", "teacher"] = "student"
    nca_divergence: str = "forward_kl"
    nca_stop_gradient: bool = True

    def __post_init__(self):
        if self.top_k_of not in ("student", "teacher"):
            raise ValueError(f"top_k_of must be 'student' or 'teacher', got {self.top_k_of!r}.")
        if self.nca_divergence not in NCA_DIVERGENCES:
            raise ValueError(f"nca_divergence must be one of {divergence_names()}, got {self.nca_divergence!r}.")


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
        config = model.config.get_text_config()
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

    def gathered(self, *others: LMHead):
        """Under DeepSpeed ZeRO-3, a block in which this head's (and `others`') weight and bias are whole (each
        parameter is a shard outside its module's forward); a null context otherwise or when they already are."""
        params = [p for head in (self, *others) for p in (head.weight, head.bias)]
        return maybe_gather_lm_head_ctx(*params)

    def logits(self, hidden: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Logits (at least float32) of the vocabulary slice [start, stop), before the temperature."""
        with self.gathered():
            return self._logits(hidden, start, stop)

    def _logits(self, hidden: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """`logits` for a caller that already holds the head gathered (`gathered`)."""
        stop = self.vocab_size if stop is None else min(stop, self.vocab_size)
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

    def _backward(self, hidden, logits, grad_logits, start, grad_h, grad_w, grad_b) -> None:
        """Add the gradient that `grad_logits` (of `_logits(hidden, start, ...)`, whose value is `logits`) sends to
        the hidden states and to the weight and bias rows of the slice into the given buffers (each may be None)."""
        grad_raw = grad_logits * self.scale
        if self.softcap is not None:
            grad_raw = grad_raw * (1 - (logits / self.softcap) ** 2)
        stop = start + logits.shape[1]
        if grad_h is not None:
            grad_h += grad_raw @ self.weight[start:stop].to(grad_raw.dtype)
        if grad_w is not None:
            grad_w[start:stop] += (grad_raw.T @ hidden.to(grad_raw.dtype)).to(grad_w.dtype)
        if grad_b is not None:
            grad_b[start:stop] += grad_raw.sum(0).to(grad_b.dtype)


def _logit_multiplier(config) -> float:
    """The factor some architectures apply to the LM head's output before any softcap (1.0 for most)."""
    for name in ("logit_scale", "output_multiplier", "lm_head_multiplier"):  # Cohere, Muse Glimmer, Falcon-H1
        if getattr(config, name, None) is not None:
            return float(getattr(config, name))
    if getattr(config, "logits_scaling", None) is not None:  # Granite, MiniCPM3 divide; HyperCLOVA X multiplies
        scaling = float(config.logits_scaling)
        return scaling if getattr(config, "model_type", None) == "hyperclovax" else 1.0 / scaling
    return 1.0


class TeacherTopK(NamedTuple):
    """A teacher known only by its k most likely tokens per completion token (a teacher behind a vLLM server): their
    `ids` (tokens, k) and `log_probs` (tokens, k), normalised over the teacher's whole vocabulary at the loss's
    temperature. The divergences then sum over these ids (`DivergenceSpec.top_k_of="teacher"`), as they do with the
    top-k of a local teacher's own logits."""

    ids: torch.Tensor
    log_probs: torch.Tensor

    @property
    def k(self) -> int:
        return self.ids.shape[1]

    def tile(self, rows: slice, start: int, width: int, renormalize: bool) -> torch.Tensor:
        """The log-probabilities of the vocabulary slice [start, start + width) of tokens `rows`: the known ones in
        place (renormalised over the k ids with `renormalize`), 0 elsewhere (outside the support, which the caller
        masks out)."""
        ids, log_probs = self.ids[rows], self.log_probs[rows].to(_acc(self.log_probs))
        if renormalize:
            log_probs = log_probs - torch.logsumexp(log_probs, dim=-1, keepdim=True)
        local = ids - start
        inside = (local >= 0) & (local < width)
        out = log_probs.new_zeros(ids.shape[0], width)
        token = torch.arange(ids.shape[0], device=ids.device)[:, None].expand_as(ids)
        out[token[inside], local[inside]] = log_probs[inside]
        return out


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


def _logsumexp(hidden, head: LMHead, inv_t: float, support, chunk: int) -> torch.Tensor:
    """logsumexp over the vocabulary of `head(hidden) / T`, restricted to `support` when given, chunk by chunk."""
    lse = torch.full((hidden.shape[0],), float("-inf"), device=hidden.device, dtype=_acc(hidden))
    for start in range(0, head.vocab_size, chunk):
        logits = head._logits(hidden, start, start + chunk) * inv_t
        if support is not None:
            logits = logits.masked_fill(~_support_mask(support, start, logits.shape[1]), float("-inf"))
        lse = torch.logaddexp(lse, torch.logsumexp(logits, dim=-1))
    return lse


@torch.no_grad()
def top_k_support(hidden: torch.Tensor, head: LMHead, k: int, chunk: int) -> torch.Tensor:
    """Ids of the k largest logits per token, found chunk by chunk without building the full row."""
    with head.gathered():
        return _top_k_support(hidden, head, k, chunk)


def _top_k_support(hidden: torch.Tensor, head: LMHead, k: int, chunk: int) -> torch.Tensor:
    best_val = hidden.new_full((hidden.shape[0], 0), float("-inf"), dtype=_acc(hidden))
    best_idx = torch.zeros((hidden.shape[0], 0), dtype=torch.long, device=hidden.device)
    for start in range(0, head.vocab_size, chunk):
        logits = head._logits(hidden, start, start + chunk)
        idx = torch.arange(start, start + logits.shape[1], device=hidden.device).expand_as(logits)
        vals, pos = torch.cat([best_val, logits], 1).topk(min(k, best_val.shape[1] + logits.shape[1]), dim=-1)
        best_val, best_idx = vals, torch.cat([best_idx, idx], 1).gather(1, pos)
    return best_idx


def _opd_terms(ls: torch.Tensor, lt: torch.Tensor, beta: float) -> torch.Tensor:
    if beta == 1.0:
        return _kl(ls, lt)
    if beta == 0.0:
        return _kl(lt, ls)
    lm = torch.logaddexp(ls + math.log1p(-beta), lt + math.log(beta))
    return beta * _kl(lt, lm) + (1.0 - beta) * _kl(ls, lm)


def _tile_terms(ls, lt, lc, mask, spec: DivergenceSpec, terms) -> list[torch.Tensor]:
    """Per-token partial sums over one vocabulary slice of the requested divergences, from the slice's
    log-probabilities `ls` (q_x), `lt` (f) and `lc` (q_c, or None); `mask` is the top-k support in the slice."""

    def total(terms):
        return (terms if mask is None else terms * mask).sum(-1)

    out = []
    if "opd" in terms:
        out.append(total(_opd_terms(ls, lt, spec.beta)))
    if "nca" in terms:
        anchor = lt if spec.nca_target == "teacher" else (ls.detach() if spec.nca_stop_gradient else ls)
        out.append(total(NCA_DIVERGENCES[spec.nca_divergence].terms(anchor, lc)))
    if "view_kl" in terms:
        out.append(total(_kl(ls.detach(), lc.detach())))
    if "entropy" in terms:
        lx = ls.detach()
        out.append(total(-(lx.exp() * lx)))  # entropy of q_x, -sum_v q_x(v) log q_x(v), no gradient
    return out


# The terms that carry gradient; "view_kl" and "entropy" are for monitoring only.
_DIFFERENTIABLE = ("opd", "nca")


@dataclass(frozen=True)
class _Tiling:
    """The fixed arguments of one `token_divergences` call: heads (already limited to the common rows), spec, terms
    and tile sizes."""

    student: LMHead
    teacher: LMHead
    spec: DivergenceSpec
    terms: tuple[str, ...]
    vocab_chunk: int
    token_chunk: int
    sparse: TeacherTopK | None = None  # a teacher known by its top-k only (then no teacher states)

    @property
    def inv_t(self) -> float:
        return 1.0 / self.spec.temperature

    def slices(self, num_tokens: int):
        return [slice(t0, t0 + self.token_chunk) for t0 in range(0, num_tokens, self.token_chunk)]

    def starts(self):
        return range(0, self.student.vocab_size, self.vocab_chunk)

    def log_probs(self, head: LMHead, hidden, lse, start):
        """(logits, log-probabilities) of the vocabulary slice at `start`."""
        z = head._logits(hidden, start, start + self.vocab_chunk)
        return z, z * self.inv_t - lse[:, None]

    def teacher_log_probs(self, h_t, lse_t, rows: slice, start: int, width: int):
        """The teacher's log-probabilities of the vocabulary slice at `start` (`width` wide) for tokens `rows`: from
        its states (`h_t` of those rows), or from its top-k (`sparse`); None without a teacher."""
        if self.sparse is not None:
            return self.sparse.tile(rows, start, width, self.spec.renormalize)
        return None if h_t is None else self.log_probs(self.teacher, h_t, lse_t, start)[1]

    def support(self, hx, ht, rows: slice) -> torch.Tensor:
        """The top-k support of tokens `rows`: the student's no-context top-k, or the teacher's (`top_k_of`)."""
        if self.sparse is not None:
            return self.sparse.ids[rows]
        if self.spec.top_k_of == "teacher":
            return _top_k_support(ht, self.teacher, self.spec.top_k, self.vocab_chunk)
        return _top_k_support(hx, self.student, self.spec.top_k, self.vocab_chunk)

    def slice_gradients(self, start, views, h_t, lse_t, support, coefficients, rows: slice):
        """Logits and log-probabilities of the student's `views` ((name, hidden, lse, _) each) in the vocabulary slice
        at `start`, and the gradient of sum_term coefficient * term with respect to each view's log-probabilities
        (None where a view gets none)."""
        logits, log_probs = {}, {}
        for view, hidden, lse, _ in views:
            logits[view], log_probs[view] = self.log_probs(self.student, hidden, lse, start)
        lt = self.teacher_log_probs(h_t, lse_t, rows, start, log_probs["x"].shape[1])
        mask = None if support is None else _support_mask(support, start, log_probs["x"].shape[1])
        with torch.enable_grad():
            leaves = {view: lp.requires_grad_() for view, lp in log_probs.items()}
            parts = _tile_terms(leaves["x"], lt, leaves.get("c"), mask, self.spec, tuple(coefficients))
            total = sum((coefficients[name] * part).sum() for name, part in zip(coefficients, parts))
            grads = torch.autograd.grad(total, list(leaves.values()), allow_unused=True)
        return logits, log_probs, dict(zip(leaves, grads))


class _TiledDivergences(torch.autograd.Function):
    """Every (tokens x vocabulary) tile of `token_divergences` as one autograd node, with the heads gathered by the
    caller for the forward and once by the backward for all tiles.

    Forward (no graph): per token chunk, the top-k support, the log-normalisers, then the per-token sums of the terms
    over the vocabulary slices. Backward: with l = z / T - lse per view, the terms' gradient G = d loss / d l of a
    slice is elementwise (autograd on the slice's log-probabilities only), and d lse / d z = softmax / T (on the support
    when the normaliser is restricted to it), so d loss / d z = (G - softmax * sum_v G) / T. A first walk over the
    vocabulary sums G per token; a second rebuilds each slice and writes its gradient through the head into one
    weight-gradient buffer (`LMHead._backward`): no full-size gradient per tile, no second gather.
    """

    @staticmethod
    def forward(ctx, h_x, h_c, h_t, weight, bias, tiling: _Tiling):
        student, teacher, spec, terms = tiling.student, tiling.teacher, tiling.spec, tiling.terms
        inv_t, vocab_chunk = tiling.inv_t, tiling.vocab_chunk
        sums = {name: h_x.new_zeros(h_x.shape[0], dtype=_acc(h_x)) for name in terms}
        lses = {view: h_x.new_empty(h_x.shape[0], dtype=_acc(h_x)) for view in ("x", "c", "t")}
        support = None
        if spec.top_k or tiling.sparse is not None:
            width = tiling.sparse.k if tiling.sparse is not None else min(spec.top_k, student.vocab_size)
            support = torch.zeros(h_x.shape[0], width, dtype=torch.long, device=h_x.device)
        for rows in tiling.slices(h_x.shape[0]):
            hx = h_x[rows]
            ht = None if h_t is None else h_t[rows]
            hc = None if h_c is None else h_c[rows]
            sup = None
            if support is not None:
                sup = support[rows] = tiling.support(hx, ht, rows)
            lse_support = sup if spec.renormalize else None
            for view, head, hidden in (("x", student, hx), ("c", student, hc), ("t", teacher, ht)):
                if hidden is not None:
                    lses[view][rows] = _logsumexp(hidden, head, inv_t, lse_support, vocab_chunk)
            for start in tiling.starts():
                _, ls = tiling.log_probs(student, hx, lses["x"][rows], start)
                lt = tiling.teacher_log_probs(ht, lses["t"][rows], rows, start, ls.shape[1])
                lc = None if hc is None else tiling.log_probs(student, hc, lses["c"][rows], start)[1]
                mask = None if sup is None else _support_mask(sup, start, ls.shape[1])
                for name, part in zip(terms, _tile_terms(ls, lt, lc, mask, spec, terms)):
                    sums[name][rows] += part
        ctx.save_for_backward(h_x, h_c, h_t, lses["x"], lses["c"], lses["t"], support)
        ctx.tiling = tiling
        ctx.set_materialize_grads(False)
        outputs = tuple(sums[name] for name in terms)
        ctx.mark_non_differentiable(*(out for name, out in zip(terms, outputs) if name not in _DIFFERENTIABLE))
        return outputs

    @staticmethod
    @once_differentiable
    def backward(ctx, *grad_outputs):
        h_x, h_c, h_t, lse_x, lse_c, lse_t, support = ctx.saved_tensors
        tiling = ctx.tiling
        student, teacher, spec = tiling.student, tiling.teacher, tiling.spec
        need_x, need_c, need_w, need_b = (ctx.needs_input_grad[i] for i in (0, 1, 3, 4))
        coefficients = {
            name: grad for name, grad in zip(tiling.terms, grad_outputs) if name in _DIFFERENTIABLE and grad is not None
        }
        grad_x = torch.zeros_like(h_x, dtype=_acc(h_x)) if need_x else None
        grad_c = torch.zeros_like(h_c, dtype=_acc(h_c)) if need_c else None
        with student.gathered(teacher):
            # Allocated inside the gather: under ZeRO-3 the parameter is an empty shard outside it, while the gradient
            # must have the full shape that autograd recorded in the (gathered) forward. One buffer for every tile.
            grad_w = torch.zeros_like(student.weight) if need_w else None
            grad_b = torch.zeros_like(student.bias) if need_b else None
            for rows in tiling.slices(h_x.shape[0]) if coefficients else ():
                coeff = {name: grad[rows].to(lse_x.dtype) for name, grad in coefficients.items()}
                views = [("x", h_x[rows], lse_x[rows], None if grad_x is None else grad_x[rows])]
                if h_c is not None:
                    views.append(("c", h_c[rows], lse_c[rows], None if grad_c is None else grad_c[rows]))
                ht = None if h_t is None else h_t[rows]
                lt_norm = None if h_t is None else lse_t[rows]
                sup = None if support is None else support[rows]
                lse_mask = sup if spec.renormalize else None

                # Walk 1: sum_v G per token and view (the gradient of the view's log-normaliser, negated).
                totals = dict.fromkeys(view for view, *_ in views)
                for start in tiling.starts():
                    for view, grad in tiling.slice_gradients(start, views, ht, lt_norm, sup, coeff, rows)[2].items():
                        if grad is not None:
                            totals[view] = grad.sum(-1) if totals[view] is None else totals[view] + grad.sum(-1)
                # Walk 2: d loss / d z per slice, through the head into the buffers.
                if all(total is None for total in totals.values()):
                    continue
                for start in tiling.starts():
                    logits, log_probs, grads = tiling.slice_gradients(start, views, ht, lt_norm, sup, coeff, rows)
                    for view, hidden, _, grad_h in views:
                        if grads[view] is None or (grad_h is None and grad_w is None and grad_b is None):
                            continue
                        softmax = log_probs[view].detach().exp()
                        if lse_mask is not None:
                            softmax = softmax * _support_mask(lse_mask, start, softmax.shape[1])
                        grad_z = (grads[view] - softmax * totals[view][:, None]) * tiling.inv_t
                        student._backward(hidden, logits[view], grad_z, start, grad_h, grad_w, grad_b)
        grad_x = None if grad_x is None else grad_x.to(h_x.dtype)
        grad_c = None if grad_c is None else grad_c.to(h_c.dtype)
        return grad_x, grad_c, None, grad_w, grad_b, None


_ALL_TERMS = ("opd", "nca", "view_kl")  # the default `terms` of `token_divergences`


def token_divergences(
    h_x: torch.Tensor,
    h_t: torch.Tensor | TeacherTopK | None,
    student: LMHead,
    teacher: LMHead | None,
    spec: DivergenceSpec,
    h_c: torch.Tensor | None = None,
    terms: tuple[str, ...] = _ALL_TERMS,
    vocab_chunk: int = 8192,
    token_chunk: int = 2048,
) -> dict[str, torch.Tensor]:
    """Per-token divergences (each of shape (num_tokens,)) for the tokens whose hidden states are given.

    `h_x`, `h_c` are the student's hidden states of the same completion tokens in the no-context and context views,
    `h_t` the teacher's. The teacher is a constant: neither `h_t` nor the teacher's head receives gradient, also when
    the teacher's head is the student's own (a live self-teacher). `terms` selects among "opd", "nca", "view_kl"
    (KL(q_x || q_c), no gradient, for monitoring) and "entropy" (of q_x, no gradient; over the support with top-k);
    "nca" and "view_kl" need `h_c`. Gradients reach `h_x` only through OPD (and NCA without stop-gradient)
    and `h_c` only through NCA.

    `h_t` may be None when no requested term reads the teacher ("nca" with the student anchor, "view_kl", "entropy"):
    the context-view half of views run in sequence (`trl_nca.trainers.objective`). The teacher's head still sets the
    common rows. `h_t` is a `TeacherTopK` for a teacher known only by its top-k (a served teacher; `teacher` is then
    None): every term sums over its ids, which must lie in the student's rows.

    Under DeepSpeed ZeRO-3 the heads are gathered once for the forward and once for the backward, whatever the number
    of tiles; the head's weight gradient is one buffer that every tile adds its rows to.
    """
    # In the order _tile_terms appends them; the context terms only with a context view.
    order = ("opd", "nca", "view_kl", "entropy")
    terms = tuple(w for w in order if w in terms and (w in ("opd", "entropy") or h_c is not None))
    if h_t is None and ("opd" in terms or ("nca" in terms and spec.nca_target == "teacher")):
        raise ValueError(f"token_divergences needs the teacher's states (h_t) for {terms} with {spec}.")
    sparse = h_t if isinstance(h_t, TeacherTopK) else None
    if sparse is not None:
        h_t = None
    if teacher is None:  # a teacher known by its top-k only: the student's head stands in (the rows are the student's)
        teacher = student
    # Output layers padded to different sizes: both distributions live on the first `vocab` rows (module docstring).
    vocab = min(student.vocab_size, teacher.vocab_size)
    student = replace(student, rows=vocab)
    # The teacher is a constant in every parameter, also when its head is the student's (live self-teacher).
    teacher = replace(teacher, constant=True, rows=vocab)
    tiling = _Tiling(student, teacher, spec, terms, vocab_chunk, token_chunk, sparse)
    weight, bias = (None, None) if student.constant else (student.weight, student.bias)
    # Under ZeRO-3 the heads stay gathered for the whole forward, so autograd records their full shapes.
    with student.gathered(teacher):
        outputs = _TiledDivergences.apply(h_x, h_c, None if h_t is None else h_t.detach(), weight, bias, tiling)
    return dict(zip(terms, outputs))
