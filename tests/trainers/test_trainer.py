"""NCATrainer end to end on tiny offline models: alignment, gradient paths, accumulation, teachers, runs."""

import copy

import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset
from trl.experimental.gkd import GKDTrainer

from trl_nca import NCAConfig, NCATrainer
from trl_nca.core.views import build_view, completion_states
from trl_nca.testing import (
    CONTEXT,
    FLOAT64,
    SHORT_RUN,
    STORED32,
    batch_dict,
    cloned_parameters,
    float64_model,
    full_logprobs,
    make_tiny_model,
    make_tiny_tokenizer,
    prompt_dataset,
    ragged_answers,
    run_args,
    token_kl,
)


def make_args(tmp_path, **fields):
    return run_args(NCAConfig, tmp_path / "out", SHORT_RUN, **fields)


def messages_dataset(n=4):
    """Reference answers one word longer each row."""
    return ragged_answers(n, words_per_row=1)


def reference_terms(student, teacher, batch, temperature=1.0):
    """Per-token OPD (reverse KL), NCA and view KL of a batch from the models' own full logits, in float64."""
    batch = batch_dict(batch)
    completions = (batch["completion_ids"], batch["completion_mask"], temperature)
    with torch.no_grad():
        lx = full_logprobs(student, batch["prompts"], batch["prompt_attention_mask"], *completions)
        lc = full_logprobs(student, batch["context_prompts"], batch["context_prompt_attention_mask"], *completions)
        lt = full_logprobs(teacher, batch["context_prompts"], batch["context_prompt_attention_mask"], *completions)
    return {"opd": token_kl(lx, lt), "nca": token_kl(lx, lc), "view_kl": token_kl(lx, lc)}


def record_loss_calls(trainer, mode):
    """Wrap `trainer.compute_loss` to keep, for each call in `mode` ("train"/"eval"), its batch and the student's
    weights at that moment, so a reference can recompute the logged numbers independently afterwards."""
    calls = []
    original = trainer.compute_loss

    def spy(model, inputs, *args, **kwargs):
        if trainer.model.training == (mode == "train"):
            weights = {n: t.detach().clone() for n, t in trainer.model.state_dict().items()}
            calls.append(({k: v.clone() if torch.is_tensor(v) else v for k, v in batch_dict(inputs).items()}, weights))
        return original(model, inputs, *args, **kwargs)

    trainer.compute_loss = spy
    return calls


def reference_means(tok, teacher, calls, seed=0):
    """Token means of the reference terms over the recorded batches, each scored with the weights of its call."""
    sums, tokens = {"opd": 0.0, "nca": 0.0, "view_kl": 0.0}, 0
    for inputs, weights in calls:
        student = make_tiny_model(tok, seed)
        if next(iter(weights.values())).dtype == torch.float64:
            student = float64_model(student)
        student.load_state_dict(weights)
        student.eval()
        for key, value in reference_terms(student, teacher, inputs).items():
            sums[key] += value.sum().item()
        tokens += int(inputs["completion_mask"].sum())
    return {key: value / tokens for key, value in sums.items()}


def ragged_messages_dataset(extra_words=(0, 1, 4, 9)):
    """Reference completions whose token counts differ so much that no split into micro-batches balances them."""
    rows = [
        [
            {"role": "user", "content": f"Question {i}: which answer? (A) yes (B) no"},
            {"role": "assistant", "content": "<answer>A</answer>" + " ok" * n},
        ]
        for i, n in enumerate(extra_words)
    ]
    return Dataset.from_dict({"messages": rows, "context": [CONTEXT] * len(rows)})


