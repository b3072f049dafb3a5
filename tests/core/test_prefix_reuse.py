"""Shared-prefix reuse (`trl_nca.core.prefix`, `NCAConfig.share_prefix`) equals the unshared forward, values and
gradients.

Exactness is checked in float64 to 1e-10. The stock Llama and Qwen2 RMSNorm cast to float32 inside even a float64
model, so a gradient summed over the rows before the norm's backward (shared prefix) and one summed after it
(unshared) differ by float32 rounding; the exactness tests swap each RMSNorm for `torch.nn.RMSNorm` with the same
weight and epsilon (`trl_nca.testing.float64_model`: the same formula, in float64).
`test_stock_norms_agree_to_float32_rounding` runs the models as they ship.
"""

import logging
from contextlib import nullcontext

import pytest
import torch
from datasets import Dataset

from trl_nca import NCAConfig, NCATrainer
from trl_nca.core import prefix as prefix_module
from trl_nca.core.prefix import PrefixSharing, shared_prefix_length, split_view
from trl_nca.core.views import View, build_view, completion_states, left_pad, right_pad
from trl_nca.envs.rollout import GameRollout
from trl_nca.testing import CONTEXT as TEST_CONTEXT
from trl_nca.testing import FLOAT64, SHORT_RUN, float64_model, make_tiny_model, make_tiny_tokenizer, run_args


pytestmark = pytest.mark.numerics  # replayed by CI under other vector units (.ci/run)


CONTEXT = TEST_CONTEXT + " The player moves up, down, left or right on the frozen lake and must avoid the holes."


def tiny(tok, seed=0, architecture="llama", exact=True, **config):
    """A tiny test model in float64 (`exact`: with float64 norms); `config` entries change its configuration."""
    model = make_tiny_model(tok, seed, architecture=architecture)
    if config:
        changed = type(model.config)(**{**model.config.to_dict(), **config})
        torch.manual_seed(seed)
        model = type(model)(changed)
    return float64_model(model) if exact else model.double()


