"""NCADistillationTrainer (NCA on TRL's DistillationTrainer) on tiny offline models: the same loss as NCATrainer and
as a full-logit reference, gradient accumulation, resume, evaluation, the LoRA self-teacher, bad input."""

import copy

import pytest
import torch
from datasets import Dataset

from trl_nca import NCAConfig, NCADistillationConfig, NCADistillationTrainer, NCATrainer
from trl_nca.testing import (
    CONTEXT,
    FLOAT64,
    KL32,
    ONE_SGD_STEP,
    QUESTIONS,
    STORED32,
    batch_dict,
    cloned_parameters,
    float64_model,
    full_logprobs,
    make_tiny_model,
    make_tiny_tokenizer,
    prompt_dataset,
    record_batches,
    run_args,
    token_kl,
)
from trl_nca.trainers.teacher import ModelTeacher, SelfTeacher


def ragged(model, tok):
    """Many end-of-turn ids, so sampled completions stop at different lengths (a ragged completion block)."""
    model.generation_config.eos_token_id = [tok.eos_token_id, *range(40, 100)]
    return model


# One step of 4 rows, 8 sampled tokens, SGD at learning rate 1 without clipping (the update is the gradient).
DISTILLATION_STEP = ONE_SGD_STEP


def make_args(tmp_path, **fields):
    return run_args(NCADistillationConfig, tmp_path / "out", DISTILLATION_STEP, **fields)


def full_logit_loss(student, teacher, inputs, nca_beta):
    """OPD (reverse KL) + nca_beta * KL(sg[q_x] || q_c), token mean, from the models' own full logits (an independent
    reference: the model's forward and log_softmax in float64, no chunking). Returns (loss, per-term token means)."""
    completions = (inputs.completion_ids, inputs.completion_mask)
    lx = full_logprobs(student, inputs.prompts, inputs.prompt_attention_mask, *completions)
    lc = full_logprobs(student, inputs.context_prompts, inputs.context_prompt_attention_mask, *completions)
    with torch.no_grad():
        lt = full_logprobs(teacher, inputs.context_prompts, inputs.context_prompt_attention_mask, *completions)
    opd = token_kl(lx, lt)
    nca = token_kl(lx.detach(), lc)
    entropy = -(lx.exp() * lx).sum(-1)
    terms = {"opd": opd.mean(), "nca": nca.mean(), "entropy": entropy.mean()}
    return opd.mean() + nca_beta * nca.mean(), terms


