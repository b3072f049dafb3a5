"""The OPCD seed formulas: fixed held-out evaluation maps and fresh training maps for every optimizer step."""

from __future__ import annotations


HELDOUT_BASE = 468382021 + 78025
TRAINING_BASE = 505019424 + 90039 + 100000
SEED_STRIDE = 1000
ROUND_STRIDE = 10**7
DEFAULT_HELDOUT = 128


def heldout_seed(i: int) -> int:
    """Seed of held-out evaluation env `i` (OPCD evaluates i = 0..127)."""
    if i < 0:
        raise ValueError(f"The held-out index must be >= 0, got {i}.")
    return HELDOUT_BASE + SEED_STRIDE * i


def heldout_seeds(n: int = DEFAULT_HELDOUT, start: int = 0) -> list[int]:
    """Seeds of the held-out evaluation envs `start`, ..., `start + n - 1` (OPCD: the first 128)."""
    return [heldout_seed(i) for i in range(start, start + n)]


def training_seed(j: int, round: int = 0) -> int:
    """Seed of training env `j` of a round; each further round (here: each optimizer step) adds 10^7.

    With fewer than 10,000 envs per round, rounds never share a seed, and training seeds never reach the held-out ones.
    """
    if j < 0 or round < 0:
        raise ValueError(f"Training seed indices must be >= 0, got j={j}, round={round}.")
    if j * SEED_STRIDE >= ROUND_STRIDE:
        raise ValueError(f"At most {ROUND_STRIDE // SEED_STRIDE} training envs per round, got index {j}.")
    return TRAINING_BASE + SEED_STRIDE * j + ROUND_STRIDE * round


def training_seeds(n: int, round: int = 0) -> list[int]:
    """Seeds of training envs 0, ..., `n - 1` of a round (see `training_seed`)."""
    return [training_seed(j, round) for j in range(n)]