def ragged_view(prefix_len=40, suffixes=(3, 7, 1, 12), completions=(5, 2, 6, 0), seed=0):
    """Left-padded prompts sharing `prefix_len` tokens then ragged own tokens; ragged completions, one empty."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(5, 300, (prefix_len,), generator=g).tolist()
    prompts = [shared + torch.randint(5, 300, (n,), generator=g).tolist() for n in suffixes]
    comps = [torch.randint(5, 300, (n,), generator=g).tolist() for n in completions]
    (pi, pm), (ci, cm) = left_pad(prompts, 0), right_pad(comps, 0)
    return build_view(pi, pm, ci, cm), cm


def states_and_grads(fn, model, seed=1):
    """Completion hidden states from `fn()` and the gradients of a fixed nonlinear function of them."""
    h = fn()
    weights = torch.randn(h.shape, generator=torch.Generator().manual_seed(seed), dtype=h.dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    if not torch.is_grad_enabled():
        return h, []
    grads = torch.autograd.grad((h * weights).sum() + h.pow(2).sum(), params, allow_unused=True)
    return h.detach(), [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def assert_same(a, b, relative=None):
    """Equal within FLOAT64, or (`relative`) to `relative` times the largest magnitude of each tensor."""
    (ha, ga), (hb, gb) = a, b
    assert len(ga) == len(gb)
    for x, y in [(ha, hb), *zip(ga, gb)]:
        if relative is None:
            FLOAT64.close(x, y)
        else:
            assert (x - y).abs().max() <= relative * y.abs().max(), ((x - y).abs().max(), y.abs().max())


# ------------------------------------------------------------------------------------------------------------------
# The split itself


def test_split_lines_up_every_real_token_with_its_unshared_position():
    view, _ = ragged_view(prefix_len=6, suffixes=(3, 7, 1, 12), completions=(5, 2, 6, 0))
    assert shared_prefix_length(view) == 6
    split = split_view(view, 6)
    assert split.prefix_ids.tolist() == [view.input_ids[0, view.attention_mask[0].argmax() :][:6].tolist()]
    suffix = split.suffix
    for row in range(view.input_ids.shape[0]):
        real = view.attention_mask[row].bool()
        real_suffix = suffix.attention_mask[row].bool()
        # the same tokens, minus the shared 6, at the same positions
        assert suffix.input_ids[row][real_suffix].tolist() == view.input_ids[row][real][6:].tolist()
        assert suffix.position_ids[row][real_suffix].tolist() == view.position_ids[row][real][6:].tolist()
    # the completion block is unchanged and starts at the suffix's prompt width
    width = view.input_ids.shape[1] - view.prompt_width
    assert torch.equal(suffix.input_ids[:, suffix.prompt_width :], view.input_ids[:, view.prompt_width :])
    assert suffix.input_ids.shape[1] - suffix.prompt_width == width


def test_prefix_stops_before_the_shortest_prompt_ends_and_needs_two_left_padded_rows():
    view, _ = ragged_view(prefix_len=5, suffixes=(0, 4), completions=(2, 3))
    assert shared_prefix_length(view) == 4  # row 0 is all prefix: its last prompt token stays in its suffix
    one, _ = ragged_view(prefix_len=5, suffixes=(4,), completions=(2,))
    assert shared_prefix_length(one) == 0
    right_padded = View(
        view.input_ids.flip(1), view.attention_mask.flip(1), view.position_ids, view.prompt_width
    )  # not left-padded: no common start column
    assert shared_prefix_length(right_padded) == 0
    different, _ = ragged_view(prefix_len=0, suffixes=(5, 6), completions=(2, 3))
    assert shared_prefix_length(different) == 0


# ------------------------------------------------------------------------------------------------------------------
# Exactness of one forward (and backward)


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
@pytest.mark.parametrize("mode", ["full", "lora", "checkpointing", "eager", "no_grad"])
def test_shared_forward_equals_unshared(tok, architecture, mode):
    model = tiny(tok, architecture=architecture)
    if mode == "lora":
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], init_lora_weights=False)
        model = get_peft_model(model, config)
        model.double()
    if mode == "checkpointing":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    view, mask = ragged_view()
    sharing = PrefixSharing(min_tokens=1)
    with torch.no_grad() if mode == "no_grad" else torch.enable_grad():
        unshared = states_and_grads(lambda: completion_states(model, view, mask), model)
        if mode == "eager":
            # Eager attention takes its softmax in float32 (so it agrees to float32 rounding only), where the float64
            # mask value becomes -inf and the unshared forward of left-padded rows is NaN: the shared eager forward is
            # compared with the unshared sdpa one, to float32 rounding.
            model.set_attn_implementation("eager")
        shared = states_and_grads(lambda: sharing.completion_states(model, view, mask, "view"), model)
    assert sharing.last_shared["view"] == 40
    assert_same(shared, unshared, relative=1e-6 if mode == "eager" else None)
    if mode != "no_grad":
        assert any(g.abs().sum() > 0 for g in shared[1])


def drop_cache_like_transformers_5_17(model) -> None:
    """Make every checkpointed layer of `model` drop its key/value cache by transformers 5.17's rule: in training mode,
    with or without gradients, unless the layer says it only reads the cache (`_can_checkpoint_with_cache`); later
    versions drop it only when gradients are enabled. The installed version's own rule still applies underneath."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    if "__call__" in GradientCheckpointingLayer.__dict__:
        return  # a version that checkpoints `__call__` (5.17 and before) applies this rule itself, inside the checkpoint
    for layer in model.modules():
        if not isinstance(layer, GradientCheckpointingLayer):
            continue
        original = layer.forward

        def forward(*args, _layer=layer, _original=original, **kwargs):
            if _layer.gradient_checkpointing and _layer.training and not _layer._can_checkpoint_with_cache:
                for key in ("cache", "past_key_values", "layer_past"):
                    if kwargs.get(key) is not None:
                        kwargs[key] = None
            return _original(*args, **kwargs)

        layer.forward = forward


