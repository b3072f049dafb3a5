"""Paired win-rate evaluation: records in the shared schema, the game summary, resuming, and the eval CLI's --game."""

import json

import pytest

from trl_nca.core.sampling import GenerationSettings
from trl_nca.envs import FrozenLakeEnv, heldout_seeds, load_experience, solve
from trl_nca.eval.games import evaluate_game, game_summary, paired_game_records, run_game_eval
from trl_nca.eval.records import PairedRecord
from trl_nca.testing import make_tiny_model, make_tiny_tokenizer, scripted_generate


# Tolerances: pytest.approx with its default tolerance compares float64 arithmetic on counts and rewards with exact
# fractions (error near 1e-16); trl_nca.testing names the tolerances of float computations.


@pytest.fixture(scope="module")
def tiny():
    tokenizer = make_tiny_tokenizer()
    return tokenizer, make_tiny_model(tokenizer, seed=0)


def test_paired_game_evaluation_on_tiny_model(tiny, tmp_path):
    tokenizer, model = tiny
    records, summary = evaluate_game(
        model, tokenizer, "sokoban", num_seeds=3, max_new_tokens=6, batch_size=4, n_bootstrap=20, output_dir=tmp_path
    )
    seeds = heldout_seeds(3)
    assert [r.item_id for r in records] == [f"sokoban-{s}" for s in seeds]
    for record, seed in zip(records, seeds):
        assert isinstance(record, PairedRecord) and record.meta["seed"] == seed
        assert {"oracle_solvable", "oracle_moves", "steps_x", "steps_xc", "invalid_moves_x", "ended_at_cap_xc"} <= set(
            record.meta
        )
        for view in (record.x, record.xc):
            assert isinstance(view.correct, bool) and view.num_tokens >= view.extra["steps"]  # >= 1 token per call
            assert view.extra["tokens_per_step"] == pytest.approx(view.num_tokens / view.extra["steps"])
            assert 1 <= view.extra["steps"] <= 5 and len(view.extra["replies"]) == view.extra["steps"]
        assert PairedRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    assert records[0].meta["oracle_moves"] == 2
    assert summary["n"] == 3 and summary["oracle_ceiling"] == pytest.approx(
        sum(r.meta["oracle_solvable"] for r in records) / 3
    )
    for key in (
        "win_rate_x",
        "win_rate_xc",
        "both_won",
        "harm",
        "help",
        "steps_to_success_x",
        "invalid_move_rate_xc",
        "cap_rate_x",
        "tokens_per_step_xc",
        "mcnemar_p",
        "regime",
    ):
        assert key in summary
    for name in ("summary.json", "report.md", "game_summary.json", "model/records.jsonl"):
        assert (tmp_path / name).exists()
    again, _ = evaluate_game(model, tokenizer, "sokoban", num_seeds=3, max_new_tokens=6, batch_size=2, n_bootstrap=0)
    assert [r.to_dict() for r in again] == [r.to_dict() for r in records]  # seeded, and batch size does not matter


def test_scripted_views_give_known_paired_metrics():
    tokenizer = make_tiny_tokenizer()
    experience = load_experience("frozenlake")

    def reply(text):
        if experience in text:  # the context view plays perfectly
            rows = [line for line in text.splitlines() if line.startswith("|")][-3:]
            layout = ["".join(c.strip() or "." for c in row.strip("|").split("|")) for row in rows]
            return f"[{solve(FrozenLakeEnv.from_layout(layout))[0]}]"
        return "I am not sure."  # the no-context view never gives a move

    generate = scripted_generate(tokenizer, reply)
    records = paired_game_records(generate, tokenizer, "frozenlake", heldout_seeds(4), experience)
    summary = game_summary(records, n_bootstrap=0)
    assert summary["win_rate_x"] == 0.0 and summary["win_rate_xc"] == 1.0 and summary["both_won"] == 0.0
    assert summary["help"] == 1.0 and summary["harm"] is None and summary["help_count"] == 4
    assert summary["steps_to_success_xc"] == 4.0 and summary["steps_to_success_x"] is None
    assert summary["invalid_move_rate_x"] == 1.0 and summary["invalid_move_rate_xc"] == 0.0
    assert summary["cap_rate_x"] == 0.0 and summary["oracle_ceiling"] == 1.0
    x, xc = records[0].x, records[0].xc
    assert x.format_failure and not xc.format_failure and x.extra["end_reason"] == "invalid_moves"
    assert xc.answer.count("[") == 4 and xc.extra["reward"] == 1.0 and not xc.truncated
    assert summary["tokens_per_step_xc"] == pytest.approx(sum(r.xc.num_tokens for r in records) / 16)


def test_run_game_eval_resumes_from_its_records(tiny, tmp_path, monkeypatch):
    tokenizer, model = tiny
    settings = GenerationSettings(max_new_tokens=4, temperature=0.7, top_p=0.8, top_k=20, batch_size=4)
    path = tmp_path / "m" / "records.jsonl"
    kwargs = dict(model=model, tokenizer=tokenizer, game="frozenlake", generation=settings, context=None)
    first = run_game_eval(**kwargs, options={"num_seeds": 2}, output_path=path, progress=False)
    assert len(path.read_text().splitlines()) == 2

    def no_generate(*args, **kwargs):  # a resumed run must not generate again
        raise AssertionError("generated although every map was done")

    with monkeypatch.context() as patch:
        patch.setattr(model, "generate", no_generate)
        second = run_game_eval(**kwargs, options={"num_seeds": 2}, output_path=path)
    assert [r.to_dict() for r in second] == [r.to_dict() for r in first]
    more = run_game_eval(**kwargs, options={"num_seeds": 3}, output_path=path)
    assert len(more) == 3 and len(path.read_text().splitlines()) == 3


def test_eval_cli_accepts_a_game(tiny_dir, tmp_path):
    from trl_nca.cli.eval import main

    code = main(
        [
            "--model",
            tiny_dir,
            "--game",
            "frozenlake",
            "--game-option",
            "num_seeds=2",
            "--max-new-tokens",
            "4",
            "--output-dir",
            str(tmp_path),
            "--no-plots",
            "--bootstrap",
            "0",
            "--no-progress",
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["models"][0]["metrics"]["n"] == 2


def test_evaluate_game_with_an_output_dir_resumes(tiny, tmp_path, monkeypatch):
    tokenizer, model = tiny
    kwargs = dict(num_seeds=2, max_new_tokens=4, batch_size=2, n_bootstrap=0, output_dir=tmp_path)
    first, summary = evaluate_game(model, tokenizer, "frozenlake", **kwargs)
    assert len((tmp_path / "model" / "records.jsonl").read_text().splitlines()) == 2

    def no_generate(*args, **kwargs):
        raise AssertionError("generated although every map was done")

    with monkeypatch.context() as patch:
        patch.setattr(model, "generate", no_generate)
        again, summary_again = evaluate_game(model, tokenizer, "frozenlake", **kwargs)
    assert [r.to_dict() for r in again] == [r.to_dict() for r in first] and summary_again == summary
    more, _ = evaluate_game(model, tokenizer, "frozenlake", **{**kwargs, "num_seeds": 3})
    assert [r.to_dict() for r in more[:2]] == [r.to_dict() for r in first]
    assert len((tmp_path / "model" / "records.jsonl").read_text().splitlines()) == 3
    with pytest.raises(ValueError, match="num_seeds must be a positive integer"):
        evaluate_game(model, tokenizer, "frozenlake", num_seeds=0)
