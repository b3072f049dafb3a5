"""The built-in tasks by name (`TASKS`, `get_task`): generated from a seed with nothing downloaded, each with a
training split, a held-out split, a context and a scorer name.

- `trl_nca.tasks.everyday`: instructions over everyday English questions for the embedded SmolLM2-135M-Instruct
  (`reply_in_french`, like the paper's system prompts; `quill_prefix`, `friend_prefix`, `plus_one` and `swap_language`,
  whose instruction cannot be applied twice);
- `trl_nca.tasks.facts`: made-up facts the context states (`island_facts`, like the paper's game experience, and
  `town_facts`);
- `trl_nca.tasks.digits`: the model organism's digit language (`organism_shift`, `organism_flip`,
  `organism_facts`).

Why these: the embedded model follows a context placed in the user turn, hardly a system message, answers
letter-only multiple choice at chance, and follows short instructions or fact sheets right before the question far
better than long shared ones. The measurements that chose them are in `docs/results.md` (sections 1, 11 and 13).

Every task is a pure function of its seed: the same seed gives the same items on every machine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import BuiltinTask
from .digits import organism_facts, organism_flip, organism_shift
from .everyday import friend_prefix, plus_one, quill_prefix, reply_in_french, swap_language
from .facts import island_facts, town_facts


TASKS: dict[str, Callable[..., BuiltinTask]] = {
    "reply_in_french": reply_in_french,
    "island_facts": island_facts,
    "town_facts": town_facts,
    "quill_prefix": quill_prefix,
    "friend_prefix": friend_prefix,
    "plus_one": plus_one,
    "swap_language": swap_language,
    "organism_shift": organism_shift,
    "organism_flip": organism_flip,
    "organism_facts": organism_facts,
}


def task_names() -> list[str]:
    return sorted(TASKS)


def get_task(name: str, seed: int = 0, **kwargs: Any) -> BuiltinTask:
    """A built-in task by name (one of `task_names()`), generated from `seed`."""
    if name not in TASKS:
        raise ValueError(f"Unknown built-in task {name!r}; choose one of {task_names()}.")
    return TASKS[name](seed=seed, **kwargs)