@pytest.mark.parametrize("rule", ["installed", "5.17"])
@pytest.mark.parametrize("teacher", ["lora_adapter_off", "full"])
def test_teacher_forward_in_training_mode_shares_under_checkpointing(tok, rule, teacher):
    """A teacher's forward inside a training step: training mode, gradient checkpointing on, no gradient (the LoRA
    self-teacher is the student with its adapter disabled). transformers 5.17 (the GPU machine's) drops the cache
    there, 5.24 keeps it: the prefix is shared, and equals the unshared forward, under both rules."""
    model = tiny(tok)
    if teacher == "lora_adapter_off":
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, init_lora_weights=False)
        model = get_peft_model(model, config).double()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    if rule == "5.17":
        drop_cache_like_transformers_5_17(model)
    view, mask = ragged_view()
    sharing = PrefixSharing(min_tokens=1)
    adapter_off = model.disable_adapter() if teacher == "lora_adapter_off" else nullcontext()
    with torch.no_grad(), adapter_off:
        unshared = completion_states(model, view, mask)
        shared = sharing.completion_states(model, view, mask, "teacher")
    assert sharing.last_shared["teacher"] == 40
    FLOAT64.close(shared, unshared)


@pytest.mark.parametrize(
    "break_it",
    ["position_off_by_one", "prefix_tokens_not_masked"],
)
def test_the_exactness_check_catches_a_broken_split(tok, monkeypatch, break_it):
    """The comparison above fails when the split is wrong: it is not satisfied by any two similar-looking forwards."""
    model = tiny(tok)
    view, mask = ragged_view()
    unshared = states_and_grads(lambda: completion_states(model, view, mask), model)
    original = prefix_module.split_view

    def broken(view, length):
        split = original(view, length)
        suffix = split.suffix
        if break_it == "position_off_by_one":
            suffix = View(suffix.input_ids, suffix.attention_mask, suffix.position_ids + 1, suffix.prompt_width)
        else:  # each row's leftover prefix tokens and padding attended to
            suffix = View(
                suffix.input_ids, torch.ones_like(suffix.attention_mask), suffix.position_ids, suffix.prompt_width
            )
        return prefix_module.SplitView(split.prefix_ids, suffix)

    monkeypatch.setattr(prefix_module, "split_view", broken)
    shared = states_and_grads(lambda: PrefixSharing(min_tokens=1).completion_states(model, view, mask, "v"), model)
    with pytest.raises(AssertionError):
        assert_same(shared, unshared)


def test_stock_norms_agree_to_float32_rounding(tok):
    """The models as they ship (RMSNorm in float32 inside a float64 model): identical values, gradients equal to the
    float32 rounding of the norm's backward."""
    view, mask = ragged_view()
    for architecture in ("llama", "qwen2"):
        model = tiny(tok, architecture=architecture, exact=False)
        unshared = states_and_grads(lambda m=model: completion_states(m, view, mask), model)
        shared = states_and_grads(
            lambda m=model: PrefixSharing(min_tokens=1).completion_states(m, view, mask, "v"), model
        )
        FLOAT64.close(shared[0], unshared[0])
        assert_same(shared, unshared, relative=1e-6)


# ------------------------------------------------------------------------------------------------------------------
# Fallbacks, each logged once


