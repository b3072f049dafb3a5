"""Sokoban as a text game: push every box onto a target within a few moves.

Room generation follows TextArena 0.7.4 (`Sokoban-v0`), so a seed gives the same room as there, with private random
generators (`random.Random(seed)` and `numpy.random.default_rng(seed)`) instead of process-wide ones:

1. topology: a random walk of `int(1.7 * (height + width))` steps from a random inner cell; at each step the direction
   changes with probability 0.35 and a random 3x3 floor mask is stamped around the walker; the border stays wall;
2. the player, then one target per box, go on distinct random floor cells;
3. reverse play: from the solved state (every box on its target), a depth-first search pulls boxes around (depth at
   most 300, at most 300,000 states) and keeps the first state with the best score, the number of pulls on the path
   times the total box displacement, among states where no box and not the player covers a target;
4. the attempt is redone with the next draws (up to `tries` times) when that score is 0, or when the start or end state
   has a box on a dead square (a non-target cell with two or more walls around it) or, with several boxes, a box
   blocked both vertically and horizontally by walls or boxes.

Walking into a wall and pushing a box into a wall or another box are invalid moves. Reward: 1.0 when every box is on a
target; otherwise the share of boxes on targets.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.checks import is_int
from .base import DELTAS, DIRECTIONS, GOAL, GameEnv, MoveResult, require_int


Cell = tuple[int, int]

# 3x3 floor stamps of the random walk and its step directions, in the order the generator draws from them.
FLOOR_MASKS = (
    ((0, 0, 0), (1, 1, 1), (0, 0, 0)),
    ((0, 1, 0), (0, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (1, 1, 0)),
    ((0, 0, 0), (0, 1, 1), (0, 1, 0)),
)
WALK_DIRECTIONS = ((1, 0), (0, 1), (-1, 0), (0, -1))
TURN_PROBABILITY = 0.35
REVERSE_PLAY_DEPTH = 300
REVERSE_PLAY_MAX_STATES = 300_000

SYMBOLS = {"wall": "#", "floor": "_", "target": "O", "box": "X", "box_on_target": "√", "player": "P"}


@dataclass
class SokobanRoom:
    """A generated or hand-made room: floor mask (True = floor), targets, boxes and player."""

    floor: list[list[bool]]
    targets: tuple[Cell, ...]
    boxes: tuple[Cell, ...]
    player: Cell


def room_topology(rng: random.Random, height: int, width: int, num_steps: int) -> list[list[bool]]:
    """The floor mask carved by the random walk."""
    direction = rng.sample(WALK_DIRECTIONS, 1)[0]
    r, c = rng.randint(1, height - 1), rng.randint(1, width - 1)
    floor = [[False] * width for _ in range(height)]
    for _ in range(num_steps):
        if rng.random() < TURN_PROBABILITY:
            direction = rng.sample(WALK_DIRECTIONS, 1)[0]
        r = max(min(r + direction[0], height - 2), 1)
        c = max(min(c + direction[1], width - 2), 1)
        mask = rng.sample(FLOOR_MASKS, 1)[0]
        for i in range(3):
            for j in range(3):
                if mask[i][j]:
                    floor[r - 1 + i][c - 1 + j] = True
    for r in range(height):
        for c in range(width):
            if r in (0, height - 1) or c in (0, width - 1):
                floor[r][c] = False
    return floor


def floor_cells(floor: Sequence[Sequence[bool]]) -> list[Cell]:
    return [(r, c) for r, row in enumerate(floor) for c, is_floor in enumerate(row) if is_floor]


def is_wall(floor: Sequence[Sequence[bool]], cell: Cell) -> bool:
    r, c = cell
    return not (0 <= r < len(floor) and 0 <= c < len(floor[0]) and floor[r][c])


def is_dead_square(floor: Sequence[Sequence[bool]], cell: Cell, targets: Sequence[Cell]) -> bool:
    """A non-target cell with at least two walls among its four neighbours (the generator rejects boxes there)."""
    if cell in targets:
        return False
    return sum(is_wall(floor, (cell[0] + dr, cell[1] + dc)) for dr, dc in DELTAS.values()) >= 2


def has_frozen_box(floor: Sequence[Sequence[bool]], boxes: Sequence[Cell]) -> bool:
    """With two or more boxes: whether one is blocked (wall or box) both above/below and left/right."""
    if len(boxes) < 2:
        return False
    occupied = set(boxes)

    def blocked(cell: Cell) -> bool:
        return is_wall(floor, cell) or cell in occupied

    return any(
        (blocked((r - 1, c)) or blocked((r + 1, c))) and (blocked((r, c - 1)) or blocked((r, c + 1))) for r, c in boxes
    )


def reverse_play(
    floor: Sequence[Sequence[bool]], targets: Sequence[Cell], player: Cell
) -> tuple[int, Cell, tuple[Cell, ...]]:
    """Pull the boxes away from their targets by depth-first search; return (best score, player, box positions)."""
    targets = tuple(targets)
    explored: set = set()
    best: list = [-1, player, targets]
    pulls = [DELTAS[d] for d in DIRECTIONS]  # up, down, left, right

    def search(player: Cell, boxes: tuple[Cell, ...], moved: tuple[bool, ...], num_pulls: int, ttl: int) -> None:
        ttl -= 1
        if ttl <= 0 or len(explored) >= REVERSE_PLAY_MAX_STATES:
            return
        key = (player, frozenset(zip(boxes, moved)))
        if key in explored:
            return
        covered = set(boxes) | {player}
        if any(t in covered for t in targets):
            score = 0
        else:
            score = num_pulls * sum(abs(t[0] - b[0]) + abs(t[1] - b[1]) for t, b in zip(targets, boxes))
        if score > best[0]:
            best[:] = [score, player, boxes]
        explored.add(key)
        for dr, dc in pulls:
            step_to = (player[0] + dr, player[1] + dc)
            if is_wall(floor, step_to) or step_to in boxes:
                search(player, boxes, moved, num_pulls, ttl)
                continue
            behind = (player[0] - dr, player[1] - dc)
            if behind in boxes:
                i = boxes.index(behind)
                pulled = boxes[:i] + (player,) + boxes[i + 1 :]
                now_moved = moved[:i] + (True,) + moved[i + 1 :]
                search(step_to, pulled, now_moved, num_pulls + 1, ttl)
            else:
                search(step_to, boxes, moved, num_pulls, ttl)

    search(player, targets, (False,) * len(targets), 0, REVERSE_PLAY_DEPTH)
    return best[0], best[1], best[2]


def generate_room(
    seed: int | None,
    height: int = 6,
    width: int = 6,
    num_boxes: int = 1,
    num_steps: int | None = None,
    tries: int = 1000,
) -> SokobanRoom:
    """A solvable room for `seed`, identical to TextArena 0.7.4's for the same seed and settings."""
    rng = random.Random(seed)
    np_rng = np.random.default_rng(seed)
    num_steps = int(1.7 * (height + width)) if num_steps is None else num_steps
    for _ in range(tries):
        floor = room_topology(rng, height, width, num_steps)
        cells = floor_cells(floor)
        if len(cells) <= num_boxes + 1:
            continue
        player = cells.pop(int(np_rng.integers(len(cells))))
        targets = tuple(cells.pop(int(np_rng.integers(len(cells)))) for _ in range(num_boxes))
        if any(is_dead_square(floor, t, targets) for t in targets) or has_frozen_box(floor, targets):
            continue
        score, player, boxes = reverse_play(floor, targets, player)
        if score <= 0:
            continue
        if any(is_dead_square(floor, b, targets) for b in boxes) or has_frozen_box(floor, boxes):
            continue
        return SokobanRoom(floor=floor, targets=targets, boxes=tuple(boxes), player=player)
    raise RuntimeError(
        f"Could not generate a {height}x{width} Sokoban room with {num_boxes} box(es) for seed {seed} in {tries} tries."
    )