@pytest.mark.numerics
def test_first_step_equals_nca_trainer_and_full_logit_reference(tok, tmp_path):
    """One SGD step (lr 1, no clipping) of NCADistillationTrainer on its own on-policy samples: its logged loss and
    terms equal NCATrainer's loss on the same completions and a full-logit reference, and its weight update equals
    minus the gradient of both (so the gradients agree too). The context prompts it builds equal NCATrainer's."""
    teacher = float64_model(make_tiny_model(tok, 1))
    student = ragged(float64_model(make_tiny_model(tok, 0)), tok)
    initial = copy.deepcopy(student)
    trainer = NCADistillationTrainer(
        model=student,
        teacher_model=copy.deepcopy(teacher),
        args=make_args(tmp_path),
        train_dataset=prompt_dataset(),
        processing_class=tok,
    )
    calls = record_batches(trainer)
    trainer.train()
    (inputs,) = calls
    lengths = inputs.completion_mask.sum(1)
    assert len(set(lengths.tolist())) > 1, "the test needs ragged completions"
    update = {n: p.detach() - initial.get_parameter(n) for n, p in student.named_parameters()}
    (log,) = [h for h in trainer.state.log_history if "opd_loss" in h]

    # NCATrainer on the same completions, same initial weights and teacher.
    nca_student = copy.deepcopy(initial)
    nca = NCATrainer(
        model=nca_student,
        teacher_model=copy.deepcopy(teacher),
        processing_class=tok,
        train_dataset=prompt_dataset(),
        args=NCAConfig(
            output_dir=str(tmp_path / "nca"),
            use_cpu=True,
            report_to=[],
            nca_beta=0.5,
            max_new_tokens=8,
            nca_beta_schedule="constant",
            gradient_checkpointing=False,
        ),
    )
    rows = [nca.train_dataset[i] for i in range(4)]
    ours = {tuple(r["prompt_ids"]): r["context_prompt_ids"] for r in rows}
    for ids, mask, cids, cmask in zip(
        inputs.prompts, inputs.prompt_attention_mask, inputs.context_prompts, inputs.context_prompt_attention_mask
    ):
        assert ours[tuple(ids[mask.bool()].tolist())] == cids[cmask.bool()].tolist()
    nca_loss = nca.compute_loss(nca_student, batch_dict(inputs))  # NCATrainer's view keys are the fields
    nca_loss.backward()

    ref_student = copy.deepcopy(initial)
    ref64, terms64 = full_logit_loss(ref_student, teacher, inputs, 0.5)
    ref64.backward()

    # float64 models and reference throughout; Trainer's logged loss and TRL's entropy pass through float32
    assert log["loss"] == STORED32.approx(nca_loss.item())
    assert log["loss"] == STORED32.approx(ref64.item())
    assert log["opd_loss"] == FLOAT64.approx(terms64["opd"].item())
    assert log["nca_loss"] == FLOAT64.approx(terms64["nca"].item())
    assert log["entropy"] == STORED32.approx(terms64["entropy"].item())
    for name, delta in update.items():
        scale = delta.abs().max()
        FLOAT64.close(-delta, nca_student.get_parameter(name).grad, scale=scale)
        FLOAT64.close(-delta, ref_student.get_parameter(name).grad, scale=scale)
    assert any(d.abs().sum() > 0 for d in update.values())


@pytest.mark.numerics
def test_gradient_accumulation_equals_one_large_batch(tok, tmp_path):
    """Ragged on-policy completions: batch 4 x GA 1 and batch 2 x GA 2 sample the same completions and give the same
    SGD update and the same logged token means."""
    updates, logs = [], []
    for bs, ga in ((4, 1), (2, 2)):
        student = ragged(float64_model(make_tiny_model(tok, 0)), tok)
        before = cloned_parameters(student)
        args = make_args(tmp_path, per_device_train_batch_size=bs, gradient_accumulation_steps=ga, seed=1)
        trainer = NCADistillationTrainer(
            model=student,
            teacher_model=float64_model(make_tiny_model(tok, 1)),
            args=args,
            train_dataset=prompt_dataset(),
            processing_class=tok,
        )
        calls = record_batches(trainer)
        trainer.train()
        lengths = torch.cat([c.completion_mask.sum(1) for c in calls])
        assert len(calls) == ga and len(set(lengths.tolist())) > 1
        if ga == 2:
            assert calls[0].completion_mask.sum() != calls[1].completion_mask.sum()  # unequal micro-batches
        updates.append({n: p.detach() - before[n] for n, p in student.named_parameters()})
        logs.append(next(h for h in trainer.state.log_history if "opd_loss" in h))
    for name in updates[0]:  # float64 models
        FLOAT64.close(updates[0][name], updates[1][name], scale=updates[0][name].abs().max())
    for key in ("opd_loss", "nca_loss", "view_kl"):
        assert logs[0][key] == FLOAT64.approx(logs[1][key]), key
    assert logs[0]["loss"] == STORED32.approx(logs[1]["loss"])  # Trainer's logged loss passes through float32
    assert logs[1]["loss"] == STORED32.approx(logs[1]["opd_loss"] + 0.5 * logs[1]["nca_loss"])