@pytest.mark.numerics
def test_views_align_with_unpadded_single_forwards(tok, tmp_path):
    """Completion-token logits of both views of a padded batch equal each example's own unpadded forward."""
    model = float64_model(make_tiny_model(tok))
    trainer = NCATrainer(
        model=model,
        teacher_model=make_tiny_model(tok, 1),
        args=make_args(tmp_path),
        train_dataset=prompt_dataset(3),
        processing_class=tok,
    )
    data = trainer.train_dataset
    batch = trainer.data_collator([data[i] for i in range(3)])
    completions = [[5, 9, 13, 7], [21], []]  # ragged, one empty
    ids = torch.zeros(3, 4, dtype=torch.long)
    mask = torch.zeros(3, 4, dtype=torch.long)
    for i, c in enumerate(completions):
        ids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
        mask[i, : len(c)] = 1
    model.eval()
    for prompts_key, mask_key, ids_key in (
        ("prompts", "prompt_attention_mask", "prompt_ids"),
        ("context_prompts", "context_prompt_attention_mask", "context_prompt_ids"),
    ):
        view = build_view(batch[prompts_key], batch[mask_key], ids, mask)
        h = completion_states(model, view, mask)
        logits = model.lm_head(h)
        row = 0
        for i, c in enumerate(completions):
            full = torch.tensor([data[i][ids_key] + c])
            ref = model(full).logits[0, len(data[i][ids_key]) - 1 : -1]
            FLOAT64.close(logits[row : row + len(c)], ref)  # float64 model
            row += len(c)
        assert row == h.shape[0]


@pytest.mark.numerics
def test_loss_matches_full_logit_reference_and_gradient_paths(tok, tmp_path):
    """On a fixed batch: loss = OPD + nca_beta * NCA against full logits, and NCA's gradient skips the x view."""
    torch.manual_seed(0)
    student, teacher = float64_model(make_tiny_model(tok, 0)), float64_model(make_tiny_model(tok, 1))
    args = make_args(tmp_path, nca_beta=0.5, lmbda=0.0)
    trainer = NCATrainer(
        model=student, teacher_model=teacher, args=args, train_dataset=messages_dataset(3), processing_class=tok
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(3)])
    inputs = trainer._with_completions(batch, on_policy=False)
    loss = trainer.compute_loss(student, inputs)
    batch = trainer.nca_batch(inputs)

    cids, cmask = batch.completion_ids, batch.completion_mask
    vx = build_view(batch.prompts, batch.prompt_attention_mask, cids, cmask)
    vc = build_view(batch.context_prompts, batch.context_prompt_attention_mask, cids, cmask)

    def comp_logits(model, view):
        out = model(input_ids=view.input_ids, attention_mask=view.attention_mask, position_ids=view.position_ids)
        return out.logits[:, view.prompt_width - 1 :][cmask.bool()]

    lx, lc = comp_logits(student, vx), comp_logits(student, vc)
    with torch.no_grad():
        lt = comp_logits(teacher, vc)
    labels = torch.zeros(1, lx.shape[0], dtype=torch.long)  # every completion token counts
    opd = GKDTrainer.generalized_jsd_loss(lx[None], lt[None], labels=labels, beta=1.0)
    px = F.log_softmax(lx, -1)
    nca = F.kl_div(F.log_softmax(lc, -1), px.detach(), log_target=True, reduction="batchmean")
    FLOAT64.close(loss, opd + 0.5 * nca)  # float64 models and reference

    # The NCA term sends no gradient through the no-context view; OPD none through the context view.
    for term, silent, loud in (("nca", 0, 1), ("opd", 1, 0)):
        outputs = []

        def keep(module, args, kwargs, output, outputs=outputs):
            if output[0].shape[0] == batch.prompts.shape[0]:  # the rows of a view, not a shared prefix's one row
                output[0].retain_grad()
                outputs.append(output[0])

        handle = student.model.register_forward_hook(keep, with_kwargs=True)
        terms = trainer.nca.token_divergences(student, batch, need_context=True)
        handle.remove()
        assert len(outputs) == 2
        terms[term].sum().backward()
        assert outputs[silent].grad is None or not outputs[silent].grad.abs().sum()
        assert outputs[loud].grad.abs().sum() > 0
        student.zero_grad()


