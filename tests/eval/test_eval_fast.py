"""The evaluation's fast path (issue 30) against the plain path: the k samples of an item's view in one generate call,
whose prompts share one prefill (`HFBackend(share_prompts=True)`), give the records of one call per sample index with
every prompt run in full; and the bad input of `samples_per_view`: an estimate line from the first call, a refusal
above `MAX_SAMPLES_PER_VIEW`. Speed is measured in benchmarks/bench_fr30.py, not here."""

import logging

import pytest
import torch

from trl_nca.core.sampling import GenerationSettings, HFBackend
from trl_nca.core.views import ContextSpec, render_prompt_ids
from trl_nca.eval import PairedEvaluator
from trl_nca.eval.errors import EvalInputError
from trl_nca.eval.paired import MAX_SAMPLES_PER_VIEW
from trl_nca.testing import CONTEXT, make_tiny_model


def char_sum(text, label):
    return sum(map(ord, text)) % 3 != 0


def rows(n=7):
    return [
        {
            "id": f"q{i}",
            "prompt": f"Question {i}{'?' * (i % 3)}: which answer? (A) yes (B) no",
            "answer": "AB"[i % 2],
            "context": CONTEXT,
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def model(tok):
    return make_tiny_model(tok).eval()


@pytest.fixture(scope="module")
def lora_model(tok):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    return get_peft_model(make_tiny_model(tok), config).eval()


def evaluator(k, batch_size=4, **kwargs):
    return PairedEvaluator(
        rows(),
        id_column="id",
        context=ContextSpec(),
        scorer=char_sum,
        samples_per_view=k,
        generation=GenerationSettings(max_new_tokens=7, batch_size=batch_size, seed=3),
        **kwargs,
    )


def written(records):
    out = [r.to_dict() for r in records]
    for record in out:
        record["meta"].pop("versions")
    return out


@pytest.mark.parametrize("which", ["model", "lora_model"])
def test_grouped_samples_with_a_shared_prefill_give_the_records_of_the_plain_path(tok, which, request):
    """Both changes of the fast path at once, on the base and on a LoRA student: the same records, every field."""
    model = request.getfixturevalue(which)
    # batch 6: two items per call, so each row must get its own item's prefill
    plain = evaluator(3, batch_size=6, group_samples=False).run(
        model, tok, progress=False, backend=HFBackend(model, tok, share_prompts=False)
    )
    backend = HFBackend(model, tok)
    fast = evaluator(3, batch_size=6).run(model, tok, progress=False, backend=backend)
    assert backend.prefill_rows_saved == 7 * 2 * 2  # every item's view ran its prompt once for 3 samples
    assert written(fast) == written(plain)
    assert len({s["completion"] for r in fast for s in r.x.extra["samples"]}) > 1  # the samples do differ


@pytest.mark.parametrize("greedy", [False, True])
def test_shared_prefill_gives_the_tokens_of_full_prompts(tok, model, greedy):
    """Rows that repeat a prompt, in any order and next to other prompts of other lengths, sampled with their own
    seeds: the same completions as every prompt run in full."""
    a, b, c = (
        render_prompt_ids(tok, [{"role": "user", "content": q}])
        for q in ("Push the box.", "Frozen lake: up, then left and down", "Is this statement hateful?")
    )
    prompts, seeds = [a, b, a, c, b, a], [11, 12, 13, 14, 15, 16]
    settings = GenerationSettings(max_new_tokens=9, batch_size=6, do_sample=not greedy)
    shared = HFBackend(model, tok)
    got = shared.generate(prompts, seeds, settings)
    want = HFBackend(model, tok, share_prompts=False).generate(prompts, seeds, settings)
    assert shared.prefill_rows_saved == 3
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    if not greedy:
        assert got[0].token_ids != got[2].token_ids or got[0].token_ids != got[5].token_ids  # own seed per row


def test_one_sample_per_view_is_the_call_order_of_before(tok, model):
    """With k = 1 the grouped order is the order of before (no prompt repeats, nothing is shared)."""
    backend = HFBackend(model, tok)
    grouped = evaluator(1).run(model, tok, progress=False, backend=backend)
    plain = evaluator(1, group_samples=False).run(
        model, tok, progress=False, backend=HFBackend(model, tok, share_prompts=False)
    )
    assert backend.prefill_rows_saved == 0 and written(grouped) == written(plain)


def test_the_estimate_is_logged_after_the_first_call(tok, model, caplog):
    with caplog.at_level(logging.WARNING, logger="trl_nca.eval.paired"):
        evaluator(2, batch_size=4).run(model, tok, progress=False)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Paired evaluation:")]
    # 7 items, 2 per chunk (batch 4 // k 2): 4 chunks of one call per view
    assert (
        "7 items x 2 views x 2 sample(s) = 28 replies of at most 7 new tokens, in 4 chunks of 2 generate calls" in line
    )
    assert "in all" in line


@pytest.mark.parametrize("k", [MAX_SAMPLES_PER_VIEW + 1, 10**12])
def test_too_many_samples_per_view_are_refused_before_any_work(k):
    with pytest.raises(
        EvalInputError, match=f"is more than {MAX_SAMPLES_PER_VIEW}: each sample is one more generation"
    ):
        evaluator(k)
    evaluator(MAX_SAMPLES_PER_VIEW)  # the limit itself is accepted
