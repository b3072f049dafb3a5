"""What every text game shares: the move vocabulary, the per-call bookkeeping and the invalid-move rule.

One model call is one `step`. A call without a usable action, or with a move the rules forbid, is an invalid move: the
first one only adds a warning and leaves the board as it is; a second one in a row ends the game. A game that is not
over after `max_calls` calls ends as a failure with reason "max_steps". Success means a final reward of exactly 1.0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..core.checks import is_int


DIRECTIONS = ("up", "down", "left", "right")
DELTAS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

# End reasons, as stored in `GameEnv.end_reason` and in the evaluation records.
GOAL = "goal"
INVALID_MOVES = "invalid_moves"
MAX_STEPS = "max_steps"


def require_int(name: str, value: Any) -> int:
    """A game setting that must be an integer (bools and strings refused, with the value's type in the message)."""
    if not is_int(value):
        raise TypeError(f"{name} must be an integer, got the {type(value).__name__} {value!r}.")
    return value


@dataclass
class MoveResult:
    """What a game's rules say about one move: whether it was allowed, the message, and an end reason if it ended."""

    valid: bool
    message: str
    end_reason: str | None = None


@dataclass
class TurnRecord:
    """One model call as the transcript shows it: the action read from the reply (None if none), and the outcome."""

    action: str | None
    valid: bool
    message: str
    board: str | None = None  # the board after a valid move; None when the board did not change
    ended: bool = False


@dataclass
class EpisodeOutcome:
    """The summary of a finished (or still running) episode."""

    game: str
    seed: int | None
    won: bool
    reward: float
    num_calls: int
    num_moves: int
    num_invalid: int
    end_reason: str | None
    actions: list[str | None] = field(default_factory=list)

    @property
    def ended_at_cap(self) -> bool:
        return self.end_reason == MAX_STEPS

    def to_dict(self) -> dict[str, Any]:
        return {
            "game": self.game,
            "seed": self.seed,
            "won": self.won,
            "reward": self.reward,
            "num_calls": self.num_calls,
            "num_moves": self.num_moves,
            "num_invalid": self.num_invalid,
            "end_reason": self.end_reason,
            "ended_at_cap": self.ended_at_cap,
            "actions": list(self.actions),
        }


class GameEnv:
    """Base class of the single-player text games.

    Subclasses build their map in `__init__`, and implement `render`, `_move(direction) -> MoveResult` (which changes
    the state only for a valid move) and `progress()` (the reward of an unfinished or lost game, below 1.0).
    """

    name: ClassVar[str] = "game"

    def __init__(self, seed: int | None = None, max_calls: int = 5):
        if seed is not None:
            require_int("seed", seed)
        if require_int("max_calls", max_calls) < 1:
            raise ValueError(f"max_calls must be at least 1, got {max_calls}.")
        self.seed = seed
        self.max_calls = max_calls
        self.history: list[TurnRecord] = []
        self.done = False
        self.end_reason: str | None = None
        self.reward = 0.0
        self._invalid_streak = 0
        self.num_moves = 0
        self.num_invalid = 0
        self._initial_board: str | None = None

    # --- to implement ---------------------------------------------------------------------------------------------

    def render(self) -> str:
        """The current board as text."""
        raise NotImplementedError

    def _move(self, direction: str) -> MoveResult:
        raise NotImplementedError

    def progress(self) -> float:
        """Partial credit of the current position, in [0, 1); 1.0 is only ever given for a solved game."""
        raise NotImplementedError

    # --- shared rules ---------------------------------------------------------------------------------------------

    @property
    def num_calls(self) -> int:
        return len(self.history)

    @property
    def won(self) -> bool:
        return self.done and self.reward == 1.0

    @property
    def initial_board(self) -> str:
        """The board before the first call (the current board until then)."""
        return self._initial_board if self.history else self.render()

    @property
    def calls_left(self) -> int:
        return max(self.max_calls - self.num_calls, 0)

    def step(self, action: str | None) -> TurnRecord:
        """Play one model call. `action` is a direction from `DIRECTIONS`, or None when the reply had no action."""
        if self.done:
            raise RuntimeError(f"The {self.name} episode (seed {self.seed}) is over; make a new environment.")
        if action is not None and action not in DELTAS:
            raise ValueError(f"Unknown action {action!r}; expected one of {DIRECTIONS} or None.")
        if not self.history:
            self._initial_board = self.render()
        if action is None:
            result = MoveResult(False, "No action found in the reply.")
        else:
            result = self._move(action)
        record = TurnRecord(action=action, valid=result.valid, message=result.message)
        if result.valid:
            self._invalid_streak = 0
            self.num_moves += 1
            record.board = self.render()
            if result.end_reason is not None:
                self._finish(result.end_reason, 1.0 if result.end_reason == GOAL else self.progress())
        else:
            self._invalid_streak += 1
            self.num_invalid += 1
            if self._invalid_streak >= 2:
                record.message += " That was the second invalid move in a row: the game is over."
                self._finish(INVALID_MOVES, self.progress())
            else:
                record.message += " The move was not played; another invalid move in a row ends the game."
        self.history.append(record)
        if not self.done and self.num_calls >= self.max_calls:
            self.end_at_cap()
        record.ended = self.done
        return record

    def end_at_cap(self) -> None:
        """End an unfinished game because the call budget is spent (a failure, reason "max_steps")."""
        if not self.done:
            self._finish(MAX_STEPS, self.progress())

    def _finish(self, reason: str, reward: float) -> None:
        self.done = True
        self.end_reason = reason
        self.reward = float(reward)

    def outcome(self) -> EpisodeOutcome:
        return EpisodeOutcome(
            game=self.name,
            seed=self.seed,
            won=self.won,
            reward=self.reward,
            num_calls=self.num_calls,
            num_moves=self.num_moves,
            num_invalid=self.num_invalid,
            end_reason=self.end_reason,
            actions=[t.action for t in self.history],
        )
