"""`NCAConfig.log_grad_cosine_steps`: the logged OPD-vs-NCA gradient cosine is right and leaves training untouched."""

import math

import pytest
import torch
import torch.nn.functional as F
from peft import LoraConfig

from trl_nca import NCAConfig, NCATrainer
from trl_nca.core.gradients import compare_gradients, loss_gradients
from trl_nca.core.views import build_view
from trl_nca.testing import FLOAT64, SHORT_RUN, float64_model, make_tiny_model, prompt_dataset, ragged_answers, run_args


def make_args(tmp_path, **fields):
    return run_args(NCAConfig, tmp_path / "out", {**SHORT_RUN, "max_steps": 3}, **fields)


def train(tok, tmp_path, every, **kwargs):
    torch.manual_seed(0)
    lora = kwargs.pop("lora", None)
    args = make_args(tmp_path, log_grad_cosine_steps=every, **kwargs)
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=None,
        args=args,
        train_dataset=prompt_dataset(8),
        processing_class=tok,
        peft_config=lora,
    )
    trainer.train()
    weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    return weights, trainer.state.log_history


@pytest.mark.parametrize(
    "settings",
    [
        dict(nca_beta=0.5, gradient_accumulation_steps=2),
        # plain OPD: the context view is run only on measured steps; LoRA dropout (kept on) makes it draw random
        # numbers, which must not shift the sampling of later steps
        dict(
            nca_beta=0.0,
            disable_dropout=False,
            lora=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.3, target_modules=["q_proj", "v_proj"]),
        ),
        dict(nca_beta=0.5, gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False}),
        dict(nca_beta=0.5, nca_joint_forward=True),
        dict(nca_beta=0.5, lora=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])),  # in sequence
        dict(nca_beta=0.5, nca_sequential_views=True, gradient_accumulation_steps=2),
    ],
    ids=["nca-ga2", "opd-lora-dropout", "nca-checkpointing", "nca-joint-forward", "nca-lora", "nca-in-sequence"],
)
def test_training_is_bit_identical_with_the_measurement_on(tok, tmp_path, settings):
    """On-policy training (sampling draws from the global random stream) gives the same weights and the same logged
    losses, bit for bit, with the gradient cosine logged every step, every other step, or never."""
    runs = {every: train(tok, tmp_path / f"every{every}", every, **dict(settings)) for every in (0, 1, 2)}
    weights0, logs0 = runs[0]
    for every in (1, 2):
        weights, logs = runs[every]
        for name, value in weights0.items():
            assert torch.equal(value, weights[name]), (every, name)
        steps = [h for h in logs if "loss" in h and "train_runtime" not in h]
        assert [h["loss"] for h in steps] == [h["loss"] for h in logs0 if "loss" in h and "train_runtime" not in h]
        measured = [h["step"] for h in steps if "grad_cosine" in h]
        assert measured == [s for s in (1, 2, 3) if (s - 1) % every == 0]  # logged after steps 0, N, 2N (0-based)
        for h in steps:
            if "grad_cosine" in h:
                assert -1.0 <= h["grad_cosine"] <= 1.0 and h["grad_norm_opd"] > 0 and h["grad_norm_nca"] > 0
    assert not any("grad_cosine" in h for h in logs0)


def full_logit_gradient_cosine(student, teacher, batch, params):
    """Cosine between the gradients of two separate full-logit losses (token means), each accumulated into .grad."""

    def logprobs(model, prompts_key, mask_key):
        view = build_view(batch[prompts_key], batch[mask_key], batch["completion_ids"], batch["completion_mask"])
        out = model(input_ids=view.input_ids, attention_mask=view.attention_mask, position_ids=view.position_ids)
        return F.log_softmax(out.logits[:, view.prompt_width - 1 :][batch["completion_mask"].bool()].double(), -1)

    grads = []
    for term in ("opd", "nca"):
        student.zero_grad(set_to_none=True)
        lx = logprobs(student, "prompts", "prompt_attention_mask")
        if term == "opd":
            with torch.no_grad():
                lt = logprobs(teacher, "context_prompts", "context_prompt_attention_mask")
            loss = (lx.exp() * (lx - lt)).sum(-1).mean()
        else:
            lc = logprobs(student, "context_prompts", "context_prompt_attention_mask")
            p = lx.detach()
            loss = (p.exp() * (p - lc)).sum(-1).mean()
        loss.backward()
        grads.append([p.grad.clone() for p in params])
    a, b = (torch.cat([g.reshape(-1) for g in gs]).double() for gs in grads)
    return (a @ b / (a.norm() * b.norm())).item(), a.norm().item(), b.norm().item()


