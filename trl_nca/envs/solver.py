"""Breadth-first solvers for both games, and the oracle ceiling of a seed set.

The solvers search the moves the rules accept from an environment's current position and return a shortest winning
move sequence, or None when there is none within `max_moves` (or within `max_states` visited states). The oracle
ceiling is the share of seeds a perfect player could win within the call budget: with 5 calls, a map needing 6 moves
is lost whatever the policy, so win rates are best read next to it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from .base import DELTAS, DIRECTIONS, GameEnv
from .frozenlake import FrozenLakeEnv
from .registry import make_env
from .sokoban import SokobanEnv, is_wall


DEFAULT_MAX_STATES = 1_000_000


def _bfs(start, goal_test, successors, max_moves: int | None, max_states: int) -> list[str] | None:
    if goal_test(start):
        return []
    parents = {start: None}
    frontier = deque([(start, 0)])
    while frontier:
        state, depth = frontier.popleft()
        if max_moves is not None and depth >= max_moves:
            continue
        for action, nxt in successors(state):
            if nxt in parents:
                continue
            parents[nxt] = (state, action)
            if goal_test(nxt):
                path = []
                node = nxt
                while parents[node] is not None:
                    node, move = parents[node]
                    path.append(move)
                return path[::-1]
            if len(parents) >= max_states:
                return None
            frontier.append((nxt, depth + 1))
    return None


def solve_frozenlake(
    env: FrozenLakeEnv, max_moves: int | None = None, max_states: int = DEFAULT_MAX_STATES
) -> list[str] | None:
    """Shortest move list from the player's cell to the goal that never steps on a hole."""

    def successors(cell):
        for action in DIRECTIONS:
            dr, dc = DELTAS[action]
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < env.size and 0 <= nxt[1] < env.size and nxt not in env.holes:
                yield action, nxt

    return _bfs(env.player, lambda cell: cell == env.goal, successors, max_moves, max_states)


def solve_sokoban(
    env: SokobanEnv, max_moves: int | None = None, max_states: int = DEFAULT_MAX_STATES
) -> list[str] | None:
    """Shortest move list (walks and pushes) that puts every box on a target."""
    targets = frozenset(env.targets)

    def successors(state):
        player, boxes = state
        for action in DIRECTIONS:
            dr, dc = DELTAS[action]
            nxt = (player[0] + dr, player[1] + dc)
            if is_wall(env.floor, nxt):
                continue
            if nxt in boxes:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if is_wall(env.floor, beyond) or beyond in boxes:
                    continue
                yield action, (nxt, (boxes - {nxt}) | {beyond})
            else:
                yield action, (nxt, boxes)

    start = (env.player, frozenset(env.boxes))
    return _bfs(start, lambda state: state[1] == targets, successors, max_moves, max_states)


def solve(env: GameEnv, max_moves: int | None = None, max_states: int = DEFAULT_MAX_STATES) -> list[str] | None:
    """A shortest solution of `env` from its current position, or None if none within the limits."""
    if isinstance(env, FrozenLakeEnv):
        return solve_frozenlake(env, max_moves, max_states)
    if isinstance(env, SokobanEnv):
        return solve_sokoban(env, max_moves, max_states)
    raise TypeError(f"No solver for {type(env).__name__}.")


def shortest_solution_length(
    env: GameEnv, max_moves: int | None = None, max_states: int = DEFAULT_MAX_STATES
) -> int | None:
    """The number of moves of a shortest solution, or None if none within the limits."""
    path = solve(env, max_moves, max_states)
    return None if path is None else len(path)


def oracle_ceiling(game: str, seeds: Iterable[int], max_moves: int = 5, **env_kwargs) -> tuple[float, list[int | None]]:
    """(share of `seeds` solvable within `max_moves`, shortest solution length per seed or None)."""
    lengths = [shortest_solution_length(make_env(game, seed, **env_kwargs), max_moves=max_moves) for seed in seeds]
    share = sum(n is not None for n in lengths) / len(lengths) if lengths else 0.0
    return share, lengths
