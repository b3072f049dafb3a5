"""FrozenLake as a text game: walk from the top-left corner to the goal at the bottom-right without falling in a hole.

Map generation follows TextArena 0.7.4 (`FrozenLake-v0`, not slippery), so a seed gives the same map as there, but the
random generator is a private `random.Random(seed)` instead of Python's global one:

- the holes are drawn with `sample(cells, num_holes)` among all cells except start and goal, in row-major order;
- the draw is repeated (up to 100 times) until a 4-neighbour path from start to goal avoids every hole;
- failing that, the path along the top row then down the right column is kept safe and the holes are drawn among the
  other cells.

`num_holes` is capped at `size * size - 3`, as TextArena does. Leaving the grid is an invalid move; stepping on a hole
ends the game with partial credit `1 - d(hole, goal) / d(start, goal)` (Manhattan distances, as TextArena rewards
it); reaching the goal gives reward 1.0.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Sequence

from .base import DELTAS, GOAL, GameEnv, MoveResult, require_int


logger = logging.getLogger(__name__)

Cell = tuple[int, int]
HOLE_END = "hole"
MAX_LAYOUT_TRIES = 100


def has_safe_path(size: int, holes: set[Cell], start: Cell, goal: Cell) -> bool:
    """Whether a 4-neighbour walk from start to goal exists that never enters a hole."""
    seen = {start}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            return True
        for dr, dc in DELTAS.values():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in holes and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return False


def generate_holes(rng: random.Random, size: int, num_holes: int) -> set[Cell]:
    """The hole cells of a `size` x `size` lake (start top-left, goal bottom-right), drawn from `rng`."""
    start, goal = (0, 0), (size - 1, size - 1)
    candidates = [(r, c) for r in range(size) for c in range(size) if (r, c) not in (start, goal)]
    for _ in range(MAX_LAYOUT_TRIES):
        holes = set(rng.sample(candidates, num_holes))
        if has_safe_path(size, holes, start, goal):
            return holes
    safe = {(0, c) for c in range(size)} | {(r, size - 1) for r in range(size)}
    off_path = [cell for cell in candidates if cell not in safe]
    return set(rng.sample(off_path, min(num_holes, len(off_path))))


class FrozenLakeEnv(GameEnv):
    """A `size` x `size` frozen lake with `num_holes` holes (OPCD: 3 x 3 with 2 holes)."""

    name = "frozenlake"

    def __init__(self, seed: int | None = None, size: int = 3, num_holes: int = 2, max_calls: int = 5):
        super().__init__(seed=seed, max_calls=max_calls)
        require_int("size", size)
        require_int("num_holes", num_holes)
        if size < 2:
            raise ValueError(f"FrozenLake needs size >= 2, got {size}.")
        if num_holes < 0:
            raise ValueError(f"num_holes must be >= 0, got {num_holes}.")
        most = size * size - 3
        if num_holes > most:
            logger.warning("%d holes requested on a %dx%d lake; using the maximum, %d.", num_holes, size, size, most)
            num_holes = most
        self.size = size
        self.num_holes = num_holes
        self.start: Cell = (0, 0)
        self.goal: Cell = (size - 1, size - 1)
        self.holes = generate_holes(random.Random(seed), size, num_holes)
        self.player: Cell = self.start

    @classmethod
    def from_layout(cls, rows: Sequence[str], max_calls: int = 5) -> FrozenLakeEnv:
        """A hand-made square lake: 'P' start, 'G' goal, 'H' hole, anything else frozen (for tests and examples)."""
        env = cls(seed=0, size=len(rows), num_holes=0, max_calls=max_calls)
        if any(len(row) != len(rows) for row in rows):
            raise ValueError("A FrozenLake layout must be square.")
        cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
        if sum(ch == "P" for ch in cells.values()) != 1 or sum(ch == "G" for ch in cells.values()) != 1:
            raise ValueError("A FrozenLake layout needs exactly one 'P' (start) and one 'G' (goal).")
        env.seed = None
        env.holes = {cell for cell, ch in cells.items() if ch == "H"}
        env.start = env.player = next(cell for cell, ch in cells.items() if ch == "P")
        env.goal = next(cell for cell, ch in cells.items() if ch == "G")
        return env

    def symbol(self, cell: Cell) -> str:
        if cell == self.player:
            return "P/G" if cell == self.goal else "P"
        if cell in self.holes:
            return "H"
        if cell == self.goal:
            return "G"
        return " "

    def render(self) -> str:
        """A boxed grid, each cell's symbol centred in 3 characters with a space either side."""
        border = "+" + "+".join(["-----"] * self.size) + "+"
        lines = [border]
        for r in range(self.size):
            lines.append("|" + "|".join(f" {self.symbol((r, c)):^3} " for c in range(self.size)) + "|")
            lines.append(border)
        return "\n".join(lines)

    def _distance_to_goal(self, cell: Cell) -> int:
        return abs(cell[0] - self.goal[0]) + abs(cell[1] - self.goal[1])

    def progress(self) -> float:
        total = self._distance_to_goal(self.start)
        if total == 0:
            return 0.0
        return 1.0 - self._distance_to_goal(self.player) / total

    def _move(self, direction: str) -> MoveResult:
        dr, dc = DELTAS[direction]
        r, c = self.player[0] + dr, self.player[1] + dc
        if not (0 <= r < self.size and 0 <= c < self.size):
            return MoveResult(False, f"Moving {direction} would leave the lake.")
        self.player = (r, c)
        if self.player in self.holes:
            return MoveResult(True, f"You moved {direction} onto row {r}, column {c} and fell into a hole.", HOLE_END)
        if self.player == self.goal:
            return MoveResult(True, f"You moved {direction} onto row {r}, column {c} and reached the goal.", GOAL)
        return MoveResult(True, f"You moved {direction} to row {r}, column {c}.")
