"""Sampling with a shared prefill (`trl_nca.core.sampling.shared_prefill`): the tokens every prompt of a call starts
with run once at batch size 1, and each distinct prompt once; `generate` then continues as from the left-padded batch.
Exactness is checked in float64 (the scores of every generated step against those of the plain batch), then the
tokens in float32, for `HFBackend` and for the trainer's on-policy sampling, and the models it must not share for."""

import logging

import pytest
import torch
from datasets import Dataset

from trl_nca import NCAConfig, NCATrainer
from trl_nca.core import sampling
from trl_nca.core.sampling import GenerationSettings, HFBackend, shared_prefill, shared_prefix_tokens
from trl_nca.core.views import left_pad, render_prompt_ids
from trl_nca.testing import CONTEXT, FLOAT64, SHORT_RUN, float64_model, make_tiny_model, run_args


QUESTIONS = ["Push the box.", "Frozen lake: up, then left and down", "Is this statement hateful?", "Which answer?"]


def prompts_with_system(tok, order=(0, 1, 0, 2, 3, 1)):
    """Chat prompts that share the system message (and the template's opening), of several lengths, some repeated."""
    rendered = [
        render_prompt_ids(tok, [{"role": "system", "content": CONTEXT}, {"role": "user", "content": q}])
        for q in QUESTIONS
    ]
    return [rendered[i] for i in order]


def test_shared_prefix_tokens():
    assert shared_prefix_tokens([[1, 2, 3, 4, 5], [1, 2, 3, 9, 9, 9]]) == 3
    assert shared_prefix_tokens([[1, 2, 3, 4], [1, 2, 3, 4, 5, 6]]) == 2  # each row keeps a suffix and a last token
    assert shared_prefix_tokens([[1, 2, 3], [1, 2, 3]]) == 0  # one distinct prompt: nothing to share across prompts
    assert shared_prefix_tokens([[7, 2], [8, 2]]) == 0


@pytest.mark.numerics
@pytest.mark.parametrize("share_repeats", [True, False])
def test_every_step_scores_as_the_left_padded_batch_in_float64(tok, share_repeats):
    """The prefill's layout (prefix | padding | suffix) and cache give every generated step the logits of the plain
    left-padded batch, to float64 rounding, and the same tokens."""
    model = float64_model(make_tiny_model(tok)).eval()
    prompts = prompts_with_system(tok)
    tokens = shared_prefix_tokens(prompts)
    assert tokens >= 16  # the template's opening and the system message
    prefill = shared_prefill(model, prompts, tok.pad_token_id, tokens, share_repeats=share_repeats)
    assert prefill.prefix_tokens == tokens
    assert prefill.rows_saved == (2 if share_repeats else 0)
    assert not any(layer.keys.requires_grad for layer in prefill.cache.layers)  # sampling keeps no graph
    ids, mask = left_pad(prompts, tok.pad_token_id)
    settings = {
        "max_new_tokens": 6,
        "do_sample": False,
        "output_scores": True,
        "return_dict_in_generate": True,
        "pad_token_id": tok.pad_token_id,
        "eos_token_id": None,
    }
    plain = model.generate(input_ids=ids, attention_mask=mask, **settings)
    shared = model.generate(
        input_ids=prefill.input_ids, attention_mask=prefill.attention_mask, **prefill.cache_inputs, **settings
    )
    for got, want in zip(shared.scores, plain.scores):
        FLOAT64.close(got, want)
    assert torch.equal(shared.sequences[:, prefill.input_ids.shape[1] :], plain.sequences[:, ids.shape[1] :])


@pytest.mark.parametrize("share_prompts", [False, True])
@pytest.mark.parametrize("greedy", [False, True])
def test_backend_samples_the_tokens_of_the_unshared_call(tok, share_prompts, greedy):
    model = make_tiny_model(tok).eval()
    prompts = prompts_with_system(tok)
    seeds = [21, 22, 23, 24, 25, 26]
    settings = GenerationSettings(max_new_tokens=9, batch_size=6, do_sample=not greedy)
    backend = HFBackend(model, tok, share_prompts=share_prompts)
    got = backend.generate(prompts, seeds, settings)
    want = HFBackend(model, tok, share_prompts=False, share_prefix=False).generate(prompts, seeds, settings)
    assert backend.prefix_tokens_shared == shared_prefix_tokens(prompts) * ((4 if share_prompts else 6) - 1)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]


def test_short_prefixes_are_not_shared(tok):
    model = make_tiny_model(tok).eval()
    prompts = [render_prompt_ids(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    assert 0 < shared_prefix_tokens(prompts) < sampling.MIN_PREFIX_TOKENS  # the template's opening only
    backend = HFBackend(model, tok)
    backend.generate(prompts, [1, 2, 3, 4], GenerationSettings(max_new_tokens=3, batch_size=4))
    assert backend.prefix_tokens_shared == 0 and backend.prefill_rows_saved == 0


def test_a_sliding_window_model_shares_repeats_but_not_the_prefix(tok, caplog):
    """Key distances in a sliding window would count the padding between prefix and suffix: that model keeps its
    left-padded layout (repeated prompts still run once), and the reason is logged once."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=8,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    model = MistralForCausalLM(config).eval()
    prompts = prompts_with_system(tok)
    settings = GenerationSettings(max_new_tokens=5, batch_size=6)
    backend = HFBackend(model, tok)
    with caplog.at_level(logging.WARNING, logger="trl_nca.core.sampling"):
        got = backend.generate(prompts, list(range(6)), settings)
        backend.generate(prompts, list(range(6)), settings)
    want = HFBackend(model, tok, share_prompts=False, share_prefix=False).generate(prompts, list(range(6)), settings)
    assert backend.prefix_tokens_shared == 0 and backend.prefill_rows_saved == 2 * 2
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    (line,) = [r.getMessage() for r in caplog.records if "shared prefix unshared" in r.getMessage()]
    assert "sliding_attention" in line


def test_the_trainer_samples_with_a_shared_prefix_as_without(tok, tmp_path, monkeypatch):
    """On-policy sampling in `NCATrainer`: prompts sharing a system message run it once (`share_prefix`, the default),
    and the completions and masks equal those of the plain batch from the same random state; `share_prefix=False`
    samples the plain batch."""
    calls = []
    real = sampling.shared_prefill

    def counted(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(out.prefix_tokens)
        return out

    monkeypatch.setattr("trl_nca.trainers.nca_trainer.shared_prefill", counted)
    data = Dataset.from_dict({"prompt": QUESTIONS, "context": ["Be brief."] * 4})
    results = {}
    for share in (True, False):
        args = run_args(NCAConfig, tmp_path / str(share), SHORT_RUN, per_device_train_batch_size=4, share_prefix=share)
        trainer = NCATrainer(model=make_tiny_model(tok), args=args, train_dataset=data, processing_class=tok)
        rows = [
            render_prompt_ids(tok, [{"role": "system", "content": CONTEXT}, {"role": "user", "content": q}])
            for q in QUESTIONS
        ]
        prompts, mask = left_pad(rows, tok.pad_token_id)
        torch.manual_seed(7)
        results[share] = trainer._generate(trainer.model, prompts, mask)
    assert calls == [shared_prefix_tokens(rows)]  # shared once, and only with share_prefix
    for got, want in zip(results[True], results[False]):
        assert torch.equal(got, want)
