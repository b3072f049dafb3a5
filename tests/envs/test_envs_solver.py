"""BFS solvers on hand-made maps, and the oracle ceiling."""

import pytest

from trl_nca.envs import (
    FrozenLakeEnv,
    SokobanEnv,
    heldout_seeds,
    make_env,
    oracle_ceiling,
    shortest_solution_length,
    solve,
)


def play(env, moves):
    for move in moves:
        env.step(move)
    return env


@pytest.mark.parametrize(
    "rows,length",
    [
        (["P..", ".H.", "..G"], 4),
        (["PH.", ".H.", "..G"], 4),  # the only route goes down first
        (["P..", "HH.", "G.."], 6),  # a detour that needs [left] moves
        (["P.H.", "HH..", "...H", "H..G"], None),  # walled off by holes
        (["P.", ".G"], 2),
    ],
)
def test_frozenlake_solver(rows, length):
    env = FrozenLakeEnv.from_layout(rows, max_calls=10)
    assert shortest_solution_length(env) == length
    if length is not None:
        assert shortest_solution_length(env, max_moves=length - 1) is None
        assert play(env, solve(env)).won


@pytest.mark.parametrize(
    "rows,length",
    [
        (["#######", "#P_X_O#", "#######"], 3),  # walk, then two pushes
        (["######", "#O_X_#", "#__P_#", "######"], 4),  # walk around the box, then push it left twice
        (["#####", "#P_X#", "#__O#", "#####"], None),  # box stuck in a corner
        (["#######", "#P_X_O#", "#_X__O#", "#######"], 9),  # two boxes
    ],
)
def test_sokoban_solver(rows, length):
    env = SokobanEnv.from_layout(rows, max_calls=20)
    assert shortest_solution_length(env, max_moves=12) == length
    if length is not None:
        assert shortest_solution_length(env, max_moves=length - 1) is None
        assert play(env, solve(env)).won


def test_solver_respects_cap_and_current_position():
    env = make_env("sokoban", heldout_seeds(4)[3])
    path = solve(env)
    assert len(path) == 6
    assert solve(env, max_moves=5) is None
    env.step(path[0])
    assert shortest_solution_length(env) == 5  # from the new position


def test_oracle_ceiling_on_held_out_maps():
    seeds = heldout_seeds(8)
    share, lengths = oracle_ceiling("sokoban", seeds, max_moves=5)
    assert len(lengths) == 8 and share == sum(n is not None for n in lengths) / 8
    assert lengths[0] == 2 and lengths[3] is None  # held-out map 3 needs 6 moves
    share, lengths = oracle_ceiling("frozenlake", seeds, max_moves=5)
    assert share == 1.0 and set(lengths) == {4}  # every OPCD lake needs exactly 4 moves
