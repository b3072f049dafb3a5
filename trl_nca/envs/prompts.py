"""The prompt of one game step and the action parser.

Every model call sees ONE user message: the game's rules, then the whole transcript so far (the first board, each
earlier action as the parser read it, the game's reply, warnings, and the board after every valid move), then the
request for the next move. The model's earlier replies are never shown, only the actions read from them, so every call
is a fresh single-turn prompt. The experience text (the context) is not part of it: `views.add_context` puts it into
this user message for the context view.
"""

from __future__ import annotations

import re

from .base import GameEnv
from .frozenlake import FrozenLakeEnv
from .sokoban import SokobanEnv


ACTION_ALIASES = {
    "up": "up",
    "down": "down",
    "left": "left",
    "right": "right",
    "w": "up",
    "a": "left",
    "s": "down",
    "d": "right",
}
ACTION_PATTERN = re.compile(r"\[\s*(up|down|left|right|w|a|s|d)\s*\]", re.IGNORECASE)


def parse_action(text: str | None) -> str | None:
    """The move of a reply: the LAST bracketed action in it, as a direction, or None if there is none.

    Recognised: `[up] [down] [left] [right]` and the keys `[w] [a] [s] [d]` (up, left, down, right). Matching is
    case-insensitive (`[Up]`, `[W]`) and tolerates spaces inside the brackets (`[ up ]`), like TextArena's own
    parser; words without brackets (`up`) and other bracketed text (`[north]`, `[up!]`) do not count. Taking the
    last occurrence lets a model think aloud about several moves before it commits to one.
    """
    if not text:
        return None
    matches = ACTION_PATTERN.findall(text)
    return ACTION_ALIASES[matches[-1].lower()] if matches else None


def format_action(direction: str | None) -> str:
    return f"[{direction}]" if direction is not None else "(no action)"


MOVE_FORMAT = "[up], [down], [left] or [right] (or the keys [w], [a], [s], [d])"

FROZENLAKE_RULES = """\
You are playing FrozenLake on a {size}x{size} grid of ice. You are P and start in the top-left corner; the goal G is \
in the bottom-right corner. H cells are holes: stepping on one ends the game and you lose. Blank cells are safe. Rows \
and columns are numbered from 0, starting at the top-left corner; P/G means you stand on the goal.
Each turn you move one cell with {moves}. Moving off the grid is an invalid move. An invalid move, or a reply without \
a bracketed move, is not played and earns a warning; two invalid moves in a row end the game.
You win by reaching G. You have {max_calls} turns in all."""

SOKOBAN_RULES = """\
You are playing Sokoban. You are P. Walls are #, free floor is _, boxes are X, targets are O, and a box sitting on a \
target is shown as √. Push every box onto a target.
Each turn you move one cell with {moves}. Walking into a box pushes it one cell the same way if the cell behind it is \
free floor or a target. You cannot pull a box, push two boxes at once, or walk through a wall. Walking into a wall or \
pushing a box into a wall or another box is an invalid move. An invalid move, or a reply without a bracketed move, is \
not played and earns a warning; two invalid moves in a row end the game.
You win when every box is on a target. You have {max_calls} turns in all."""


def game_rules(env: GameEnv) -> str:
    """The rules paragraph of a game, filled with its settings."""
    if isinstance(env, FrozenLakeEnv):
        return FROZENLAKE_RULES.format(size=env.size, moves=MOVE_FORMAT, max_calls=env.max_calls)
    if isinstance(env, SokobanEnv):
        return SOKOBAN_RULES.format(moves=MOVE_FORMAT, max_calls=env.max_calls)
    raise TypeError(f"No rules text for {type(env).__name__}.")


def build_step_prompt(env: GameEnv) -> str:
    """The text of the single user message for the next call of `env`."""
    parts = [game_rules(env), "", "Game so far:", "Starting board:", env.initial_board]
    for turn, record in enumerate(env.history, start=1):
        parts.append("")
        if record.action is None:
            parts.append(f"Turn {turn}: your reply had no bracketed move.")
        else:
            parts.append(f"Turn {turn}: you played {format_action(record.action)}.")
        parts.append(record.message)
        if record.board is not None:
            parts.append(record.board)
        elif not record.ended:
            parts.append("The board is unchanged.")
    turn = env.num_calls + 1
    parts += [
        "",
        f"This is turn {turn} of {env.max_calls}. Think about your move if you like, then end your reply with exactly "
        "one move in brackets, for example [up].",
    ]
    return "\n".join(parts)


def build_step_messages(env: GameEnv) -> list[dict[str, str]]:
    """The chat prompt (one user message, no context) for the next call of `env`."""
    return [{"role": "user", "content": build_step_prompt(env)}]
