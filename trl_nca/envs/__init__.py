"""Text games for on-policy context distillation: Sokoban and FrozenLake with TextArena 0.7.4 semantics.

Environments (`SokobanEnv`, `FrozenLakeEnv`, `make_env`), BFS solvers and the oracle ceiling, per-step prompts and the
action parser, OPCD seed formulas, shipped experience texts and batched rollouts for training (`play_episodes`,
`GameRollout`, which implements `trl_nca.trainers.rollouts.Rollout`). Paired win-rate evaluation lives with the
evaluation: `trl_nca.eval.evaluate_game`. See docs/games.md.
"""

from .base import DIRECTIONS, EpisodeOutcome, GameEnv, TurnRecord
from .experience import extract_experience
from .frozenlake import FrozenLakeEnv
from .prompts import build_step_messages, build_step_prompt, parse_action
from .registry import GAMES, game_class, load_experience, make_env
from .rollout import (
    GAME_MAX_NEW_TOKENS,
    GAME_TEMPERATURE,
    GAME_TOP_K,
    GAME_TOP_P,
    GameRollout,
    RolloutResult,
    call_seed,
    default_game_spec,
    game_generation_settings,
    play_episodes,
)
from .seeds import heldout_seed, heldout_seeds, training_seed, training_seeds
from .sokoban import SokobanEnv
from .solver import oracle_ceiling, shortest_solution_length, solve


__all__ = [
    "DIRECTIONS",
    "GAME_MAX_NEW_TOKENS",
    "GAME_TEMPERATURE",
    "GAME_TOP_K",
    "GAME_TOP_P",
    "GAMES",
    "EpisodeOutcome",
    "FrozenLakeEnv",
    "GameEnv",
    "GameRollout",
    "RolloutResult",
    "SokobanEnv",
    "TurnRecord",
    "build_step_messages",
    "build_step_prompt",
    "call_seed",
    "default_game_spec",
    "extract_experience",
    "game_generation_settings",
    "game_class",
    "heldout_seed",
    "heldout_seeds",
    "load_experience",
    "make_env",
    "oracle_ceiling",
    "parse_action",
    "play_episodes",
    "shortest_solution_length",
    "solve",
    "training_seed",
    "training_seeds",
]
