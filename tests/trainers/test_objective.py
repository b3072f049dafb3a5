"""`trl_nca.trainers.objective`: the NCA objective built from its own settings, its teacher and its schedule, without
a Trainer, and each teacher kind of the `Teacher` protocol as the objective uses it."""

import pytest
import torch

from trl_nca.core.schedule import ConstantSchedule
from trl_nca.core.views import left_pad, right_pad
from trl_nca.testing import FLOAT64, float64_model, full_logprobs, make_tiny_model, make_tiny_tokenizer, token_kl
from trl_nca.trainers.batch import NCABatch
from trl_nca.trainers.objective import NCAObjective, NCASettings, anchor_schedule
from trl_nca.trainers.teacher import ModelTeacher, SelfTeacher, Teacher, as_teacher


@pytest.fixture(scope="module")
def tok():
    return make_tiny_tokenizer()


def ragged_batch(tok, **flags) -> NCABatch:
    """Two rows: prompts of different lengths in each view, ragged completions."""
    prompts, prompt_mask = left_pad([[5, 6, 7], [8, 9]], tok.pad_token_id)
    context, context_mask = left_pad([[30, 31, 32, 5, 6, 7], [30, 31, 8, 9]], tok.pad_token_id)
    completion, completion_mask = right_pad([[10, 11, 12, 13], [14, 15]], tok.pad_token_id)
    return NCABatch(prompts, prompt_mask, context, context_mask, completion, completion_mask, **flags)


def objective(tok, teacher, beta=0.5, **settings) -> NCAObjective:
    return NCAObjective(NCASettings(**settings), teacher, ConstantSchedule(beta=beta), tok.pad_token_id)


@pytest.mark.numerics
@pytest.mark.parametrize("joint_forward", [False, True], ids=["two-forwards", "joint-forward"])
def test_built_without_a_trainer_equals_the_full_logit_reference(tok, joint_forward):
    """OPD, NCA and the view KL per token, and the total OPD + beta * NCA, from an objective built from its settings,
    a separate teacher and a constant schedule, equal float64 full-logit references; so do the gradients."""
    student, teacher = float64_model(make_tiny_model(tok, 0)), float64_model(make_tiny_model(tok, 1))
    nca = objective(tok, ModelTeacher(teacher), joint_forward=joint_forward)
    batch = ragged_batch(tok)
    result = nca.loss(student, batch, need_context=True)
    result.total.backward()
    got = {n: p.grad.clone() for n, p in student.named_parameters()}

    student.zero_grad()
    completions = (batch.completion_ids, batch.completion_mask)
    lx = full_logprobs(student, batch.prompts, batch.prompt_attention_mask, *completions)
    lc = full_logprobs(student, batch.context_prompts, batch.context_prompt_attention_mask, *completions)
    with torch.no_grad():
        lt = full_logprobs(teacher, batch.context_prompts, batch.context_prompt_attention_mask, *completions)
    reference = {"opd": token_kl(lx, lt), "nca": token_kl(lx.detach(), lc), "view_kl": token_kl(lx, lc)}
    for key, value in reference.items():
        FLOAT64.close(result.terms[key], value, msg=key)
    total = reference["opd"].sum() + 0.5 * reference["nca"].sum()
    FLOAT64.close(result.total, total)
    total.backward()
    for name, parameter in student.named_parameters():
        FLOAT64.close(got[name], parameter.grad, msg=name, scale=parameter.grad.abs().max())


def test_each_teacher_kind_answers_for_itself(tok):
    """A separate model is a `ModelTeacher` (weights of its own, a key that follows them); a self-teacher is its own
    `Teacher`: initial (no weights of its own, a key that follows the base weights only), live (no key: never kept)."""
    model = make_tiny_model(tok, 1)
    separate = as_teacher(model)
    assert isinstance(separate, ModelTeacher) and separate.owns_weights and not separate.live
    key = separate.weights_key(model)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert separate.weights_key(model) != key

    student = make_tiny_model(tok, 0)
    for mode, live in (("initial", False), ("live", True)):
        teacher = SelfTeacher(lambda: student, student.config, mode=mode)
        assert as_teacher(teacher) is teacher and isinstance(teacher, Teacher)
        assert not teacher.owns_weights and teacher.live == live
        assert (teacher.weights_key(student) is None) == live


@pytest.mark.numerics
def test_a_live_self_teacher_reads_the_students_context_view(tok):
    """The live self-teacher scores with the student's own context view (reused, detached): OPD equals the view KL
    token by token, and no gradient reaches the teacher's side."""
    student = float64_model(make_tiny_model(tok, 0))
    live = SelfTeacher(lambda: student, student.config, mode="live")
    nca = objective(tok, live, share_prefix=False)
    forwards = []
    handle = student.model.register_forward_hook(lambda *args: forwards.append(1))
    terms = nca.token_divergences(student, ragged_batch(tok), need_context=True)
    handle.remove()
    assert len(forwards) == 2  # the student's two views; the teacher runs no forward of its own
    FLOAT64.close(terms["opd"], terms["view_kl"])


def test_the_anchor_schedule_follows_the_teacher(tok):
    """Where the gated anchor can never open (a live self-teacher with reverse-KL OPD), the default schedule becomes
    the constant anchor; with a separate teacher it stays gated."""
    from trl_nca import NCAConfig

    args = NCAConfig(output_dir="unused", report_to=[], use_cpu=True, beta=1.0, self_teacher="live")
    student = make_tiny_model(tok, 0)
    live = SelfTeacher(lambda: student, student.config, mode="live")
    assert anchor_schedule(args, args.divergence_spec, live).kind == "constant"
    assert anchor_schedule(args, args.divergence_spec, as_teacher(student)).kind == args.nca_beta_schedule


def test_views_in_sequence_only_where_the_trainer_runs_the_backward(tok):
    """`in_sequence`: only a batch whose backward the trainer runs itself (inside its `training_step`), with
    gradients, where `nca_sequential_views` resolved on."""
    nca = objective(tok, ModelTeacher(make_tiny_model(tok, 1)), sequential_views=True)
    assert nca.sequential
    assert nca.in_sequence(backward_follows=True)
    assert not nca.in_sequence(backward_follows=False)
    with torch.no_grad():
        assert not nca.in_sequence(backward_follows=True)