class _CacheDroppingModel(torch.nn.Module):
    """A decoder whose forward accepts a cache argument and ignores it (as some remote-code models do)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)


def _fallback_model(tok, case):
    if case == "sliding_window":
        return tiny(
            tok, architecture="qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=1, layer_types=None
        )
    if case == "dropout":
        return tiny(tok, attention_dropout=0.1)
    if case == "attention_implementation":
        model = tiny(tok)
        model.config._attn_implementation = "flash_attention_2"
        return model
    model = tiny(tok)
    if case == "reentrant_checkpointing":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    if case == "cache_ignored":
        dropping = _CacheDroppingModel(model.model)
        model.get_decoder = lambda: dropping
    return model


@pytest.mark.parametrize(
    "case, message",
    [
        ("sliding_window", "not all full attention"),
        ("dropout", "dropout is active"),
        ("attention_implementation", "'flash_attention_2' is not verified"),
        ("reentrant_checkpointing", "reentrant"),
        ("cache_ignored", "_CacheDroppingModel ignored the key/value cache"),
        ("short_prefix", "share only 40 prompt tokens, fewer than share_prefix_min_tokens=41"),
    ],
)
def test_fallback_runs_unshared_and_logs_why_once(tok, caplog, case, message):
    model = _fallback_model(tok, case)
    model.train()
    view, mask = ragged_view()
    sharing = PrefixSharing(min_tokens=41 if case == "short_prefix" else 1)
    if case == "attention_implementation":
        # Only the check is exercised here (no flash-attn kernel on a CPU): the reason is given, nothing runs.
        assert message in sharing.problem(model)[1]
        return
    torch.manual_seed(0)
    reference = completion_states(model, view, mask) if case != "dropout" else None
    with caplog.at_level(logging.INFO, logger="trl_nca.core.prefix"):
        for _ in range(2):
            torch.manual_seed(0)
            out = sharing.completion_states(model, view, mask, "teacher")
            assert sharing.last_shared["teacher"] == 0
            if reference is not None:
                assert torch.equal(out, reference)
    records = [r for r in caplog.records if r.name == "trl_nca.core.prefix"]
    assert len(records) == 1, [r.getMessage() for r in records]
    assert message in records[0].getMessage() and "teacher" in records[0].getMessage()


# ------------------------------------------------------------------------------------------------------------------
# The trainer: teacher and both student views


def make_args(tmp_path, **fields):
    """One step of 4 rows scored off-policy, NCA on, any shared prefix reused."""
    one_step = {
        "max_steps": 1,
        "per_device_train_batch_size": 4,
        "lmbda": 0.0,
        "nca_beta": 0.5,
        "share_prefix_min_tokens": 1,
    }
    return run_args(NCAConfig, tmp_path / "out", {**SHORT_RUN, **one_step}, **fields)


def ragged_dataset(per_row_context: bool, n=4):
    words = (0, 1, 4, 9, 2, 5, 3, 7)
    rows = [
        [
            {"role": "user", "content": f"Question {i}: which answer?" + " (A) yes (B) no" * (i % 3)},
            {"role": "assistant", "content": "<answer>A</answer>" + " ok" * words[i % len(words)]},
        ]
        for i in range(n)
    ]
    contexts = [f"Rule {i}: " + CONTEXT[: 40 + 9 * i] for i in range(n)] if per_row_context else [CONTEXT] * n
    return Dataset.from_dict({"messages": rows, "context": contexts})


def build_trainer(tok, tmp_path, share, teacher="separate", architecture="llama", **kwargs):
    from peft import LoraConfig

    student = tiny(tok, 0, architecture)
    teacher_model = tiny(tok, 1, architecture) if teacher == "separate" else None
    peft = None
    if teacher == "lora_self":
        peft = LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.0)
    per_row = kwargs.pop("per_row_context", False)
    args = make_args(tmp_path, share_prefix=share, **kwargs)
    trainer = NCATrainer(
        model=student,
        teacher_model=teacher_model,
        args=args,
        train_dataset=ragged_dataset(per_row),
        processing_class=tok,
        peft_config=peft,
    )
    trainer.model.double()
    if peft is not None:  # a nonzero adapter, so the views differ from the adapter-disabled teacher
        with torch.no_grad():
            for name, p in trainer.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1)
    return trainer


def terms_and_grads(trainer):
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    batch = trainer.nca_batch(trainer._with_completions(batch, on_policy=False))
    trainer.model.zero_grad()
    terms = trainer.nca.token_divergences(trainer.model, batch, need_context=True)
    (terms["opd"].sum() + terms["nca"].sum()).backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in terms.items()}, grads


@pytest.mark.parametrize(
    "placement, per_row_context, teacher, architecture, joint",
    [
        ("system", False, "separate", "llama", False),
        ("user", False, "separate", "qwen2", False),
        ("system", True, "separate", "llama", False),
        ("user", True, "lora_self", "llama", False),
        ("system", False, "lora_self", "qwen2", False),
        ("user", False, "separate", "llama", True),
    ],
)
def test_trainer_terms_and_gradients_equal_unshared(
    tok, tmp_path, placement, per_row_context, teacher, architecture, joint
):
    results = []
    for share in (False, True):
        trainer = build_trainer(
            tok,
            tmp_path,
            share,
            teacher,
            architecture,
            context_placement=placement,
            per_row_context=per_row_context,
            nca_joint_forward=joint,
        )
        results.append((terms_and_grads(trainer), dict(trainer.nca.prefix_sharing.last_shared)))
    ((t0, g0), shared0), ((t1, g1), shared1) = results
    assert not any(shared0.values())
    context_tokens = len(tok(CONTEXT)["input_ids"])
    if per_row_context:  # only the template's opening (and "Rule ") is common
        assert 0 < shared1["teacher"] < 15 < context_tokens
    else:  # the whole context and what precedes it
        assert shared1["teacher"] >= context_tokens
        if not joint:
            assert shared1["student's context view"] == shared1["teacher"]
    assert shared1["student's joint views" if joint else "student's no-context view"] > 0
    for key in ("opd", "nca", "view_kl"):
        FLOAT64.close(t1[key], t0[key])
    assert g0.keys() == g1.keys() and g0
    for name in g0:
        FLOAT64.close(g1[name], g0[name])


@pytest.mark.parametrize(
    "teacher, checkpointing",
    [("separate", False), ("lora_self", False), ("lora_self", True), ("lora_self", "5.17")],
)
def test_training_with_accumulation_equals_unshared(tok, tmp_path, teacher, checkpointing):
    """Two optimizer steps of 2 micro-batches each (SGD, no clipping): the same weights with and without sharing; the
    LoRA self-teacher keeps its prefix cache across the steps. With gradient checkpointing as the trainer turns it
    on by default (non-reentrant), the student's views share their prefix too; also by transformers 5.17's rule, which
    drops the cache of a checkpointed layer in training mode even without gradients (the self-teacher's forward)."""
    finals = []
    for share in (False, True):
        trainer = build_trainer(
            tok,
            tmp_path,
            share,
            teacher,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            max_steps=2,
            optim="sgd",
            learning_rate=0.5,
            max_grad_norm=0.0,
            lr_scheduler_type="constant",
            gradient_checkpointing=bool(checkpointing),
        )
        if checkpointing == "5.17":
            drop_cache_like_transformers_5_17(trainer.model)
        trainer.train_dataset = trainer.train_dataset.select([0, 1, 2, 3, 0, 1, 2, 3])
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        finals.append({n: p.detach().clone() for n, p in trainer.model.named_parameters()})
        if share:
            assert trainer.nca.prefix_sharing.last_shared["teacher"] > 0
            assert trainer.nca.prefix_sharing.last_shared["student's context view"] > 0
    assert any(not torch.equal(finals[0][n], before[n]) for n in before)
    for name in finals[0]:
        FLOAT64.close(finals[1][name], finals[0][name])


def _prefix_passes(model):
    """Count the decoder forwards of batch size 1 (the prefix passes)."""
    calls = []
    decoder = model.get_decoder()
    handle = decoder.register_forward_pre_hook(
        lambda m, a, k: calls.append(k["input_ids"].shape[0]) if k.get("input_ids") is not None else None,
        with_kwargs=True,
    )
    return calls, handle


@pytest.mark.parametrize("teacher", ["separate", "lora_self"])
def test_teacher_prefix_cache_persists_while_its_weights_do(tok, tmp_path, teacher):
    trainer = build_trainer(tok, tmp_path, True, teacher)
    batch = trainer.nca_batch(
        trainer._with_completions(trainer.data_collator([trainer.train_dataset[i] for i in range(4)]), on_policy=False)
    )
    view = build_view(
        batch.context_prompts,
        batch.context_prompt_attention_mask,
        batch.completion_ids,
        batch.completion_mask,
    )
    mask = batch.completion_mask
    head = None
    model = trainer.teacher_model if teacher == "separate" else trainer.model

    def unshared():
        with torch.no_grad():
            if teacher == "separate":
                return completion_states(model, view, mask)
            with model.disable_adapter():
                return completion_states(model, view, mask)

    calls, handle = _prefix_passes(model)
    try:
        first, _ = trainer.nca.teacher_states(view, mask, None, head)
        FLOAT64.close(first, unshared())
        # the student's (trainable) weights change: a step of the optimizer, in place
        with torch.no_grad():
            for p in trainer.model.parameters():
                if p.requires_grad:
                    p.add_(0.01)
        again, _ = trainer.nca.teacher_states(view, mask, None, head)
        assert calls.count(1) == 1  # the prefix ran once for both calls
        FLOAT64.close(again, unshared())
        # the teacher's own weights change: the prefix is recorded again
        with torch.no_grad():
            frozen = [p for n, p in model.named_parameters() if "lora_" not in n]
            frozen[3].mul_(1.5)
        changed, _ = trainer.nca.teacher_states(view, mask, None, head)
        assert calls.count(1) == 2
        FLOAT64.close(changed, unshared())
        assert (changed - first).abs().max() > 1e-6
        # another context (another prefix): recorded again
        plain = build_view(batch.prompts, batch.prompt_attention_mask, batch.completion_ids, mask)
        trainer.nca.teacher_states(plain, mask, None, head)
        assert calls.count(1) == 3
    finally:
        handle.remove()


def test_live_self_teacher_never_keeps_its_prefix(tok, tmp_path):
    trainer = build_trainer(tok, tmp_path, True, teacher="live_self", self_teacher="live")
    batch = trainer.nca_batch(
        trainer._with_completions(trainer.data_collator([trainer.train_dataset[i] for i in range(4)]), on_policy=False)
    )
    view = build_view(
        batch.context_prompts,
        batch.context_prompt_attention_mask,
        batch.completion_ids,
        batch.completion_mask,
    )
    calls, handle = _prefix_passes(trainer.model)
    try:
        for _ in range(2):
            trainer.nca.teacher_states(view, batch.completion_mask, None, None)
    finally:
        handle.remove()
    assert calls.count(1) == 2


def test_game_rollout_training_equals_unshared(tmp_path):
    """Two steps on played FrozenLake episodes (the experience in the user turn of every sample)."""
    tok = make_tiny_tokenizer()
    finals = []
    for share in (False, True):
        model = tiny(tok, 0)
        args = make_args(
            tmp_path,
            share_prefix=share,
            max_steps=2,
            per_device_train_batch_size=2,
            lmbda=1.0,
            max_length=None,
            learning_rate=1e-2,
            max_new_tokens=4,
        )
        rollout = GameRollout(game="frozenlake", episodes_per_step=2, max_calls=2)
        trainer = NCATrainer(model=model, args=args, processing_class=tok, rollout=rollout)
        torch.manual_seed(0)
        trainer.train()
        finals.append({n: p.detach().clone() for n, p in model.named_parameters()})
        if share:
            assert trainer.nca.prefix_sharing.last_shared["student's context view"] > 50
    for name in finals[0]:
        FLOAT64.close(finals[1][name], finals[0][name])


def test_config_switch(tok, tmp_path):
    assert NCAConfig(output_dir=str(tmp_path)).share_prefix is True
    trainer = build_trainer(tok, tmp_path, False)
    terms_and_grads(trainer)
    assert trainer.nca.prefix_sharing.last_shared and not any(trainer.nca.prefix_sharing.last_shared.values())
    with pytest.raises(ValueError, match="share_prefix_min_tokens must be an integer >= 1"):
        make_args(tmp_path, share_prefix_min_tokens=0)
