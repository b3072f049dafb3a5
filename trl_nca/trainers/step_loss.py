"""`StepLoss`: the loss of one micro-batch, run the same way by both trainers.

Both student views and the teacher run inside one redirected forward of the wrapped student (TRL's
`_ForwardRedirection`), so DDP and DeepSpeed see one ordinary forward per micro-batch. Inside a trainer's
`training_step` (`StepLoss.trainer_backward`), where Trainer runs the loss's backward itself, a micro-batch may run its
views in sequence instead (`nca_sequential_views`, decided by `NCAObjective.in_sequence`): the no-context half with its
backward first, without the gradient all-reduce, then the context half, whose backward Trainer runs.

A trainer calls it from its `compute_loss` with the batch it built (`trl_nca.trainers.batch.NCABatch`) and the
division by its token count, and logs what it returns (the terms into its step statistics, the entropy or the
gradient cosine where it logs them); nothing here reads or writes the trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import nn
from trl.models.utils import _ForwardRedirection

from ..core.gradients import loss_gradients
from .batch import NCABatch
from .objective import NCAObjective


class MicroBatchLoss(NamedTuple):
    """What `StepLoss` returns for a micro-batch: the `loss` Trainer backpropagates (the scaled total), the per-token
    `terms` (`trl_nca.core.losses.token_divergences`), and, where asked, the `gradients` of the OPD and NCA token means
    over the trainable parameters (for `log_grad_cosine_steps`)."""

    loss: torch.Tensor
    terms: dict[str, torch.Tensor]
    gradients: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None


class StepLoss:
    """One micro-batch's loss under the objective, through the accelerator's wrapped student (see the module
    docstring)."""

    def __init__(self, objective: NCAObjective, accelerator):
        self.objective = objective
        self.accelerator = accelerator
        self.forward = _ForwardRedirection()
        self.backward_follows = False  # inside a trainer's training_step: Trainer runs this loss's backward

    @contextmanager
    def trainer_backward(self) -> Iterator[None]:
        """The span of a trainer's `training_step`: Trainer runs the backward of the losses computed inside it, so
        their views may run in sequence."""
        self.backward_follows = True
        try:
            yield
        finally:
            self.backward_follows = False

    def __call__(
        self,
        model: nn.Module,
        batch: NCABatch,
        scaled: Callable[[torch.Tensor], torch.Tensor],
        measure_gradients: bool = False,
        entropy: bool = False,
    ) -> MicroBatchLoss:
        """The micro-batch's loss, `scaled` (the summed terms divided by the trainer's token count). With
        `measure_gradients`, the gradients of its OPD and NCA token means; with `entropy`, the no-context view's
        per-token entropy among the terms."""
        unwrapped = self.accelerator.unwrap_model(model)
        if self.objective.in_sequence(self.backward_follows):
            return self._views_in_sequence(model, unwrapped, batch, scaled, measure_gradients, entropy)
        need_context = self.objective.need_context(measure_gradients)
        result = self.forward(
            model, unwrapped, self.objective.loss, unwrapped, batch, need_context, measure_gradients, entropy
        )
        gradients = None
        if measure_gradients:  # torch.autograd.grad keeps the graph and leaves `.grad` alone
            params = trainable(unwrapped)
            tokens = max(result.terms["opd"].numel(), 1)
            opd = loss_gradients(result.terms["opd"].sum() / tokens, params)
            gradients = opd, loss_gradients(result.terms["nca"].sum() / tokens, params)
        return MicroBatchLoss(scaled(result.total), result.terms, gradients)

    def _views_in_sequence(self, model, unwrapped, batch: NCABatch, scaled, measure_gradients: bool, entropy: bool):
        """The no-context half (its view, the teacher and OPD) runs with its backward first, without the gradient
        all-reduce (`no_sync`); then the context half (its view and NCA), whose backward Trainer runs as usual and which
        synchronises the summed gradient once. Each half runs inside its own redirected forward, so DDP sees two
        ordinary forward/backward pairs, and only one view's activations are alive at a time. With
        `measure_gradients` each half's term gradient is taken before its backward. The loss is differentiable through
        the context half only (its value is the whole loss)."""
        tokens = max(int(batch.completion_mask.sum()), 1)
        params = trainable(unwrapped) if measure_gradients else []
        opd_gradient = None
        with self.accelerator.no_sync(model):
            first = self.forward(model, unwrapped, self.objective.no_context_half, unwrapped, batch, entropy)
            if measure_gradients:
                opd_gradient = loss_gradients(first.total / tokens, params)
            first_loss = scaled(first.total)
            self.accelerator.backward(first_loss)
        second = self.forward(model, unwrapped, self.objective.context_half, unwrapped, batch, first.carry)
        gradients = None
        if measure_gradients:
            gradients = opd_gradient, loss_gradients(second.terms["nca"].sum() / tokens, params)
        return MicroBatchLoss(scaled(second.total) + first_loss.detach(), {**first.terms, **second.terms}, gradients)


def trainable(model: nn.Module) -> list[torch.Tensor]:
    """The parameters a step trains."""
    return [p for p in model.parameters() if p.requires_grad]