def test_resume_from_checkpoint_is_exact(tok, tmp_path):
    """4 straight steps == 2 steps, checkpoint, resume for 2 more: samples, optimizer, RNG and the anchor schedule
    (a warm-up, whose weight depends on the steps done) all restored."""
    finals = []
    for resume in (False, True):
        out = tmp_path / ("resumed" if resume else "straight")
        args = make_args(
            tmp_path,
            output_dir=str(out),
            max_steps=4,
            save_strategy="steps",
            save_steps=2,
            optim="adamw_torch",
            learning_rate=1e-2,
            per_device_train_batch_size=2,
            nca_beta_schedule="warmup",
            nca_warmup_steps=4,
        )
        trainer = NCADistillationTrainer(
            model=ragged(make_tiny_model(tok, 0), tok),
            teacher_model=make_tiny_model(tok, 1),
            args=args,
            train_dataset=prompt_dataset(8),
            processing_class=tok,
        )
        trainer.train(resume_from_checkpoint=str(tmp_path / "straight" / "checkpoint-2") if resume else None)
        finals.append(
            (cloned_parameters(trainer.model), [h["nca_beta"] for h in trainer.state.log_history if "nca_beta" in h])
        )
    (p0, betas0), (p1, betas1) = finals
    assert betas1 == betas0 and betas0[2] > 0  # the resumed run's history holds the checkpoint's first two steps
    for name in p0:
        assert torch.equal(p0[name], p1[name]), name


@pytest.mark.numerics
def test_evaluation_reports_token_means_over_the_set(tok, tmp_path):
    """Evaluation samples completions and scores them: eval_loss and the eval terms are token means over the whole
    evaluation set (two ragged batches), equal to the full-logit reference on the evaluated batches."""
    student = ragged(float64_model(make_tiny_model(tok, 0)), tok)
    teacher = float64_model(make_tiny_model(tok, 1))
    args = make_args(tmp_path, per_device_eval_batch_size=2)
    trainer = NCADistillationTrainer(
        model=student,
        teacher_model=teacher,
        args=args,
        train_dataset=prompt_dataset(),
        eval_dataset=prompt_dataset(4),
        processing_class=tok,
    )
    seen = []
    original = trainer.compute_loss

    def spy(model, inputs, *a, **k):
        seen.append(
            trainer.nca_batch({**inputs, **{f: inputs[f].clone() for f in ("completion_ids", "completion_mask")}})
        )
        return original(model, inputs, *a, **k)

    trainer.compute_loss = spy
    metrics = trainer.evaluate()
    assert len(seen) == 2
    sums, tokens = {"loss": 0.0, "opd": 0.0, "nca": 0.0}, 0
    with torch.no_grad():
        for inputs in seen:
            n = int(inputs.completion_mask.sum())
            loss, terms = full_logit_loss(student, teacher, inputs, 0.5)
            sums["loss"] += loss.item() * n
            sums["opd"] += terms["opd"].item() * n
            sums["nca"] += terms["nca"].item() * n
            tokens += n
    assert seen[0].completion_mask.sum() != seen[1].completion_mask.sum()  # a mean of means would differ
    assert metrics["eval_loss"] == FLOAT64.approx(sums["loss"] / tokens)  # float64 models and reference
    assert metrics["eval_opd_loss"] == FLOAT64.approx(sums["opd"] / tokens)
    assert metrics["eval_nca_loss"] == FLOAT64.approx(sums["nca"] / tokens)


