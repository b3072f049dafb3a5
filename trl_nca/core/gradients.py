"""Gradients of two losses over the same parameters, compared without touching any parameter's `.grad`.

Used to measure the angle between the OPD and the NCA gradients (`NCAConfig.log_grad_cosine_steps` during training,
`trl_nca.analysis` on saved checkpoints). `torch.autograd.grad` returns the gradients instead of accumulating them,
so the training update is not affected, and it does not fire DistributedDataParallel's gradient hooks (those run when
gradients are accumulated into `.grad`), so no gradient is synchronised across processes by a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


def loss_gradients(loss: torch.Tensor, params: Sequence[torch.Tensor], retain_graph: bool = True) -> list[torch.Tensor]:
    """d loss / d p for every parameter p (zeros for a parameter the loss does not reach); `.grad` is left alone."""
    params = list(params)
    if not params:
        raise ValueError("No parameter to differentiate: the model has no trainable parameter (requires_grad=True).")
    grads = torch.autograd.grad(loss, params, retain_graph=retain_graph, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


@dataclass(frozen=True)
class GradientComparison:
    """The cosine between two gradients flattened over the same parameters, and their Euclidean norms.

    `cosine` is NaN when either gradient is exactly zero (the angle is then undefined).
    """

    cosine: float
    norm_a: float
    norm_b: float
    num_params: int

    def to_dict(self) -> dict[str, float]:
        return {"cosine": self.cosine, "norm_a": self.norm_a, "norm_b": self.norm_b, "num_params": self.num_params}


def compare_gradients(grads_a: Sequence[torch.Tensor], grads_b: Sequence[torch.Tensor]) -> GradientComparison:
    """Cosine and norms of two gradients given per parameter, as if each were one flattened vector (sums in
    float64, one parameter at a time, so no flattened copy is made)."""
    if len(grads_a) != len(grads_b):
        raise ValueError(f"The two gradients cover {len(grads_a)} and {len(grads_b)} parameters; they must match.")
    dot = sq_a = sq_b = 0.0
    count = 0
    for a, b in zip(grads_a, grads_b):
        if a.shape != b.shape:
            raise ValueError(f"Gradient shapes differ: {tuple(a.shape)} and {tuple(b.shape)}.")
        a, b = a.detach().double(), b.detach().double()
        dot += float((a * b).sum())
        sq_a += float((a * a).sum())
        sq_b += float((b * b).sum())
        count += a.numel()
    norm_a, norm_b = math.sqrt(sq_a), math.sqrt(sq_b)
    cosine = dot / (norm_a * norm_b) if norm_a > 0 and norm_b > 0 else float("nan")
    return GradientComparison(cosine=cosine, norm_a=norm_a, norm_b=norm_b, num_params=count)