@pytest.mark.numerics
def test_nca_beta_zero_is_plain_opd(tok, tmp_path):
    """nca_beta=0: no context-view forward, loss is the OPD token mean of each step's on-policy samples (checked
    against full logits with the weights of that step), weights identical with monitoring on."""
    results = []
    for monitor in (False, True):
        torch.manual_seed(0)
        student, teacher = float64_model(make_tiny_model(tok, 0)), float64_model(make_tiny_model(tok, 1))
        args = make_args(tmp_path, nca_beta=0.0, nca_monitor=monitor)
        trainer = NCATrainer(
            model=student, teacher_model=teacher, args=args, train_dataset=prompt_dataset(), processing_class=tok
        )
        recorded = record_loss_calls(trainer, "train")
        calls = []
        handle = student.model.register_forward_hook(lambda m, a, k, calls=calls: calls.append(1))
        trainer.train()
        handle.remove()
        logs = [h for h in trainer.state.log_history if "opd_loss" in h]
        assert len(logs) == len(recorded) == 2  # one micro-batch per step
        for log, call in zip(logs, recorded):
            ref = reference_means(tok, teacher, [call])
            assert log["loss"] == STORED32.approx(ref["opd"])  # Trainer's logged loss passes through float32
            assert log["opd_loss"] == FLOAT64.approx(ref["opd"])
            if monitor:
                assert log["nca_loss"] == FLOAT64.approx(ref["nca"])
        assert ("nca_loss" in logs[0]) == monitor
        results.append((cloned_parameters(student), len(calls)))
    (p0, calls0), (p1, calls1) = results
    assert calls1 > calls0  # monitoring runs the context view, plain OPD does not
    for name in p0:
        assert torch.equal(p0[name], p1[name]), name


@pytest.mark.numerics
def test_gradient_accumulation_matches_double_batch(tok, tmp_path):
    """Fixed (off-policy) samples: batch 4 x GA 1 and batch 2 x GA 2 give the same SGD update."""
    updates = []
    for bs, ga in ((4, 1), (2, 2)):
        student = float64_model(make_tiny_model(tok, 0))
        before = cloned_parameters(student)
        args = make_args(
            tmp_path,
            per_device_train_batch_size=bs,
            gradient_accumulation_steps=ga,
            max_steps=1,
            lmbda=0.0,
            optim="sgd",
            learning_rate=1.0,
            max_grad_norm=0.0,
            lr_scheduler_type="constant",
        )
        trainer = NCATrainer(
            model=student,
            teacher_model=float64_model(make_tiny_model(tok, 1)),
            args=args,
            train_dataset=messages_dataset(4),
            processing_class=tok,
        )
        trainer.train()
        updates.append({n: p.detach() - before[n] for n, p in student.named_parameters()})
    for name in updates[0]:
        FLOAT64.close(updates[0][name], updates[1][name], scale=updates[0][name].abs().max())  # float64 models
    assert any(u.abs().sum() > 0 for u in updates[0].values())


@pytest.mark.numerics
def test_logged_terms_are_token_means_over_the_step(tok, tmp_path):
    """GA=2 with ragged completions: opd_loss, nca_loss, view_kl and loss are token means over the whole optimizer
    step (not averages of per-micro-batch means), equal to a full-logit reference, and loss = opd + beta * nca."""
    student, teacher = float64_model(make_tiny_model(tok, 0)), float64_model(make_tiny_model(tok, 1))
    args = make_args(
        tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=1, lmbda=0.0, nca_beta=0.5
    )
    trainer = NCATrainer(
        model=student, teacher_model=teacher, args=args, train_dataset=ragged_messages_dataset(), processing_class=tok
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    ref = {k: v.mean().item() for k, v in reference_terms(student, teacher, batch).items()}
    tokens = batch["completion_mask"].sum(1).tolist()
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "opd_loss" in h]
    for key, name in (("opd", "opd_loss"), ("nca", "nca_loss"), ("view_kl", "view_kl")):
        assert log[name] == FLOAT64.approx(ref[key]), name  # float64 models and reference
    assert log["loss"] == STORED32.approx(ref["opd"] + 0.5 * ref["nca"])  # Trainer's logged loss: float32
    assert log["loss"] == STORED32.approx(log["opd_loss"] + 0.5 * log["nca_loss"])
    assert log["completions/mean_length"] == pytest.approx(sum(tokens) / 4)