@pytest.mark.numerics
@pytest.mark.parametrize("sequential", [False, True], ids=["both-views", "in-sequence"])
def test_logged_cosine_equals_two_separate_full_logit_losses(tok, tmp_path, sequential):
    """Fixed reference completions, one step: grad_cosine, grad_norm_opd and grad_norm_nca equal the cosine and norms
    of the gradients of a full-logit OPD loss and a full-logit NCA loss, each backpropagated on its own."""
    # float64 models: a cosine of two nearly orthogonal gradients keeps no relative precision in float32
    student, teacher = float64_model(make_tiny_model(tok, 0)), float64_model(make_tiny_model(tok, 1))
    args = make_args(
        tmp_path,
        max_steps=1,
        lmbda=0.0,
        log_grad_cosine_steps=1,
        optim="sgd",
        learning_rate=0.0,
        nca_sequential_views=sequential,
    )
    trainer = NCATrainer(
        model=student,
        teacher_model=teacher,
        args=args,
        train_dataset=ragged_answers(2, words_per_row=2),
        processing_class=tok,
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    reference = copy_model(student, tok)
    cosine, norm_opd, norm_nca = full_logit_gradient_cosine(reference, teacher, batch, list(reference.parameters()))
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "grad_cosine" in h]
    assert log["grad_cosine"] == FLOAT64.approx(cosine)
    assert log["grad_norm_opd"] == FLOAT64.approx(norm_opd)
    assert log["grad_norm_nca"] == FLOAT64.approx(norm_nca)
    assert abs(cosine) < 0.999  # the two gradients are not trivially parallel on this batch


def copy_model(model, tok):
    clone = make_tiny_model(tok, 0)
    if next(model.parameters()).dtype == torch.float64:
        clone = float64_model(clone)
    clone.load_state_dict(model.state_dict())
    return clone


@pytest.mark.numerics
def test_compare_gradients_is_the_flattened_cosine():
    torch.manual_seed(0)
    a = [torch.randn(3, 4, dtype=torch.float64), torch.randn(5, dtype=torch.float64)]
    b = [torch.randn(3, 4, dtype=torch.float64), torch.randn(5, dtype=torch.float64)]
    flat_a, flat_b = torch.cat([t.reshape(-1) for t in a]), torch.cat([t.reshape(-1) for t in b])
    result = compare_gradients(a, b)
    assert result.cosine == FLOAT64.approx(F.cosine_similarity(flat_a, flat_b, dim=0).item())
    assert result.norm_a == FLOAT64.approx(flat_a.norm().item()) and result.num_params == 17
    assert math.isnan(compare_gradients([torch.zeros(2)], [torch.ones(2)]).cosine)
    w = torch.nn.Parameter(torch.ones(2))
    unused = torch.nn.Parameter(torch.ones(3))
    grads = loss_gradients((w * 3).sum(), [w, unused])
    assert torch.equal(grads[0], torch.full((2,), 3.0)) and torch.equal(grads[1], torch.zeros(3))
    assert w.grad is None  # .grad is left alone


def test_bad_settings_are_refused(tok, tmp_path):
    with pytest.raises(ValueError, match="log_grad_cosine_steps must be an integer >= 0"):
        make_args(tmp_path, log_grad_cosine_steps=-1)
    args = make_args(
        tmp_path,
        log_grad_cosine_steps=1,
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": True},
    )
    with pytest.raises(ValueError, match="reentrant gradient checkpointing"):
        NCATrainer(model=make_tiny_model(tok), args=args, train_dataset=prompt_dataset(8), processing_class=tok)