def parse_layout(rows: Sequence[str]) -> SokobanRoom:
    """A hand-made room from rows of symbols ('#' wall, '_' or '.' floor, 'O' target, 'X' box, '√' or '*' box on
    target, 'P' player, '+' player on target); symbols may be separated by spaces, as the board is rendered."""
    grid = [row.split() if " " in row.strip() else list(row) for row in rows]
    if len({len(row) for row in grid}) != 1:
        raise ValueError("All rows of a Sokoban layout must have the same number of cells.")
    floor, targets, boxes, player = [], [], [], None
    for r, row in enumerate(grid):
        floor.append([ch != "#" for ch in row])
        for c, ch in enumerate(row):
            if ch in ("O", "√", "*", "+"):
                targets.append((r, c))
            if ch in ("X", "√", "*"):
                boxes.append((r, c))
            if ch in ("P", "+"):
                player = (r, c)
            if ch not in "#_.OX√*P+":
                raise ValueError(f"Unknown Sokoban symbol {ch!r} in row {r}.")
    if player is None or not boxes or len(boxes) != len(targets):
        raise ValueError("A Sokoban layout needs one player and as many targets as boxes (at least one).")
    return SokobanRoom(floor=floor, targets=tuple(targets), boxes=tuple(boxes), player=player)


