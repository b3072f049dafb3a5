"""docs/extending.md's two examples, a divergence and a schedule, registered from outside the package (the page's
code run as a module of its own): the divergence against a float64 full-logit reference in value and gradient, and
one trained step with each on a tiny model."""

import re
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_trainer import make_args

from trl_nca import NCAConfig, NCATrainer
from trl_nca.core.losses import NCA_DIVERGENCES, DivergenceSpec, LMHead, token_divergences
from trl_nca.core.schedule import SCHEDULES
from trl_nca.testing import FLOAT64, STORED32, make_tiny_model, prompt_dataset


PAGE = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


@pytest.fixture
def extension():
    """The page's Python blocks run in order as the module `my_extension`; its registrations are undone after."""
    module = types.ModuleType("my_extension")
    sys.modules[module.__name__] = module
    try:
        for block in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S):
            exec(compile(block, str(PAGE), "exec"), module.__dict__)
        yield module
    finally:
        NCA_DIVERGENCES.pop("reverse_kl", None)
        SCHEDULES.pop("step", None)
        del sys.modules[module.__name__]


def test_the_pages_divergence_matches_a_full_logit_reference(extension):
    """KL(q_c || sg[q_x]) from the tiles (3 token chunks x 5 vocabulary chunks) equals the float64 full-logit value,
    and its gradient reaches the context view and the head only."""
    g = torch.Generator().manual_seed(0)
    h_x, h_c, h_t = (torch.randn(5, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    w = torch.randn(31, 8, generator=g, dtype=torch.float64, requires_grad=True)
    spec = DivergenceSpec(nca_divergence="reverse_kl")
    out = token_divergences(
        h_x, h_t.detach(), LMHead(w), LMHead(w.detach()), spec, h_c=h_c, terms=("nca",), vocab_chunk=7, token_chunk=2
    )["nca"]
    lpx, lpc = F.log_softmax(h_x @ w.T, -1), F.log_softmax(h_c @ w.T, -1)
    ref = F.kl_div(lpx.detach(), lpc, log_target=True, reduction="none").sum(-1)  # sum_v q_c (log q_c - log q_x)
    FLOAT64.close(out, ref)
    grads = torch.autograd.grad(out.sum(), (h_x, h_c, w), allow_unused=True)
    ref_grads = torch.autograd.grad(ref.sum(), (h_c, w))
    assert grads[0] is None or not grads[0].abs().sum()  # the anchor is held constant
    for got, want in zip(grads[1:], ref_grads):
        FLOAT64.close(got, want)


def test_a_step_trains_with_the_pages_divergence(extension, tok, tmp_path):
    """The same first step under `forward_kl` and the page's `reverse_kl`: the same samples and OPD term, another NCA
    term, and the loss is opd_loss + nca_beta * nca_loss with it."""
    steps = {}
    for divergence in ("forward_kl", "reverse_kl"):
        args = make_args(tmp_path / divergence, max_steps=1, nca_beta=0.5, nca_divergence=divergence)
        trainer = NCATrainer(
            model=make_tiny_model(tok, 0),
            teacher_model=make_tiny_model(tok, 1),
            args=args,
            train_dataset=prompt_dataset(2),
            processing_class=tok,
        )
        trainer.train()
        (steps[divergence],) = [h for h in trainer.state.log_history if "nca_loss" in h]
    forward, reverse = steps["forward_kl"], steps["reverse_kl"]
    assert reverse["opd_loss"] == forward["opd_loss"] and reverse["nca_loss"] != forward["nca_loss"]
    assert reverse["nca_loss"] > 0 and reverse["loss"] == STORED32.approx(
        reverse["opd_loss"] + 0.5 * reverse["nca_loss"]
    )
    with pytest.raises(
        ValueError, match=r"nca_divergence must be one of \('forward_kl', 'symmetric_kl', 'reverse_kl'\)"
    ):
        make_args(tmp_path, nca_divergence="reverse-kl")


def test_a_run_follows_the_pages_schedule(extension, tok, tmp_path):
    """The step anchor with nca_warmup_steps=2: weights 0, 0, then nca_beta; the model card says so; the config reads
    its field (no other schedule field is named as unread)."""
    args = make_args(tmp_path, max_steps=3, nca_beta=0.5, nca_beta_schedule="step", nca_warmup_steps=2)
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0), args=args, train_dataset=prompt_dataset(6), processing_class=tok
    )
    assert type(trainer.nca.schedule) is extension.StepSchedule
    trainer.train()
    assert [h["nca_beta"] for h in trainer.state.log_history if "loss" in h and "nca_beta" in h] == [0.0, 0.0, 0.5]
    trainer.create_model_card(model_name="student")
    assert (
        "The anchor was off for 2 optimizer steps, then at `nca_beta=0.5`."
        in (tmp_path / "out" / "README.md").read_text()
    )
    from trl_nca.core.schedule import unread_settings

    assert unread_settings(args) == []
    assert isinstance(args, NCAConfig)
