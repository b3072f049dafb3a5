"""Shipped experience texts, lesson parsing, and experience extraction from a model's own games."""

import json

import pytest

from trl_nca.cli import experience as main
from trl_nca.envs import FrozenLakeEnv, load_experience, solve
from trl_nca.envs.experience import extract_experience, format_items, parse_items


@pytest.mark.parametrize("game", ["sokoban", "frozenlake", "FrozenLake"])
def test_shipped_experience(game):
    text = load_experience(game)
    assert text.startswith("Experience for") and 300 < len(text) < 2000
    assert len(parse_items(text)) >= 5


def test_unknown_game_has_no_experience():
    with pytest.raises(ValueError, match="Unknown game"):
        load_experience("go")


def test_parse_items():
    reply = "Here you go:\n- Plan first.\n* Avoid holes\n1. Count moves\n2) count moves\n• Last one  \nnot an item\n-\n"
    assert parse_items(reply) == ["Plan first.", "Avoid holes", "Count moves", "Last one"]
    assert parse_items("") == [] and parse_items(None) == []
    assert format_items(["a", "b"], "sokoban") == "Experience for Sokoban:\n- a\n- b"


def test_extraction_keeps_lessons_that_win_on_validation(tmp_path):
    from trl_nca.testing import make_tiny_tokenizer, scripted_generate

    tokenizer = make_tiny_tokenizer()
    summaries = iter(["- Go around the holes\n- Count your moves", "- Count your moves\n- Useless advice"])

    def reply(text):
        if "Write the lessons" in text:
            return next(summaries)
        if "Go around the holes" in text:  # with the first lesson as context, the model plays perfectly
            rows = [line for line in text.splitlines() if line.startswith("|")][-3:]
            layout = ["".join(c.strip() or "." for c in row.strip("|").split("|")) for row in rows]
            return f"[{solve(FrozenLakeEnv.from_layout(layout))[0]}]"
        return "[up]"

    result = extract_experience(
        scripted_generate(tokenizer, reply), tokenizer, "frozenlake", rounds=2, episodes_per_round=2, validation_size=3
    )
    assert result.items == ["Go around the holes", "Count your moves"] and result.score == 1.0
    assert result.text == "Experience for FrozenLake:\n- Go around the holes\n- Count your moves"
    assert [h["kept"] for h in result.history] == [True, True, False]
    assert result.history[0]["score"] == 0.0 and result.history[2]["new_items"] == [
        "Count your moves",
        "Useless advice",
    ]


def test_extraction_command_on_tiny_model(tiny_dir, tmp_path, capsys):
    output = tmp_path / "exp.txt"
    code = main(
        [
            "--model",
            tiny_dir,
            "--game",
            "sokoban",
            "--output",
            str(output),
            "--rounds",
            "1",
            "--episodes",
            "2",
            "--validation-size",
            "2",
            "--max-new-tokens",
            "4",
            "--device",
            "cpu",
        ]
    )
    assert code == 0 and output.exists()
    lines = capsys.readouterr().out.strip().splitlines()  # what it will do first; its time and outputs last
    assert lines[0].startswith(f"trl-nca experience: extract sokoban experience from 1 model ({tiny_dir}) in 1 round ")
    assert (
        lines[-1].startswith("trl-nca experience: done in ") and f"history: {output.with_suffix('.json')}." in lines[-1]
    )
    history = json.loads(output.with_suffix(".json").read_text())
    assert len(history["history"]) == 2 and 0.0 <= history["score"] <= 1.0
