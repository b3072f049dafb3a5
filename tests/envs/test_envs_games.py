"""Golden boards and move outcomes of both games for fixed seeds and hand-made maps."""

import random

import pytest

from trl_nca.envs import FrozenLakeEnv, SokobanEnv, heldout_seed, make_env, training_seed
from trl_nca.envs.seeds import heldout_seeds


# Tolerances: pytest.approx with its default tolerance compares float64 arithmetic on counts and rewards with exact
# fractions (error near 1e-16); trl_nca.testing names the tolerances of float computations.


FROZENLAKE_0 = """\
+-----+-----+-----+
|  P  |     |  H  |
+-----+-----+-----+
|  H  |     |     |
+-----+-----+-----+
|     |     |  G  |
+-----+-----+-----+"""

SOKOBAN_0 = """\
# # # # # #
# # # # # #
# # # # # #
# _ _ _ _ #
# P X _ O #
# # # # # #"""

SOKOBAN_3 = """\
# # # # # #
# O _ _ _ #
# _ _ _ _ #
# _ _ X _ #
# _ _ P _ #
# # # # # #"""


def test_seed_formulas():
    assert heldout_seed(0) == 468382021 + 78025 == 468460046
    assert heldout_seed(127) == 468460046 + 127_000
    assert heldout_seeds(3) == [468460046, 468461046, 468462046]
    assert training_seed(0) == 505019424 + 90039 + 100000
    assert training_seed(2, round=1) == training_seed(0) + 2000 + 10**7
    with pytest.raises(ValueError):
        training_seed(10_000)


def test_defaults_are_the_papers():
    lake, room = FrozenLakeEnv(1), SokobanEnv(1)
    assert (lake.size, lake.num_holes, lake.max_calls) == (3, 2, 5)
    assert (room.height, room.width, room.num_boxes, room.max_calls) == (6, 6, 1, 5)


def test_golden_boards():
    assert make_env("frozenlake", heldout_seed(0)).render() == FROZENLAKE_0
    assert make_env("sokoban", heldout_seed(0)).render() == SOKOBAN_0
    assert make_env("sokoban", heldout_seed(3)).render() == SOKOBAN_3  # a seed whose first room is rejected


def test_maps_are_reproducible_and_leave_global_random_alone():
    state = random.getstate()
    a = [make_env(g, s).render() for g in ("sokoban", "frozenlake") for s in (7, 8)]
    random.seed(123)  # the global generator plays no part
    b = [make_env(g, s).render() for g in ("sokoban", "frozenlake") for s in (7, 8)]
    assert a == b
    random.seed(123)
    before = random.random()
    random.seed(123)
    make_env("sokoban", 9)
    make_env("frozenlake", 9)
    assert random.random() == before
    random.setstate(state)


def test_frozenlake_moves_holes_and_goal():
    env = make_env("frozenlake", heldout_seed(0))
    record = env.step("right")
    assert record.valid and not env.done and "|     |  P  |  H  |" in env.render()
    env.step("down")
    env.step("down")
    assert env.player == (2, 1) and not env.done
    env.step("right")
    assert env.done and env.won and env.reward == 1.0 and env.end_reason == "goal"
    assert "P/G" in env.render()

    env = make_env("frozenlake", heldout_seed(0))
    env.step("down")  # (1, 0) is a hole: 3 cells from the goal, start is 4 away
    assert env.done and not env.won and env.end_reason == "hole"
    assert env.reward == pytest.approx(0.25)


def test_frozenlake_invalid_moves():
    env = make_env("frozenlake", heldout_seed(0))
    record = env.step("up")  # off the grid: a warning, the board does not change
    assert not record.valid and not env.done and record.board is None
    assert "another invalid move" in record.message and env.render() == FROZENLAKE_0
    env.step("right")  # a valid move resets the streak
    env.step(None)  # no action found: invalid
    assert not env.done and env.num_invalid == 2
    record = env.step("up")  # second invalid move in a row: game over
    assert env.done and not env.won and env.end_reason == "invalid_moves" and record.ended
    assert env.reward == pytest.approx(0.25)  # partial credit of the player's cell, as TextArena gives
    with pytest.raises(RuntimeError):
        env.step("down")


def test_call_budget_ends_the_game_as_max_steps():
    env = make_env("frozenlake", heldout_seed(0))
    for action in ["right", "left", "right", "left"]:
        env.step(action)
        assert not env.done
    env.step("right")
    assert env.done and env.end_reason == "max_steps" and not env.won and env.num_calls == 5
    assert env.outcome().ended_at_cap


def test_sokoban_pushes_and_win():
    env = make_env("sokoban", heldout_seed(0))
    env.step("right")
    assert env.render().splitlines()[4] == "# _ P X O #"
    record = env.step("right")
    assert record.valid and env.done and env.won and env.reward == 1.0
    assert env.render().splitlines()[4] == "# _ _ P √ #"


def test_sokoban_walls_and_second_invalid():
    env = make_env("sokoban", heldout_seed(0))
    record = env.step("down")  # wall below
    assert not record.valid and "wall" in record.message and env.render() == SOKOBAN_0
    env.step("up")
    env.step("up")  # wall above row 3
    record = env.step("up")
    assert env.done and env.end_reason == "invalid_moves" and env.reward == 0.0 and not env.won


def test_sokoban_push_into_wall_or_box_is_invalid():
    env = SokobanEnv.from_layout(["#######", "#P_XX_#", "#__O_O#", "#######"])
    env.step("right")
    record = env.step("right")
    assert not record.valid and "another box" in record.message
    env = SokobanEnv.from_layout(["######", "#_PX##", "#O___#", "######"])
    record = env.step("right")
    assert not record.valid and "a wall" in record.message
    assert env.render().splitlines()[1] == "# _ P X # #"


def test_sokoban_partial_reward_with_two_boxes():
    env = SokobanEnv.from_layout(["#######", "#P_X_O#", "#_X__O#", "#######"])
    env.step("right")
    env.step("right")
    env.step("right")  # first box on its target
    assert env.boxes_on_targets() == 1 and not env.done
    env.step(None)
    env.step(None)
    assert env.done and env.reward == pytest.approx(0.5) and not env.won


def test_bad_settings_raise_clear_errors():
    with pytest.raises(ValueError, match="size"):
        FrozenLakeEnv(1, size=1)
    with pytest.raises(ValueError, match="5x5"):
        SokobanEnv(1, dim_room=(4, 4))
    with pytest.raises(ValueError, match="Unknown game"):
        make_env("chess", 1)
    with pytest.raises(TypeError, match="settings"):
        make_env("sokoban", 1, holes=2)
    with pytest.raises(ValueError, match="Unknown action"):
        make_env("sokoban", 1).step("jump")
    lake = FrozenLakeEnv(1, size=3, num_holes=20)  # capped like TextArena
    assert lake.num_holes == 6
