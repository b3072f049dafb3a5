"""The trainer's loss and gradients against a full-logit reference for every kind of teacher.

The teacher must be a constant: whatever it is (the live student, the student with its adapter off, a frozen or merged
copy, a separate model), no gradient may flow into any parameter through its distribution. The reference computes
full logits with the models' own forward passes, takes the teacher's log-probabilities from a detached forward of an
independent copy of the teacher, and differentiates the plain token mean of OPD + nca_beta * NCA.
"""

import copy

import pytest
import torch
import torch.nn.functional as F

from trl_nca import NCAConfig, NCATrainer
from trl_nca.core.views import build_view
from trl_nca.testing import (
    FLOAT64,
    REFERENCE_BATCH,
    float64_model,
    full_logprobs,
    make_tiny_model,
    ragged_answers,
    run_args,
    token_kl,
)


pytestmark = pytest.mark.numerics  # replayed by CI under other vector units (.ci/run)


LORA_TARGETS = ["q_proj", "v_proj"]


def full_logits(model, view, completion_mask):
    out = model(input_ids=view.input_ids, attention_mask=view.attention_mask, position_ids=view.position_ids)
    return out.logits[:, view.prompt_width - 1 :][completion_mask.bool()].double()


def reference_loss(student, teacher_logits_fn, batch, nca_beta, anchor, temperature=1.0):
    """Token mean of OPD (reverse KL) + nca_beta * NCA from full logits; the teacher's log-probs are constants."""
    ids, mask = batch.completion_ids, batch.completion_mask
    vc = build_view(batch.context_prompts, batch.context_prompt_attention_mask, ids, mask)
    lx = full_logprobs(student, batch.prompts, batch.prompt_attention_mask, ids, mask, temperature)
    lc = full_logprobs(student, batch.context_prompts, batch.context_prompt_attention_mask, ids, mask, temperature)
    with torch.no_grad():
        lt = F.log_softmax(teacher_logits_fn(vc, mask) / temperature, -1)
    opd = token_kl(lx, lt)
    target = lx.detach() if anchor == "student" else lt
    nca = token_kl(target, lc)
    return (opd + nca_beta * nca).mean()


TEACHERS = [
    # (teacher kind, fine-tuning)
    ("live", "full"),
    ("live", "lora"),
    ("adapter_off", "lora"),
    ("frozen_copy", "full"),
    ("merged_copy", "lora"),
    ("separate", "full"),
    ("separate", "lora"),
]


def build(tok, tmp_path, kind, tuning, tied, anchor="student", sequential=None):
    """A trainer with the given teacher, and a function giving the reference teacher's logits on a view."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = float64_model(make_tiny_model(tok, 0, tie_word_embeddings=tied))
    initial = copy.deepcopy(base).eval()
    args = run_args(
        NCAConfig,
        tmp_path / "out",
        REFERENCE_BATCH,
        nca_anchor=anchor,
        self_teacher="live" if kind == "live" else "initial",
        nca_sequential_views=sequential,
    )
    teacher, peft_config, model = None, None, base
    separate = float64_model(make_tiny_model(tok, 1, tie_word_embeddings=tied)) if kind == "separate" else None
    if kind == "separate":
        teacher = separate
    if tuning == "lora":
        lora = LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS, lora_dropout=0.0)
        if kind == "merged_copy":  # an adapter that is not a no-op at the start
            lora.init_lora_weights = False
            model = get_peft_model(base, lora)
        else:
            peft_config = lora
    merged_start = copy.deepcopy(model).merge_and_unload().eval() if kind == "merged_copy" else None
    trainer = NCATrainer(
        model=model,
        teacher_model=teacher,
        args=args,
        train_dataset=ragged_answers(),
        processing_class=tok,
        peft_config=peft_config,
    )
    student = trainer.model

    def teacher_logits(view, mask):
        reference = {"adapter_off": initial, "frozen_copy": initial, "merged_copy": merged_start}.get(kind, separate)
        return full_logits(student if kind == "live" else reference, view, mask)

    return trainer, teacher_logits


def grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("kind,tuning", TEACHERS, ids=[f"{k}-{t}" for k, t in TEACHERS])
def test_loss_and_gradients_match_full_logit_reference(tok, tmp_path, kind, tuning, tied):
    trainer, teacher_logits = build(tok, tmp_path, kind, tuning, tied)
    _check_against_reference(trainer, teacher_logits, anchor="student")


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("kind,tuning", [("live", "full"), ("frozen_copy", "full")], ids=["live", "frozen_copy"])
def test_teacher_anchor_gradients_match_full_logit_reference(tok, tmp_path, kind, tuning, tied):
    """nca_anchor='teacher' (DualOPD) pulls the context view towards the teacher: still no gradient into it."""
    trainer, teacher_logits = build(tok, tmp_path, kind, tuning, tied, anchor="teacher")
    _check_against_reference(trainer, teacher_logits, anchor="teacher")


SEQUENTIAL = [kt for kt in TEACHERS if kt[0] != "live"]  # the live self-teacher scores with the context view


@pytest.mark.parametrize("anchor", ["student", "teacher"])
@pytest.mark.parametrize("kind,tuning", SEQUENTIAL, ids=[f"{k}-{t}" for k, t in SEQUENTIAL])
def test_views_in_sequence_match_full_logit_reference(tok, tmp_path, kind, tuning, anchor):
    """A training step with the views in sequence (the no-context view, teacher and OPD backpropagated before the
    context view runs): the same loss and gradient as the full-logit reference, for every teacher but the live one."""
    trainer, teacher_logits = build(tok, tmp_path, kind, tuning, tied=False, anchor=anchor, sequential=True)
    assert trainer.nca.sequential
    _check_against_reference(trainer, teacher_logits, anchor=anchor, training_step=True)


def test_live_self_teacher_keeps_both_views(tok, tmp_path):
    trainer, _ = build(tok, tmp_path, "live", "full", tied=False)
    assert not trainer.nca.sequential  # the teacher is the student's own context view, needed by OPD


def _check_against_reference(trainer, teacher_logits, anchor, training_step=False):
    student = trainer.model
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(3)])
    batch = trainer._with_completions(batch, on_policy=False)
    views = trainer.nca_batch(batch)
    assert views.completion_mask.sum(1).unique().numel() == 3  # ragged completions

    student.zero_grad()
    if training_step:  # Trainer's step: the loss and its backward (two, with the views in sequence)
        loss = trainer.training_step(student, batch)
    else:
        loss = trainer.compute_loss(student, batch)
        loss.backward()
    got = grads(student)
    student.zero_grad()
    ref = reference_loss(student, teacher_logits, views, nca_beta=0.5, anchor=anchor)
    ref.backward()
    expected = grads(student)
    student.zero_grad()

    FLOAT64.close(loss.double(), ref)  # float64 models and reference
    assert set(got) == set(expected) and expected
    for name, g in expected.items():
        FLOAT64.close(got[name], g, msg=name, scale=g.abs().max())
