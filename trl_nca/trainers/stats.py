"""The logged terms of both trainers, and the one accumulator that sums them over an optimizer step.

`loss` is the token mean over an optimizer step (all micro-batches and processes), and over the whole set in
evaluation; `opd_loss`, `nca_loss` and `view_kl` are token means over the same tokens, so that
loss = opd_loss + nca_beta * nca_loss holds to float precision. Each micro-batch adds its sums to a vector
(`STAT_NAMES`); the vector is summed over processes and divided once per step or per evaluation (`StepStats`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


STAT_NAMES = ("loss", "opd", "nca", "view_kl", "tokens", "rows", "clipped", "sampled_rows")


def batch_stats(
    terms: Mapping[str, torch.Tensor], total: torch.Tensor, lengths: torch.Tensor, clipped: torch.Tensor, on_policy
) -> torch.Tensor:
    """The sums of one micro-batch as a vector ordered like `STAT_NAMES` (float64, float32 on MPS)."""
    # float64 keeps token counts exact and sums precise (MPS has no float64)
    zero = total.detach().new_zeros((), dtype=torch.float32 if total.device.type == "mps" else torch.float64)
    values = {
        "loss": total.detach(),
        **{k: terms[k].detach().sum() if k in terms else zero for k in ("opd", "nca", "view_kl")},
        "tokens": lengths.sum(),
        "rows": torch.tensor(lengths.numel(), device=lengths.device),
        "clipped": clipped.sum(),
        "sampled_rows": torch.tensor(lengths.numel() if on_policy else 0, device=lengths.device),
    }
    return torch.stack([values[k].to(zero.dtype) for k in STAT_NAMES])


def record_means(
    stats: torch.Tensor, accelerator, metrics: Mapping[str, list], show_nca: bool, completions: bool = True
) -> dict[str, float]:
    """Sum the statistics over processes, append their token means to `metrics` (a trainer's `_metrics[mode]`) and
    return the means the anchor schedule reads. `completions=False` leaves the completion statistics to the base
    trainer (TRL's `DistillationTrainer` logs them itself)."""
    if accelerator.num_processes > 1:
        stats = accelerator.gather(stats.unsqueeze(0)).sum(0)
    total = dict(zip(STAT_NAMES, stats.tolist()))
    tokens, rows = max(total["tokens"], 1), max(total["rows"], 1)
    names = {"opd": "opd_loss"}
    if show_nca:
        names.update(nca="nca_loss", view_kl="view_kl")
    for key, name in names.items():
        metrics[name].append(total[key] / tokens)
    if completions:
        metrics["completions/mean_length"].append(total["tokens"] / rows)
        metrics["completions/clipped_ratio"].append(total["clipped"] / rows)
        metrics["completions/on_policy"].append(total["sampled_rows"] / rows)
    return {"loss": total["loss"] / tokens, "opd_loss": total["opd"] / tokens, "view_kl": total["view_kl"] / tokens}


class StepStats:
    """Sums of the logged terms over the micro-batches of one optimizer step, and over one evaluation loop; it only
    records.

    The step is Trainer's: `open_step` at its start and `close_step` at its end are called by the trainer's
    `trl_nca.trainers.anchor.AnchorStep` callback (`on_step_begin`, `on_step_end`), and every training
    micro-batch in between adds its sums (`add`); `close_step` logs the step's token means with the anchor weight the
    step used. In evaluation the sums run over the whole loop (`open_eval`, `close_eval`).

    Args:
        accelerator: the trainer's accelerator (the sums are added over its processes).
        metrics: the trainer's `_metrics` (`{"train": ..., "eval": ...}` of lists, flushed by TRL's `log`).
        show_nca: whether `nca_loss` and `view_kl` are logged (the NCA term is on, or `nca_monitor`).
        completions: whether the completion statistics are logged (False where the base trainer logs them).
    """

    def __init__(self, accelerator, metrics, show_nca: bool, completions: bool = True):
        self.accelerator = accelerator
        self.metrics = metrics
        self.show_nca = show_nca
        self.completions = completions
        self.step_sums: torch.Tensor | None = None
        self.eval_sums: torch.Tensor | None = None

    def open_step(self) -> None:
        """Start the sums of an optimizer step."""
        self.step_sums = None

    def add(self, stats: torch.Tensor, training: bool) -> None:
        """Add one micro-batch's sums (`batch_stats`): to the evaluation's, or to the optimizer step's."""
        if not training:
            self.eval_sums = stats if self.eval_sums is None else self.eval_sums + stats
            return
        self.step_sums = stats if self.step_sums is None else self.step_sums + stats

    def close_step(self, beta: float) -> dict[str, float] | None:
        """Log the step's token means and `nca_beta` (the anchor weight the step used), and return the means (None,
        logging nothing, for a step without a training micro-batch)."""
        sums, self.step_sums = self.step_sums, None
        if sums is None:
            return None
        means = self.record(sums, "train")
        self.metrics["train"]["nca_beta"].append(beta)
        return means

    def record(self, stats: torch.Tensor, mode: str) -> dict[str, float]:
        """Log the token means of `stats` (summed over processes) under `mode` and return them (`record_means`)."""
        return record_means(stats, self.accelerator, self.metrics[mode], self.show_nca, completions=self.completions)

    def open_eval(self) -> None:
        """Start the sums of an evaluation loop."""
        self.eval_sums = None

    def close_eval(self, output, device, metric_key_prefix: str):
        """Finish an evaluation loop: log its summed statistics (zeros when this process had no batch, which still
        joins the other processes' sum), and make the loop's `<prefix>_loss` their token mean over the whole
        evaluation set instead of Trainer's mean of batch means."""
        sums, self.eval_sums = self.eval_sums, None
        if sums is None:
            sums = torch.zeros(len(STAT_NAMES), dtype=torch.float64, device=device)
        means = self.record(sums, "eval")
        if f"{metric_key_prefix}_loss" in output.metrics:
            output.metrics[f"{metric_key_prefix}_loss"] = means["loss"]
        return output
