"""k samples per view: k = 1 is today's evaluation exactly, k > 1 shares seeds per sample index between the views, and
the per-item success rates give the documented expected harm and a paired permutation test over items."""

import json
from pathlib import Path

import numpy as np
import pytest

from trl_nca.core.sampling import HFBackend, generate_fn
from trl_nca.core.views import ContextSpec
from trl_nca.eval import GenerationSettings, PairedEvaluator, compute_metrics
from trl_nca.eval.errors import EvalInputError
from trl_nca.eval.metrics import mcnemar_exact, sign_flip_test
from trl_nca.eval.paired import sample_seed
from trl_nca.eval.records import PairedRecord, ViewOutcome
from trl_nca.testing import CONTEXT, make_tiny_model


# Tolerances: pytest.approx with its default tolerance compares float64 arithmetic on counts and rewards with exact
# fractions (error near 1e-16); trl_nca.testing names the tolerances of float computations.


GOLDEN = Path(__file__).parents[1] / "data" / "paired_k1_golden.json"


def char_sum(text, label):
    """A deterministic scorer that marks about two thirds of the tiny model's responses right."""
    return sum(map(ord, text)) % 3 != 0


def rows(n=8):
    return [
        {
            "id": f"q{i}",
            "prompt": f"Question {i}: which answer? (A) yes (B) no",
            "answer": "AB"[i % 2],
            "context": CONTEXT,
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def model(tok):
    return make_tiny_model(tok).eval()


def evaluator(**kwargs):
    return PairedEvaluator(
        rows(),
        id_column="id",
        context=ContextSpec(),
        scorer=char_sum,
        generation=GenerationSettings(max_new_tokens=6, batch_size=3, seed=0),
        **kwargs,
    )


def test_one_sample_per_view_keeps_the_records_and_numbers_of_before(tok, model):
    """The golden file holds the records and metrics that the evaluation wrote before `samples_per_view` existed
    (commit b5e5ba5, this test's evaluation with its tiny model, scorer and seeds; library versions left out), and the
    tiny model's weights fingerprint. The metrics of the stored records are checked everywhere; the records themselves
    where torch initialises the tiny model to the same weights."""
    from trl_nca.eval.provenance import model_identity

    golden = json.loads(GOLDEN.read_text())

    def as_before(metrics):  # the metrics that existed then (later ones, such as the harm floor, are added)
        metrics = json.loads(json.dumps(metrics))
        metrics["ci"] = {k: v for k, v in metrics["ci"].items() if k in golden["metrics"]["ci"]}
        return {k: v for k, v in metrics.items() if k in golden["metrics"]}

    stored = [PairedRecord.from_dict(r) for r in golden["records"]]
    assert as_before(compute_metrics(stored, n_bootstrap=50)) == golden["metrics"]
    if model_identity(model, None, None) != golden["model"]:  # torch's initialisation rounds differently on this CPU
        pytest.skip("the tiny model's initial weights differ from those the golden records were generated with")
    for ev in (evaluator(), evaluator(samples_per_view=1)):
        records = ev.run(model, tok, progress=False)
        written = [r.to_dict() for r in records]
        for record in written:
            record["meta"].pop("versions")
        assert written == golden["records"]
        assert as_before(compute_metrics(records, n_bootstrap=50)) == golden["metrics"]


def test_k_samples_share_seeds_per_sample_index_and_extend_the_one_sample_record(tok, model):
    one = evaluator().run(model, tok, progress=False)
    ev = evaluator(samples_per_view=3)
    three = ev.run(model, tok, progress=False)
    generate = generate_fn(HFBackend(model, tok), ev.generation)
    for r1, r3, item in zip(one, three, ev.items(tok)):
        assert r3.x.completion == r1.x.completion and r3.xc.completion == r1.xc.completion  # sample 0 is unchanged
        assert r3.meta["samples_per_view"] == 3
        for view, prompt in (("x", item.prompt_ids_x), ("xc", item.prompt_ids_xc)):
            samples = getattr(r3, view).extra["samples"]
            assert len(samples) == 2
            for index, sample in enumerate(samples, start=1):
                (expected,) = generate([prompt], [sample_seed(item.seed, index)])  # both views: the same seed
                assert sample["completion"] == expected.text
    assert len({r.x.extra["samples"][0]["completion"] for r in three} | {r.x.completion for r in three}) > len(three)
    assert "samples_per_view" not in evaluator().describe() and ev.describe()["samples_per_view"] == 3
    metrics = compute_metrics(three, n_bootstrap=20)
    p_x = [
        np.mean([char_sum(s, None) for s in [r.x.completion, *(v["completion"] for v in r.x.extra["samples"])]])
        for r in three
    ]
    assert metrics["acc_x"] == pytest.approx(np.mean(p_x)) and metrics["samples_per_view"] == 3


def view(correct_samples):
    """A view whose k samples are right or wrong as given."""
    outcomes = [ViewOutcome(str(i), None, bool(c), 3, False, False) for i, c in enumerate(correct_samples)]
    first = outcomes[0]
    first.extra = {"samples": [vars(o) for o in outcomes[1:]]} if len(outcomes) > 1 else {}
    return first


def test_expected_harm_and_help_from_per_item_success_rates():
    # p_x = (1, 1/2, 0, 0), p_xc = (1/2, 1/2, 1, 1)
    x = [[1, 1], [1, 0], [0, 0], [0, 0]]
    xc = [[1, 0], [0, 1], [1, 1], [1, 1]]
    records = [PairedRecord(f"i{i}", view(a), view(b)) for i, (a, b) in enumerate(zip(x, xc))]
    m = compute_metrics(records, n_bootstrap=0)
    assert m["acc_x"] == pytest.approx(1.5 / 4) and m["acc_xc"] == pytest.approx(3 / 4)
    # harm = sum p_x (1 - p_xc) / sum p_x = (1/2 + 1/4 + 0 + 0) / 1.5; help = sum (1 - p_x) p_xc / sum (1 - p_x)
    assert m["harm"] == pytest.approx(0.75 / 1.5) and m["help"] == pytest.approx(2.25 / 2.5)
    assert m["harm_count"] == pytest.approx(0.75) and m["delta"] == pytest.approx(1.5 / 4)
    assert m["both_correct"] == pytest.approx((0.5 + 0.25 + 0 + 0) / 4)
    # differences p_xc - p_x: -1/2, 0, +1, +1 (sum 3/2); of the 8 sign flips of the non-zero ones, |sum| >= 3/2 for
    # (+-1/2, +1, +1) and (+-1/2, -1, -1): 4 of 8
    assert m["mcnemar_p"] is None and m["permutation_p"] == pytest.approx(4 / 8) and m["regime"] == "C"


def test_sign_flip_test_is_exact_and_equals_mcnemar_on_binary_differences():
    assert sign_flip_test([1, 1, 1, 1, 1])["p"] == pytest.approx(2 / 32)
    assert sign_flip_test([0, 0])["p"] == 1.0
    rng = np.random.default_rng(0)
    for _ in range(20):
        d = rng.choice([-1, 0, 1], size=int(rng.integers(1, 15)))
        assert sign_flip_test(d)["p"] == pytest.approx(mcnemar_exact(int((d < 0).sum()), int((d > 0).sum())))
    # 25 non-zero differences all of one sign: Monte Carlo, (1 + hits) / (1 + resamples) with no chance of a hit
    big = sign_flip_test([1.0] * 25, n_resamples=2000)
    assert not big["exact"] and big["p"] == pytest.approx(1 / 2001)


@pytest.mark.parametrize("k", [0, -2, 1.5, True, "2"])
def test_samples_per_view_must_be_a_positive_integer(k):
    with pytest.raises(EvalInputError, match="samples_per_view must be an integer >= 1"):
        evaluator(samples_per_view=k)


def test_callback_passes_samples_per_view(tok, model):
    from trl_nca.eval.callback import PairedEvalCallback

    callback = PairedEvalCallback(
        rows(3),
        context=ContextSpec(),
        scorer=char_sum,
        id_column="id",
        num_items=3,
        samples_per_view=2,
        generation=GenerationSettings(max_new_tokens=4),
    )
    records, metrics = callback.evaluate(model, tok, step=0)
    assert all(len(r.xc.extra["samples"]) == 1 for r in records) and metrics["samples_per_view"] == 2


def test_cli_samples_per_view(tmp_path, tiny_dir, capsys):
    from trl_nca.cli.eval import main

    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(3)))
    argv = [
        "--model",
        tiny_dir,
        "--dataset",
        str(data),
        "--id-column",
        "id",
        "--max-new-tokens",
        "4",
        "--no-plots",
        "--bootstrap",
        "0",
        "--no-progress",
        "--output-dir",
        str(tmp_path / "out"),
    ]
    assert main([*argv, "--samples-per-view", "2"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["models"][0]["metrics"]["samples_per_view"] == 2
    assert "(perm)" in (tmp_path / "out" / "report.md").read_text()
    for bad, message in (("0", "--samples-per-view must be at least 1"), ("1.5", "invalid int value")):
        with pytest.raises(SystemExit):
            main([*argv, "--samples-per-view", bad])
        assert message in capsys.readouterr().err
