"""The documents of the lm-evaluation-harness task shipped with the package (`trl_nca/resources/harness`).

`island_facts_mc` is `island_facts`' held-out split (`trl_nca.tasks.facts`) asked as multiple choice: each question
about a fictional island offers its right answer and the same fact of three other islands, in a seeded order; the
document's `context` field is the island's fact sheet. Without it a model can only guess (25%); with it the answer is in
the prompt. `island_facts_mc_docs()` rebuilds the shipped JSONL exactly (tests/eval/test_harness.py checks it).
"""

from __future__ import annotations

import random
from typing import Any

from .facts import island_facts


HARNESS_TASK = "island_facts_mc"
NUM_DOCS = 96
NUM_CHOICES = 4


def island_facts_mc_docs(seed: int = 0, count: int = NUM_DOCS) -> list[dict[str, Any]]:
    """The first `count` held-out questions of `island_facts(seed)` with four options each (`choices`, `label`: the
    right option's index) and their fact sheet (`context`)."""
    task = island_facts(seed)
    world = task.info["islands"]
    rng = random.Random(f"{HARNESS_TASK}:{seed}")
    docs = []
    for row in task.test[:count]:
        others = [island[row["attribute"]] for island in world if island[row["attribute"]] != row["answer"]]
        choices = [row["answer"], *rng.sample(others, NUM_CHOICES - 1)]
        rng.shuffle(choices)
        docs.append(
            {
                "id": row["id"],
                "question": row["prompt"],
                "choices": choices,
                "label": choices.index(row["answer"]),
                "context": row["context"],
            }
        )
    return docs