@pytest.mark.numerics
def test_lora_self_teacher_is_the_adapter_disabled_student(tok, tmp_path):
    """teacher_model=None with LoRA: the teacher is the student with its adapter disabled (no parameters of its own,
    no second copy), and it scores exactly as the initial model does, also after training."""
    from peft import LoraConfig

    student = make_tiny_model(tok, 0)
    initial = copy.deepcopy(student).eval()
    args = make_args(tmp_path, max_steps=2, per_device_train_batch_size=2, learning_rate=5e-2)
    peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    trainer = NCADistillationTrainer(
        model=student, args=args, train_dataset=prompt_dataset(), processing_class=tok, peft_config=peft
    )
    assert isinstance(trainer.teacher_model, SelfTeacher)
    assert sum(1 for _ in trainer.teacher_model.parameters()) == 0
    calls = record_batches(trainer)
    trainer.train()
    inputs = calls[-1]
    trainer.model.eval()
    with torch.no_grad():
        self_terms = trainer.nca.token_divergences(trainer.model, inputs, need_context=True)
        trainer.nca.teacher, kept = ModelTeacher(initial), trainer.nca.teacher
        copy_terms = trainer.nca.token_divergences(trainer.model, inputs, need_context=True)
        trainer.nca.teacher = kept
    assert self_terms["opd"].abs().sum() > 0  # the adapter was trained: the student moved away from its teacher
    KL32.close(self_terms["opd"], copy_terms["opd"])  # per-token KLs of two float32 teachers with the same weights


@pytest.mark.numerics
def test_nca_beta_zero_runs_no_context_view(tok, tmp_path):
    """nca_beta=0 is plain OPD: the student runs one view per micro-batch (the context view is not computed), and
    the loss equals the full-logit OPD."""
    student = ragged(float64_model(make_tiny_model(tok, 0)), tok)
    initial = copy.deepcopy(student)
    teacher = float64_model(make_tiny_model(tok, 1))
    trainer = NCADistillationTrainer(
        model=student,
        teacher_model=teacher,
        args=make_args(tmp_path, nca_beta=0.0),
        train_dataset=prompt_dataset(),
        processing_class=tok,
    )
    calls = record_batches(trainer)
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "opd_loss" in h]
    assert "nca_loss" not in log
    with torch.no_grad():
        _, terms = full_logit_loss(initial, teacher, calls[0], 0.0)
    assert log["loss"] == STORED32.approx(terms["opd"].item())  # float64 models; Trainer's logged loss: float32
    # The loss runs one student forward (the no-context view); with the NCA term on, two.
    assert _student_forwards_in_loss(tok, tmp_path, 0.0) == 1
    assert _student_forwards_in_loss(tok, tmp_path, 0.5) == 2


def _student_forwards_in_loss(tok, tmp_path, nca_beta):
    """Student forwards of one loss, one per view (the shared-prefix pass, a forward of its own, is off here)."""
    student = make_tiny_model(tok, 0)
    args = make_args(tmp_path, nca_beta=nca_beta, share_prefix=False)
    trainer = NCADistillationTrainer(
        model=student,
        teacher_model=make_tiny_model(tok, 1),
        args=args,
        train_dataset=prompt_dataset(),
        processing_class=tok,
    )
    calls = record_batches(trainer)
    trainer.train()
    forwards = []
    handle = student.model.register_forward_hook(lambda *a: forwards.append(1))
    trainer.nca.token_divergences(student, calls[0], need_context=trainer.nca.need_context())
    handle.remove()
    return len(forwards)


