"""The games by name, so configs and the command line can say `sokoban` or `frozenlake`, and their shipped texts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

from .base import GameEnv
from .frozenlake import FrozenLakeEnv
from .sokoban import SokobanEnv


GAMES: dict[str, type[GameEnv]] = {"sokoban": SokobanEnv, "frozenlake": FrozenLakeEnv}


def game_class(game: str) -> type[GameEnv]:
    """The environment class of a game name (case-insensitive; `frozen_lake` and `frozen-lake` are accepted)."""
    key = game.lower().replace("_", "").replace("-", "")
    if key not in GAMES:
        raise ValueError(f"Unknown game {game!r}; choose one of {sorted(GAMES)}.")
    return GAMES[key]


def parse_game_options(values: Sequence[str]) -> dict[str, Any]:
    """`KEY=VALUE` command-line game settings; values are read as JSON when they parse, else kept as strings."""
    options: dict[str, Any] = {}
    for value in values:
        key, sep, raw = value.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--game-option {value!r} is not KEY=VALUE (e.g. num_seeds=16).")
        if key in options:
            raise ValueError(f"--game-option {key} is given twice; keep one.")
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options


def make_env(game: str, seed: int | None, **env_kwargs) -> GameEnv:
    """A fresh environment of `game` for `seed`; `env_kwargs` are the game's settings (size, num_holes, ...)."""
    cls = game_class(game)
    try:
        return cls(seed=seed, **env_kwargs)
    except TypeError as error:
        raise TypeError(f"Bad settings for {cls.name}: {error}") from error


def load_experience(game: str) -> str:
    """The experience text shipped for `game` ("sokoban" or "frozenlake")."""
    name = game_class(game).name
    path = resources.files("trl_nca.envs").joinpath("experience").joinpath(f"{name}.txt")
    return path.read_text(encoding="utf-8").strip()
