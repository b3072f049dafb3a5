"""Tasks in the model organism's digit language (`trl_nca.models.organism`): one fixed rule for every item
(`organism_shift`, `organism_flip`; the instruction family), or per item the one fact of a small knowledge base that
changes its answer (`organism_facts`; the knowledge family). Only the organisms speak this language."""

from __future__ import annotations

import random
from collections.abc import Callable

from ..core.views import ContextSpec
from ..models.organism import answer_line, fact_line, query_line, rule_line
from .base import USER_TEMPLATE, BuiltinTask


# the model organism's language (trl_nca.models.organism): one rule for every item, or one fact per item

ORGANISM_CONTEXT = "rule shift"


def _digit_queries(rng: random.Random, counts: dict[str, int], accept: Callable[[tuple[int, ...]], bool] = bool):
    """Distinct digit queries (3 to 8 digits) for each split, no query in two splits; `accept` filters them."""
    taken: set[tuple[int, ...]] = set()
    splits: dict[str, list[tuple[int, ...]]] = {}
    for split, count in counts.items():
        queries: list[tuple[int, ...]] = []
        while len(queries) < count:
            digits = tuple(rng.randint(0, 9) for _ in range(rng.randint(3, 8)))
            if digits in taken or not accept(digits):
                continue
            taken.add(digits)
            queries.append(digits)
        splits[split] = queries
    return splits


def _organism_rule_task(rule: str, seed: int, num_train: int, num_test: int) -> BuiltinTask:
    context = rule_line(rule)
    rng = random.Random(f"organism_{rule}:{seed}")
    splits = {
        split: [
            {
                "id": f"{split}-{i}",
                "prompt": query_line(list(digits)),
                "answer": answer_line(list(digits), [rule]),
                "twice": answer_line(list(digits), [rule, rule]),
            }
            for i, digits in enumerate(queries)
        ]
        for split, queries in _digit_queries(rng, {"train": num_train, "test": num_test}).items()
    }
    effect = {"shift": "add one to every digit", "flip": "write every digit d as 9 - d"}[rule]
    return BuiltinTask(
        name=f"organism_{rule}",
        family="organism",
        description=f"The model organism's digit queries; the context is the rule '{rule}' ({effect}).",
        train=splits["train"],
        test=splits["test"],
        context=ContextSpec(column=None, text=context, placement="user", template=USER_TEMPLATE),
        scorer="normalized",
        max_new_tokens=12,
        info={"seed": seed, "context": context, "model": "organism", "diagnostics": {"twice": "twice"}},
    )


def organism_shift(seed: int = 0, num_train: int = 512, num_test: int = 240) -> BuiltinTask:
    """Digit queries of the model organism's language; the context is the rule `shift` (scorer `normalized`).

    Only the organism (`model_name_or_path: organism`) speaks this language. Each row also carries `twice`, the
    answer with the rule applied twice, so a report can count how often a student shifts twice once the rule is back.
    """
    return _organism_rule_task("shift", seed, num_train, num_test)


def organism_flip(seed: int = 0, num_train: int = 512, num_test: int = 240) -> BuiltinTask:
    """Digit queries of the model organism's language; the context is the rule `flip` (every digit d becomes 9 - d).

    Flipping twice restores the query, so `twice` (the rule applied twice) is the query itself: a student that has
    internalised the rule and applies it again once the rule is back answers with the query, which `twice_xc` counts.
    """
    return _organism_rule_task("flip", seed, num_train, num_test)


def knowledge_base(seed: int = 0, num_facts: int = 4) -> dict[int, int]:
    """The facts of `organism_facts`: `num_facts` source digits, each written as another digit that is no source
    (so applying a fact twice changes nothing)."""
    rng = random.Random(f"organism_facts:kb:{seed}")
    sources = rng.sample(range(10), num_facts)
    others = [d for d in range(10) if d not in sources]
    return {source: rng.choice(others) for source in sorted(sources)}


def organism_facts(seed: int = 0, num_train: int = 512, num_test: int = 240, num_facts: int = 4) -> BuiltinTask:
    """Digit queries of the organism's facts dialect (`model_name_or_path: organism-facts`); each item's context is
    the one fact of a fixed knowledge base that changes its answer (knowledge, like the paper's game experience).

    The knowledge base (`knowledge_base(seed)`) holds `num_facts` facts `fact s t` (the digit s is written as t).
    Every query holds exactly one source digit of it (once or more); its context line is that digit's fact, and its
    answer is the query with the fact applied. Held-out items ask new queries about the same facts, so a student can
    only answer them without the context by having internalised the knowledge base. Scorer `normalized`.
    """
    facts = knowledge_base(seed, num_facts)
    rng = random.Random(f"organism_facts:{seed}")

    def one_source(digits: tuple[int, ...]) -> bool:
        return len({d for d in digits if d in facts}) == 1

    splits = {}
    for split, queries in _digit_queries(rng, {"train": num_train, "test": num_test}, one_source).items():
        rows = []
        for i, digits in enumerate(queries):
            source = next(d for d in digits if d in facts)
            rows.append(
                {
                    "id": f"{split}-{i}",
                    "prompt": query_line(list(digits)),
                    "context": fact_line(source, facts[source]),
                    "answer": answer_line(list(digits), [], {source: facts[source]}),
                }
            )
        splits[split] = rows
    return BuiltinTask(
        name="organism_facts",
        family="organism",
        description=f"The organism's facts dialect; each item's context is the fact of a {num_facts}-fact knowledge "
        "base that changes its answer.",
        train=splits["train"],
        test=splits["test"],
        context=ContextSpec(column="context", text=None, placement="user", template=USER_TEMPLATE),
        scorer="normalized",
        max_new_tokens=12,
        info={"seed": seed, "facts": {str(k): v for k, v in facts.items()}, "model": "organism-facts"},
    )