def test_bad_input_gets_clear_errors(tok, tmp_path):
    def build(args=None, data=None, **kwargs):
        return NCADistillationTrainer(
            model=make_tiny_model(tok, 0),
            teacher_model=make_tiny_model(tok, 1),
            processing_class=tok,
            args=args if args is not None else make_args(tmp_path),
            train_dataset=data if data is not None else prompt_dataset(),
            **kwargs,
        )

    with pytest.raises(TypeError, match="needs an NCADistillationConfig, got NCAConfig"):
        build(args=NCAConfig(output_dir=str(tmp_path / "x"), use_cpu=True, report_to=[]))
    with pytest.raises(ValueError, match="no context column 'context'.*'prompt'"):
        build(data=Dataset.from_dict({"prompt": QUESTIONS}))
    with pytest.raises(ValueError, match="row 1.*no user turn"):
        build(
            data=Dataset.from_dict(
                {
                    "prompt": [[{"role": "user", "content": "a"}], [{"role": "system", "content": "b"}]],
                    "context": [CONTEXT] * 2,
                }
            )
        )
    with pytest.raises(ValueError, match="row 0.*context view is too long"):
        build(args=make_args(tmp_path, max_context_length=40))
    with pytest.raises(ValueError, match="does not take `tools`"):
        build(tools=[len])
    with pytest.raises(ValueError, match="nca_beta must be a finite number.*the str '0.5'"):
        make_args(tmp_path, nca_beta="0.5")
    with pytest.raises(ValueError, match="eval_completions='dataset' is not available"):
        make_args(tmp_path, eval_completions="dataset")
    with pytest.raises(ValueError, match="log_grad_cosine_steps is not available"):
        make_args(tmp_path, log_grad_cosine_steps=2)
    with pytest.raises(ValueError, match="divergence_top_k must be an integer >= 1"):
        make_args(tmp_path, divergence_support="top_k", divergence_top_k=0)
    # a served teacher (tests/vllm_cpu run it against a server): only on the teacher's top-k, and never beside a local one
    with pytest.raises(ValueError, match="teacher_model_server_url is set with divergence_support='full'"):
        make_args(tmp_path, teacher_model_server_url="http://127.0.0.1:1")
    served = {"teacher_model_server_url": "http://127.0.0.1:1", "divergence_support": "teacher_top_k"}
    with pytest.raises(ValueError, match="teacher_model_server_url is set and a teacher model is given too"):
        build(args=make_args(tmp_path, **served))
    # A prompt rendered differently by DistillationTrainer (here: chat_template_kwargs) is refused at sampling.
    tok2 = make_tiny_tokenizer()
    tok2.chat_template = tok2.chat_template.replace("{% for", "{% if extra %}extra{% endif %}{% for", 1)
    trainer = NCADistillationTrainer(
        model=make_tiny_model(tok2, 0),
        teacher_model=make_tiny_model(tok2, 1),
        processing_class=tok2,
        args=make_args(tmp_path, chat_template_kwargs={"extra": True}),
        train_dataset=prompt_dataset(),
    )
    with pytest.raises(ValueError, match="rendered a prompt into .* tokens.*chat_template_kwargs"):
        trainer.train()


@pytest.mark.parametrize(
    "lora_dropout, disable_dropout, warned", [(0.05, False, True), (0.0, False, False), (0.05, True, False)]
)
def test_lora_dropout_turning_prefix_sharing_off_is_said_once(
    tok, tmp_path, caplog, lora_dropout, disable_dropout, warned
):
    """TRL's ModelConfig LoRA dropout (0.05) with DistillationConfig's `disable_dropout=False`: the student's views
    cannot share their prefix (rows would share its dropout draws). One warning at setup says so and names the fix;
    the LoRA self-teacher (adapter and its dropout disabled) still shares."""
    import logging

    from peft import LoraConfig

    from trl_nca.core.prefix import PrefixSharing

    args = make_args(tmp_path, disable_dropout=disable_dropout)
    peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=lora_dropout)
    with caplog.at_level(logging.WARNING):
        trainer = NCADistillationTrainer(
            model=make_tiny_model(tok, 0),
            args=args,
            train_dataset=prompt_dataset(),
            processing_class=tok,
            peft_config=peft,
        )
    lines = [
        r.getMessage()
        for r in caplog.records
        if "Shared-prefix reuse (share_prefix=True) will be off" in r.getMessage()
    ]
    assert len(lines) == (1 if warned else 0), lines
    if warned:
        assert "lora_dropout" in lines[0] and "p=0.05" in lines[0] and "disable_dropout=True" in lines[0]
    student = trainer.accelerator.unwrap_model(trainer.model)
    student.train()
    sharing = PrefixSharing()
    assert (sharing.problem(student) is not None) == warned  # the student's views: dropout drawn
    with trainer.accelerator.unwrap_model(trainer.teacher_model).active() as teacher:
        assert sharing.problem(teacher) is None  # adapter disabled: its dropout is not drawn