def test_lora_self_teacher_is_initial_model(tok, tmp_path):
    """teacher_model=None with LoRA: adapter-disabled student == initial weights, before and after training."""
    from peft import LoraConfig

    student = make_tiny_model(tok, 0)
    initial = copy.deepcopy(student).eval()
    args = make_args(tmp_path, learning_rate=5e-2, max_steps=3)
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    trainer = NCATrainer(
        model=student, args=args, train_dataset=prompt_dataset(), processing_class=tok, peft_config=peft_config
    )
    from trl_nca.trainers.teacher import SelfTeacher

    assert isinstance(trainer.accelerator.unwrap_model(trainer.teacher_model), SelfTeacher)
    probe = torch.tensor([[3, 17, 40, 8, 99, 120]])

    def teacher_logits():
        with torch.no_grad(), trainer.accelerator.unwrap_model(trainer.teacher_model).active() as m:
            return m(input_ids=probe).logits

    torch.testing.assert_close(teacher_logits(), initial(input_ids=probe).logits)
    trainer.train()
    torch.testing.assert_close(teacher_logits(), initial(input_ids=probe).logits)
    with torch.no_grad():
        assert not torch.allclose(trainer.model(input_ids=probe).logits, initial(input_ids=probe).logits)


def test_trained_adapter_gets_a_frozen_copy_teacher(tok, tmp_path):
    """An adapter that is not a no-op at the start: the teacher is a frozen merged copy of the starting student."""
    from peft import LoraConfig, get_peft_model

    base = make_tiny_model(tok, 0)
    student = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    probe = torch.tensor([[3, 17, 40, 8, 99, 120]])
    start_model = copy.deepcopy(student).eval()
    trainer = NCATrainer(model=student, args=make_args(tmp_path), train_dataset=prompt_dataset(), processing_class=tok)
    teacher = trainer.accelerator.unwrap_model(trainer.teacher_model)
    assert not hasattr(teacher, "active")
    with torch.no_grad():
        torch.testing.assert_close(teacher(input_ids=probe).logits, start_model(input_ids=probe).logits)
    merged_start = start_model.merge_and_unload().state_dict()
    lora_start = {n: p.detach().clone() for n, p in student.named_parameters() if "lora" in n}
    trainer.train()
    for name, value in teacher.state_dict().items():
        assert torch.equal(value, merged_start[name]), name
    # Called directly (as seq_kd generation does), the copy runs its own weights, not the trained student's.
    with torch.no_grad():
        torch.testing.assert_close(teacher(input_ids=probe).logits, start_model(input_ids=probe).logits)
    moved = [n for n, p in student.named_parameters() if "lora" in n and not torch.equal(p, lora_start[n])]
    assert moved, "the student's adapter should have trained"


def test_full_model_self_teacher_is_frozen_copy(tok, tmp_path):
    student = make_tiny_model(tok, 0)
    initial = copy.deepcopy(student)
    args = make_args(tmp_path, learning_rate=5e-2)
    trainer = NCATrainer(model=student, args=args, train_dataset=prompt_dataset(), processing_class=tok)
    trainer.train()
    probe = torch.tensor([[3, 17, 40, 8]])
    with torch.no_grad():
        torch.testing.assert_close(
            trainer.accelerator.unwrap_model(trainer.teacher_model)(input_ids=probe).logits,
            initial(input_ids=probe).logits,
        )
        assert not torch.allclose(student(input_ids=probe).logits, initial(input_ids=probe).logits)


def test_pad_token_equal_to_eos(tmp_path):
    tok = make_tiny_tokenizer()
    tok.pad_token = tok.eos_token
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=make_tiny_model(tok, 1),
        args=make_args(tmp_path, max_new_tokens=12),
        train_dataset=prompt_dataset(),
        processing_class=tok,
    )
    batch = trainer.data_collator([trainer.train_dataset[0]])
    ids, mask = batch["context_prompts"][0], batch["context_prompt_attention_mask"][0]
    # The ChatML prompt contains <|im_end|> (= pad) after the system turn; it stays a real token.
    assert int(((ids == tok.eos_token_id) & (mask == 1)).sum()) >= 2
    trainer.train()
    assert trainer.state.global_step == 2