class SokobanEnv(GameEnv):
    """A `dim_room` = (height, width) room with `num_boxes` boxes (OPCD: 6 x 6 with one box)."""

    name = "sokoban"

    def __init__(
        self,
        seed: int | None = None,
        dim_room: int | Sequence[int] = (6, 6),
        num_boxes: int = 1,
        max_calls: int = 5,
        num_steps: int | None = None,
        tries: int = 1000,
    ):
        super().__init__(seed=seed, max_calls=max_calls)
        if isinstance(dim_room, (list, tuple)) and len(dim_room) == 2:
            height, width = (require_int("dim_room[0]", dim_room[0]), require_int("dim_room[1]", dim_room[1]))
        elif is_int(dim_room):
            height = width = dim_room
        else:
            raise TypeError(
                f"dim_room must be an integer or [height, width], got the {type(dim_room).__name__} {dim_room!r}."
            )
        require_int("num_boxes", num_boxes)
        if height < 5 or width < 5:
            raise ValueError(f"Sokoban rooms need at least 5x5 cells (walls included), got {height}x{width}.")
        if num_boxes < 1:
            raise ValueError(f"num_boxes must be at least 1, got {num_boxes}.")
        self.height, self.width, self.num_boxes = height, width, num_boxes
        self._set_room(generate_room(seed, height, width, num_boxes, num_steps=num_steps, tries=tries))

    @classmethod
    def from_layout(cls, rows: Sequence[str], max_calls: int = 5) -> SokobanEnv:
        """A hand-made room (see `parse_layout`), for tests and examples."""
        room = parse_layout(rows)
        env = cls.__new__(cls)
        GameEnv.__init__(env, seed=None, max_calls=max_calls)
        env.height, env.width, env.num_boxes = len(room.floor), len(room.floor[0]), len(room.boxes)
        env._set_room(room)
        return env

    def _set_room(self, room: SokobanRoom) -> None:
        self.floor = room.floor
        self.targets = tuple(room.targets)
        self.boxes = set(room.boxes)
        self.player = room.player

    def render(self) -> str:
        """Rows of space-separated symbols: # wall, _ floor, O target, X box, √ box on target, P player."""
        lines = []
        for r in range(self.height):
            row = []
            for c in range(self.width):
                cell = (r, c)
                if cell == self.player:
                    row.append(SYMBOLS["player"])
                elif cell in self.boxes:
                    row.append(SYMBOLS["box_on_target"] if cell in self.targets else SYMBOLS["box"])
                elif cell in self.targets:
                    row.append(SYMBOLS["target"])
                elif self.floor[r][c]:
                    row.append(SYMBOLS["floor"])
                else:
                    row.append(SYMBOLS["wall"])
            lines.append(" ".join(row))
        return "\n".join(lines)

    def boxes_on_targets(self) -> int:
        return sum(b in self.targets for b in self.boxes)

    def progress(self) -> float:
        return self.boxes_on_targets() / len(self.targets)

    def _move(self, direction: str) -> MoveResult:
        dr, dc = DELTAS[direction]
        nxt = (self.player[0] + dr, self.player[1] + dc)
        if is_wall(self.floor, nxt):
            return MoveResult(False, f"Moving {direction} walks into a wall.")
        if nxt in self.boxes:
            beyond = (nxt[0] + dr, nxt[1] + dc)
            if is_wall(self.floor, beyond) or beyond in self.boxes:
                blocker = "another box" if beyond in self.boxes else "a wall"
                return MoveResult(False, f"Moving {direction} would push the box into {blocker}.")
            self.boxes.remove(nxt)
            self.boxes.add(beyond)
            self.player = nxt
            if self.boxes_on_targets() == len(self.targets):
                return MoveResult(True, f"You pushed the box {direction}. Every box is on a target: solved!", GOAL)
            on_target = " onto a target" if beyond in self.targets else ""
            return MoveResult(True, f"You pushed the box {direction}{on_target}.")
        self.player = nxt
        return MoveResult(True, f"You moved {direction}.")
