"""Comparison with TextArena 0.7.4, a dev dependency (`pip install -e ".[dev]"`): never skipped, so CI runs it.

For many seeds, the starting boards must be identical, and random move sequences (with unparseable replies mixed in)
must give the same boards, the same end of game and the same final reward. TextArena is driven through its public
environment API only; its `reset` reseeds Python's global `random`, so the global state is restored afterwards.
"""

import random
from importlib.metadata import version

import pytest

from trl_nca.envs import FrozenLakeEnv, SokobanEnv, heldout_seeds, solve, training_seeds


# Tolerances: pytest.approx with its default tolerance compares float64 arithmetic on counts and rewards with exact
# fractions (error near 1e-16); trl_nca.testing names the tolerances of float computations.


try:
    from textarena.envs.FrozenLake.env import FrozenLakeEnv as TAFrozenLake
    from textarena.envs.Sokoban.env import SokobanEnv as TASokoban
except ImportError as error:
    raise ImportError(
        "tests/envs/test_envs_textarena.py needs textarena==0.7.4, a dev dependency: pip install -e '.[dev]'"
    ) from error


MOVES = ["[up]", "[down]", "[left]", "[right]", "no move here"]
DIRECTION = {"[up]": "up", "[down]": "down", "[left]": "left", "[right]": "right", "no move here": None}


@pytest.fixture(autouse=True)
def keep_global_random():
    state = random.getstate()
    yield
    random.setstate(state)


def ta_board(env, rows: int) -> str | None:
    """The last board TextArena showed since the previous call, as rendered grid lines (None if it showed none)."""
    _, observations = env.get_observation()
    boards = [text for _, text, *_ in observations if isinstance(text, str) and text.startswith("Current Board:")]
    if not boards:
        return None
    return "\n".join(boards[-1].split("\n")[2 : 2 + rows])


def play_both(ours, theirs, rows: int, rng: random.Random, calls: int = 5, moves=None):
    """Play random moves (or `moves`, directions) in both and compare boards, end of game and final reward."""
    assert ours.render() == ta_board(theirs, rows), f"starting boards differ for seed {ours.seed}"
    for k in range(calls):
        if moves is not None and k >= len(moves):
            return
        move = rng.choice(MOVES) if moves is None else f"[{moves[k]}]"
        record = ours.step(DIRECTION[move])
        done, _ = theirs.step(move)
        if ours.end_reason == "max_steps":  # our 5-call budget; TextArena has no such cap here
            return
        assert done == ours.done, f"seed {ours.seed}: end of game differs after {move}"
        if done:
            rewards, _ = theirs.close()
            assert rewards[0] == pytest.approx(ours.reward), f"seed {ours.seed}: final reward differs"
            return
        board = ta_board(theirs, rows)
        assert board is not None or not record.valid, f"seed {ours.seed}: TextArena showed no board after {move}"
        if board is not None:
            assert board == ours.render(), f"seed {ours.seed}: board differs after {move}"


def sokoban_pair(seed, dim=(6, 6), boxes=1):
    theirs = TASokoban(dim_room=dim, num_boxes=boxes, max_turns=100)
    theirs.reset(num_players=1, seed=seed)
    return SokobanEnv(seed, dim_room=dim, num_boxes=boxes), theirs


def frozenlake_pair(seed, size=3, holes=2):
    theirs = TAFrozenLake(size=size, num_holes=holes)
    theirs.reset(num_players=1, seed=seed)
    return FrozenLakeEnv(seed, size=size, num_holes=holes), theirs


SEEDS = heldout_seeds(128) + training_seeds(64) + list(range(64))


def test_the_installed_textarena_is_the_compared_version():
    assert version("textarena") == "0.7.4"


def test_frozenlake_matches_textarena_on_many_seeds():
    rng = random.Random(0)
    for seed in SEEDS:
        ours, theirs = frozenlake_pair(seed)
        play_both(ours, theirs, rows=7, rng=rng)
        ours, theirs = frozenlake_pair(seed)
        play_both(ours, theirs, rows=7, rng=rng, moves=solve(ours))  # a win in both


@pytest.mark.parametrize("size,holes", [(4, 3), (5, 6), (3, 5)])
def test_frozenlake_other_sizes_match_textarena(size, holes):
    rng = random.Random(size)
    for seed in range(40):
        ours, theirs = frozenlake_pair(seed, size, holes)
        play_both(ours, theirs, rows=2 * size + 1, rng=rng)


def test_sokoban_matches_textarena_on_many_seeds():
    rng = random.Random(0)
    for seed in SEEDS:
        ours, theirs = sokoban_pair(seed)
        play_both(ours, theirs, rows=6, rng=rng)
        ours, theirs = sokoban_pair(seed)
        solution = solve(ours, max_moves=5)
        if solution is not None:
            play_both(ours, theirs, rows=6, rng=rng, moves=solution)  # pushes and a win in both


@pytest.mark.parametrize("dim,boxes", [((6, 6), 2), ((7, 5), 1), ((8, 8), 2)])
def test_sokoban_other_settings_match_textarena(dim, boxes):
    rng = random.Random(boxes)
    for seed in range(25):
        ours, theirs = sokoban_pair(seed, dim, boxes)
        play_both(ours, theirs, rows=dim[0], rng=rng)