def test_long_context_is_never_truncated(tok, tmp_path):
    long_context = " ".join(f"rule {i}: push the box onto the target." for i in range(60))
    ds = Dataset.from_dict({"prompt": ["Push the box."] * 2, "context": [long_context] * 2})
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=make_tiny_model(tok, 1),
        args=make_args(tmp_path, max_length=48, max_steps=1),
        train_dataset=ds,
        processing_class=tok,
    )
    row = trainer.train_dataset[0]
    assert len(row["context_prompt_ids"]) > 48
    assert long_context in tok.decode(row["context_prompt_ids"])
    trainer.train()


def test_context_too_long_errors_or_truncates_context_only(tok, tmp_path, caplog):
    long_context = "rule: push the box onto the target. " * 40
    ds = Dataset.from_dict({"prompt": ["Push the box."], "context": [long_context]})
    kwargs = dict(model=make_tiny_model(tok, 0), teacher_model=make_tiny_model(tok, 1), processing_class=tok)
    with pytest.raises(ValueError, match=r"row 0.*context view is too long.*max_context_length=100"):
        NCATrainer(args=make_args(tmp_path, max_context_length=100), train_dataset=ds, **kwargs)
    trainer = NCATrainer(
        args=make_args(tmp_path, max_context_length=100, truncate_context=True), train_dataset=ds, **kwargs
    )
    row = trainer.train_dataset[0]
    assert len(row["context_prompt_ids"]) + 6 <= 100
    assert tok.decode(row["prompt_ids"]).split("user\n")[-1] in tok.decode(row["context_prompt_ids"])
    assert "Truncated the context of row 0" in caplog.text


@pytest.mark.numerics
def test_two_step_runs_with_eval_and_messages_format(tok, tmp_path):
    """Evaluation over 3 rows in batches of 2: eval_loss and the logged terms are token means over the whole set of
    sampled completions, equal to a full-logit reference on the recorded batches."""
    teacher = float64_model(make_tiny_model(tok, 1))
    trainer = NCATrainer(
        model=float64_model(make_tiny_model(tok, 0)),
        teacher_model=teacher,
        args=make_args(tmp_path, eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=2, lmbda=0.5),
        train_dataset=messages_dataset(),
        eval_dataset=prompt_dataset(3),
        processing_class=tok,
    )
    trainer.train()
    recorded = record_loss_calls(trainer, "eval")
    metrics = trainer.evaluate()
    for key in ("eval_loss", "eval_opd_loss", "eval_nca_loss", "eval_view_kl", "eval_completions/mean_length"):
        assert key in metrics, key
    assert [int(inputs["completion_mask"].shape[0]) for inputs, _ in recorded] == [2, 1]
    ref = reference_means(tok, teacher, recorded)
    assert metrics["eval_loss"] == FLOAT64.approx(ref["opd"] + 0.5 * ref["nca"])  # float64 models and reference
    for key in ("opd", "nca", "view_kl"):
        assert metrics[f"eval_{key}_loss" if key != "view_kl" else "eval_view_kl"] == FLOAT64.approx(ref[key])
    tokens = sum(int(inputs["completion_mask"].sum()) for inputs, _ in recorded)
    assert metrics["eval_completions/mean_length"] == pytest.approx(tokens / 3)


def test_user_placement_and_fixed_context(tok, tmp_path):
    ds = Dataset.from_dict({"prompt": ["Push the box."] * 2})
    args = make_args(tmp_path, context_text="Boxes move when pushed.", context_placement="user", max_steps=1)
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=make_tiny_model(tok, 1),
        args=args,
        train_dataset=ds,
        processing_class=tok,
    )
    text = tok.decode(trainer.train_dataset[0]["context_prompt_ids"])
    assert "user\nBoxes move when pushed.\n\nPush the box." in text
    trainer.train()


