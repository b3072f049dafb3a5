"""Student and teacher whose output layers are padded to different sizes (same tokenizer).

Qwen2.5-7B has 152064 output rows, Qwen2.5-3B 151936, both for 151665 tokens. The divergences use the first
V = min(V_student, V_teacher) rows, each distribution renormalised over them; sampling never emits an id past V.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset
from torch import nn

from trl_nca import NCAConfig, NCATrainer
from trl_nca.core.views import build_view
from trl_nca.testing import CONTEXT, FLOAT64, REFERENCE_BATCH, float64_model, make_tiny_model, ragged_answers, run_args


pytestmark = pytest.mark.numerics  # replayed by CI under other vector units (.ci/run)


EXTRA = 8  # padding rows of the wider model


def make_args(tmp_path, **fields):
    return run_args(NCAConfig, tmp_path / "out", {**REFERENCE_BATCH, "max_steps": 1}, **fields)


def loud_padding_rows(model, first_padding_row):
    """Give the model's output layer a bias that makes its padding rows (ids >= first_padding_row) all but certain, so
    any sampling or loss that looked at them would show it."""
    head = model.lm_head
    biased = nn.Linear(head.in_features, head.out_features, bias=True, dtype=head.weight.dtype)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.zero_()
        biased.bias[first_padding_row:] = 30.0
    model.lm_head = biased
    return model


def full_logits(model, view, mask, rows):
    out = model(input_ids=view.input_ids, attention_mask=view.attention_mask, position_ids=view.position_ids)
    return out.logits[:, view.prompt_width - 1 :][mask.bool()][:, :rows].double()


@pytest.mark.parametrize("spec", [{}, {"beta": 0.5, "temperature": 0.7}, {"divergence_support": "top_k", "top_k": 5}])
@pytest.mark.parametrize("wider", ["teacher", "student"])
def test_loss_and_gradients_over_the_common_rows(tok, tmp_path, wider, spec):
    """Values and gradients against full logits cut to the common rows and renormalised there."""
    rows = len(tok)
    # float64 throughout (norms included): the trainer runs the prompts' shared prefix once (share_prefix)
    student = float64_model(make_tiny_model(tok, 0, vocab_size=rows + (EXTRA if wider == "student" else 0)))
    teacher = float64_model(make_tiny_model(tok, 1, vocab_size=rows + (EXTRA if wider == "teacher" else 0)))
    loud_padding_rows(student if wider == "student" else teacher, rows)
    trainer = NCATrainer(
        model=student,
        teacher_model=teacher,
        args=make_args(tmp_path, **spec),
        train_dataset=ragged_answers(),
        processing_class=tok,
    )
    inputs = trainer._with_completions(
        trainer.data_collator([trainer.train_dataset[i] for i in range(3)]), on_policy=False
    )
    loss = trainer.compute_loss(student, inputs)
    batch = trainer.nca_batch(inputs)
    loss.backward()
    got = {n: p.grad.clone() for n, p in student.named_parameters()}
    student.zero_grad()

    ids, mask = batch.completion_ids, batch.completion_mask
    vx = build_view(batch.prompts, batch.prompt_attention_mask, ids, mask)
    vc = build_view(batch.context_prompts, batch.context_prompt_attention_mask, ids, mask)
    T = spec.get("temperature", 1.0)
    zx, zc = full_logits(student, vx, mask, rows) / T, full_logits(student, vc, mask, rows) / T
    with torch.no_grad():
        zt = full_logits(teacher, vc, mask, rows) / T
    lx, lc, lt = (F.log_softmax(z, -1) for z in (zx, zc, zt))
    beta = spec.get("beta", 1.0)
    if beta == 1.0:
        opd = lx.exp() * (lx - lt)
    else:
        lm = torch.logaddexp(lx + math.log1p(-beta), lt + math.log(beta))
        opd = beta * lt.exp() * (lt - lm) + (1 - beta) * lx.exp() * (lx - lm)
    nca = lx.detach().exp() * (lx.detach() - lc)
    if spec.get("divergence_support") == "top_k":
        support = torch.zeros_like(zx, dtype=torch.bool).scatter(1, zx.detach().topk(5, -1).indices, True)
        opd, nca = opd * support, nca * support
    ref = (opd.sum(-1) + 0.5 * nca.sum(-1)).mean()
    ref.backward()
    FLOAT64.close(loss.double(), ref)  # float64 models and reference
    for name, p in student.named_parameters():
        FLOAT64.close(got[name], p.grad, msg=name, scale=p.grad.abs().max())
    if wider == "student":  # the padding rows take no part in the loss
        assert not got["lm_head.weight"][rows:].abs().sum() and not got["lm_head.bias"][rows:].abs().sum()


def test_too_few_common_rows_for_the_tokenizer_is_an_error(tok, tmp_path):
    teacher = make_tiny_model(tok, 1, vocab_size=len(tok) - 4)
    with pytest.raises(ValueError, match=rf"first {len(tok) - 4} rows, which do not cover the tokenizer's {len(tok)}"):
        NCATrainer(
            model=make_tiny_model(tok, 0),
            teacher_model=teacher,
            args=make_args(tmp_path),
            train_dataset=ragged_answers(),
            processing_class=tok,
        )


def test_teacher_by_name_with_a_wider_output_layer(tok, tmp_path):
    """A teacher given by name (GKD loads it itself, and refuses a different vocab_size) is accepted too."""
    path = tmp_path / "wide-teacher"
    make_tiny_model(tok, 1, vocab_size=len(tok) + EXTRA).save_pretrained(path)
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=str(path),
        args=make_args(tmp_path),
        train_dataset=ragged_answers(),
        processing_class=tok,
    )
    assert (
        trainer.accelerator.unwrap_model(trainer.teacher_model).get_output_embeddings().weight.shape[0]
        == len(tok) + EXTRA
    )
    assert trainer.accelerator.unwrap_model(trainer.teacher_model).config.vocab_size == len(tok) + EXTRA
    trainer.train()


@pytest.mark.parametrize("wider", ["teacher", "student"])
def test_sampling_never_emits_ids_past_the_common_rows(tok, tmp_path, wider):
    """seq_kd from a wider teacher, and on-policy sampling of a wider student: padding ids are masked, even when the
    padding rows would otherwise take almost all the probability."""
    rows = len(tok)
    student = make_tiny_model(tok, 0, vocab_size=rows + (EXTRA if wider == "student" else 0))
    teacher = make_tiny_model(tok, 1, vocab_size=rows + (EXTRA if wider == "teacher" else 0))
    loud_padding_rows(student if wider == "student" else teacher, rows)
    seq_kd = wider == "teacher"
    args = make_args(tmp_path, lmbda=0.0 if seq_kd else 1.0, seq_kd=seq_kd, max_new_tokens=12)
    prompts = Dataset.from_dict({"prompt": ["Which answer? (A) yes (B) no"] * 3, "context": [CONTEXT] * 3})
    trainer = NCATrainer(model=student, teacher_model=teacher, args=args, train_dataset=prompts, processing_class=tok)
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(3)]))
    torch.manual_seed(0)
    out = trainer._with_completions(batch, on_policy=not seq_kd)
    ids = out["completion_ids"][out["completion_mask"].bool()]
    assert ids.numel() >= 3 and int(ids.max()) < rows
    trainer.train()
