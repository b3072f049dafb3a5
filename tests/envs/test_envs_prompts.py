"""The action parser and the per-step prompt."""

import pytest

from trl_nca.envs import build_step_messages, build_step_prompt, heldout_seed, make_env, parse_action


@pytest.mark.parametrize(
    "text,expected",
    [
        ("[up]", "up"),
        ("I could go [up] but [down] is safer. [right]", "right"),  # the LAST occurrence wins
        ("Final answer: [Left]", "left"),  # case-insensitive
        ("[ DOWN ]", "down"),  # spaces inside the brackets
        ("[w]", "up"),
        ("[a] then [s]", "down"),
        ("[D]", "right"),
        ("<think>[up]</think>\nMove: [left]", "left"),
        ("move right", None),  # no brackets
        ("[north] [up!] [u p]", None),
        ("[upward]", None),
        ("", None),
        (None, None),
        ("[right]\n\nOn second thought... [x]", "right"),  # unknown bracketed words are ignored
    ],
)
def test_parse_action(text, expected):
    assert parse_action(text) == expected


def test_prompt_holds_rules_boards_actions_and_warnings_but_no_reasoning():
    env = make_env("frozenlake", heldout_seed(0))
    first = build_step_prompt(env)
    assert "FrozenLake" in first and env.render() in first and "turn 1 of 5" in first
    env.step(parse_action("Let me think: the hole is below me, so I go [right]"))
    env.step(parse_action("Hmm, [up]"))  # off the grid: a warning
    text = build_step_prompt(env)
    assert "Turn 1: you played [right]." in text and "Turn 2: you played [up]." in text
    assert "leave the lake" in text and "The board is unchanged." in text
    assert "Let me think" not in text and "Hmm" not in text
    assert text.index(env.initial_board) < text.index(env.render())


def test_transcript_after_a_few_moves():
    env = make_env("sokoban", heldout_seed(3))
    env.step("up")
    env.step("left")
    env.step(None)
    messages = build_step_messages(env)
    assert len(messages) == 1 and messages[0]["role"] == "user"
    text = messages[0]["content"]
    assert "Sokoban" in text and "turn 4 of 5" in text
    assert text.count("Turn ") == 3
    assert "Turn 1: you played [up]." in text and "Turn 2: you played [left]." in text
    assert "Turn 3: your reply had no bracketed move." in text and "another invalid move in a row" in text
    assert text.index(env.initial_board) < text.index("Turn 1")
    assert env.render() in text
    assert "Let me think" not in text