def test_resume_from_checkpoint_is_exact(tok, tmp_path):
    """4 straight steps == 2 steps, checkpoint, resume for 2 more (samples, optimizer and RNG all restored)."""
    finals = []
    for resume in (False, True):
        out = tmp_path / ("resumed" if resume else "straight")
        kwargs = dict(output_dir=str(out), max_steps=4, save_strategy="steps", save_steps=2, learning_rate=1e-2)

        trainer = NCATrainer(
            model=make_tiny_model(tok, 0),
            teacher_model=make_tiny_model(tok, 1),
            args=make_args(tmp_path, **kwargs),
            train_dataset=prompt_dataset(8),
            processing_class=tok,
        )
        if resume:
            trainer.train(resume_from_checkpoint=str(out.parent / "straight" / "checkpoint-2"))
        else:
            trainer.train()
        finals.append(cloned_parameters(trainer.model))
    for name in finals[0]:
        assert torch.equal(finals[0][name], finals[1][name]), name


def test_live_self_teacher_scores_with_current_weights(tok, tmp_path):
    """self_teacher='live': the teacher is the current student on the context view, detached."""
    student = make_tiny_model(tok, 0)
    args = make_args(tmp_path, self_teacher="live", lmbda=0.0, nca_beta=0.5)
    trainer = NCATrainer(model=student, args=args, train_dataset=messages_dataset(2), processing_class=tok)
    batch = trainer.nca_batch(
        trainer._with_completions(trainer.data_collator([trainer.train_dataset[i] for i in range(2)]), on_policy=False)
    )
    terms = trainer.nca.token_divergences(student, batch, need_context=True)
    # Teacher == q_c (detached), so OPD = KL(q_x || q_c) = the monitored view KL, and equals NCA in value.
    torch.testing.assert_close(terms["opd"], terms["view_kl"])
    torch.testing.assert_close(terms["opd"].detach(), terms["nca"].detach())
    trainer.train()


@pytest.mark.parametrize("lora", [False, True])
def test_seq_kd_teacher_writes_completions_from_the_context_view(tok, tmp_path, lora):
    """seq_kd with lmbda=0: the teacher samples the completions, reading the context."""
    from peft import LoraConfig

    teacher = None if lora else make_tiny_model(tok, 1)
    peft = LoraConfig(r=4, target_modules=["q_proj", "v_proj"]) if lora else None
    args = make_args(tmp_path, lmbda=0.0, seq_kd=True, max_steps=1)
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=teacher,
        args=args,
        train_dataset=prompt_dataset(2),
        processing_class=tok,
        peft_config=peft,
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    calls = []
    original = trainer._generate

    def spy(model, prompts, mask, teacher=None):
        calls.append((prompts, teacher))
        return original(model, prompts, mask, teacher=teacher)

    trainer._generate = spy
    out = trainer._with_completions(trainer._prepare_inputs(batch), on_policy=False)
    assert torch.equal(calls[0][0], batch["context_prompts"])  # sampled from the context view
    assert (calls[0][1] is not None) == lora  # the adapter-disabled student generates as the teacher
    assert out["completion_ids"].shape[1] > 0
    trainer.train()


@pytest.mark.numerics
def test_joint_forward_equals_two_forwards(tok, tmp_path):
    """nca_joint_forward: one 2B-row forward gives the same per-token terms and gradients as two forwards."""
    results = []
    for joint in (False, True):
        student = float64_model(make_tiny_model(tok, 0))
        args = make_args(tmp_path, lmbda=0.0, nca_joint_forward=joint)
        trainer = NCATrainer(
            model=student,
            teacher_model=float64_model(make_tiny_model(tok, 1)),
            args=args,
            train_dataset=messages_dataset(3),
            processing_class=tok,
        )
        batch = trainer.nca_batch(
            trainer._with_completions(
                trainer.data_collator([trainer.train_dataset[i] for i in range(3)]), on_policy=False
            )
        )
        terms = trainer.nca.token_divergences(student, batch, need_context=True)
        (terms["opd"].sum() + terms["nca"].sum()).backward()
        results.append((terms, {n: p.grad.clone() for n, p in student.named_parameters()}))
    (t0, g0), (t1, g1) = results
    for key in ("opd", "nca", "view_kl"):
        FLOAT64.close(t0[key], t1[key])  # float64 models: the two batch shapes differ only in summation order
    for name in g0:
        FLOAT64.close(g0[name], g1[name], scale=g0[name].abs().max())
