"""Instruction tasks over everyday English questions, for the embedded SmolLM2-135M-Instruct: one fixed context for
every item, placed in the user turn before the question.

- `reply_in_french`: the instruction to reply in French (scorer `language`). Applied to a French reply it changes
  nothing, so a student that has internalised it cannot go wrong by applying it again.
- `quill_prefix` and `friend_prefix`: the instruction to begin the reply with a marker ("Quill says:", "Dear
  friend,"); scorer `marker_once`: right when the reply begins with the marker and holds it exactly once, so the
  instruction applied on top of a reply that already follows it (the marker twice) is wrong.
- `plus_one`: sums of two numbers, with the instruction to answer one more than the sum (scorer `first_number`);
  applied twice it gives the sum plus two.
- `swap_language`: the instruction to swap languages, English questions answered in French (scorer `language`);
  applied to a reply already in French it gives English.

The last four are the candidates of docs/results.md section 13, a task whose context cannot be applied twice.
Held-out questions come from question forms never used in training.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from ..core.views import ContextSpec
from .base import USER_TEMPLATE, BuiltinTask


# reply_in_french: one instruction for every item

FRENCH_CONTEXT = "Always reply in French."

_COUNTRIES = (
    "Italy",
    "Japan",
    "Egypt",
    "Spain",
    "Canada",
    "Brazil",
    "India",
    "Kenya",
    "Norway",
    "Peru",
    "Chile",
    "Greece",
    "Turkey",
    "Mexico",
    "Australia",
    "Germany",
    "China",
    "Sweden",
    "Poland",
    "Vietnam",
)
_ANIMALS = (
    "cat",
    "dog",
    "horse",
    "owl",
    "shark",
    "eagle",
    "rabbit",
    "elephant",
    "tiger",
    "frog",
    "whale",
    "bee",
    "fox",
    "wolf",
    "penguin",
    "camel",
    "goat",
    "parrot",
)
_OBJECTS = (
    "bicycle",
    "umbrella",
    "kettle",
    "lamp",
    "guitar",
    "clock",
    "bridge",
    "window",
    "candle",
    "ladder",
    "mirror",
    "pencil",
    "backpack",
    "boat",
    "train",
    "chair",
)
_FOODS = ("bread", "rice", "apples", "cheese", "soup", "carrots", "eggs", "honey", "pasta", "oranges", "beans", "fish")
_ACTIVITIES = (
    "swimming",
    "running",
    "reading",
    "cooking",
    "painting",
    "gardening",
    "cycling",
    "singing",
    "dancing",
    "playing chess",
    "hiking",
    "knitting",
)
_JOBS = (
    "doctor",
    "teacher",
    "farmer",
    "baker",
    "pilot",
    "nurse",
    "painter",
    "builder",
    "chef",
    "librarian",
    "firefighter",
    "gardener",
)


def format_number(rng: random.Random) -> int:
    return rng.randint(2, 60)


_SLOTS: dict[str, Callable[[random.Random], Any]] = {
    "a": format_number,
    "b": format_number,
    "country": lambda r: r.choice(_COUNTRIES),
    "animal": lambda r: r.choice(_ANIMALS),
    "object": lambda r: r.choice(_OBJECTS),
    "food": lambda r: r.choice(_FOODS),
    "activity": lambda r: r.choice(_ACTIVITIES),
    "job": lambda r: r.choice(_JOBS),
}

# Question forms; training items use the first list, held-out items only the second.
FRENCH_TRAIN_FORMS = (
    "What is {a} plus {b}?",
    "What is the capital of {country}?",
    "Describe a {object} in one sentence.",
    "What does a {job} do?",
    "Why do people enjoy {activity}?",
    "Where does a {animal} live?",
    "Give me one tip for {activity}.",
    "How is {food} usually eaten?",
    "Name one thing you can do with a {object}.",
    "Tell me a fun fact about {country}.",
    "What sound does a {animal} make?",
    "What should I pack for a trip to {country}?",
)
FRENCH_TEST_FORMS = (
    "What is {a} times {b}?",
    "What does a {animal} eat?",
    "Is {food} healthy?",
    "What is {a} minus {b}?",
    "Write one sentence about a {job}.",
    "What is the weather usually like in {country}?",
    "How do you take care of a {animal}?",
    "What is a {object} made of?",
    "Why is {activity} good for you?",
    "How many legs does a {animal} have?",
    "Suggest a name for a pet {animal}.",
    "What can you cook with {food}?",
)


def _questions(forms: Sequence[str], count: int, rng: random.Random, taken: set[str]) -> list[str]:
    """`count` distinct questions, taking the forms in turn; a form whose fillers are used up drops out."""
    out: list[str] = []
    active = list(forms)
    turn = 0
    while len(out) < count:
        if not active:
            raise ValueError(f"Cannot generate {count} distinct questions from {len(forms)} forms; ask for fewer.")
        form = active[turn % len(active)]
        for _ in range(100):  # a form that yields no new question in 100 draws is used up
            question = form.format(**{name: fill(rng) for name, fill in _SLOTS.items()})
            if question not in taken:
                taken.add(question)
                out.append(question)
                turn += 1
                break
        else:
            active.remove(form)
    return out


def reply_in_french(seed: int = 0, num_train: int = 256, num_test: int = 240) -> BuiltinTask:
    """Everyday English questions; the context asks for French replies (label `french`, scorer `language`)."""
    rng = random.Random(f"reply_in_french:{seed}")
    taken: set[str] = set()
    splits = {}
    for split, forms, count in (("train", FRENCH_TRAIN_FORMS, num_train), ("test", FRENCH_TEST_FORMS, num_test)):
        questions = _questions(forms, count, rng, taken)
        splits[split] = [{"id": f"{split}-{i}", "prompt": q, "answer": "french"} for i, q in enumerate(questions)]
    return BuiltinTask(
        name="reply_in_french",
        family="instruction",
        description="Everyday questions in English; the context is the instruction to reply in French.",
        train=splits["train"],
        test=splits["test"],
        context=ContextSpec(column=None, text=FRENCH_CONTEXT, placement="user", template=USER_TEMPLATE),
        scorer="language",
        max_new_tokens=48,
        info={"seed": seed, "context": FRENCH_CONTEXT},
    )


# ------------------------------------------------------------------------------------------------------------------
# swap_language: the instruction to swap languages, which applied twice swaps back

SWAP_CONTEXT = "Swap languages: reply to a question in English in French, and to a question in French in English."


def swap_language(seed: int = 0, num_train: int = 256, num_test: int = 240) -> BuiltinTask:
    """The everyday English questions of `reply_in_french`; the context asks to swap languages, so the right reply
    is French (label `french`, scorer `language`). The swap applied to a reply already in French gives English: each
    row's `twice` is the language scorer's answer for that (`english`)."""
    rng = random.Random(f"swap_language:{seed}")
    taken: set[str] = set()
    splits = {}
    for split, forms, count in (("train", FRENCH_TRAIN_FORMS, num_train), ("test", FRENCH_TEST_FORMS, num_test)):
        questions = _questions(forms, count, rng, taken)
        splits[split] = [
            {"id": f"{split}-{i}", "prompt": q, "answer": "french", "twice": "english"} for i, q in enumerate(questions)
        ]
    return BuiltinTask(
        name="swap_language",
        family="instruction",
        description="Everyday questions in English; the context asks to swap languages (reply in French).",
        train=splits["train"],
        test=splits["test"],
        context=ContextSpec(column=None, text=SWAP_CONTEXT, placement="user", template=USER_TEMPLATE),
        scorer="language",
        max_new_tokens=16,
        info={"seed": seed, "context": SWAP_CONTEXT, "diagnostics": {"twice": {"answer": "twice"}}},
    )


# ------------------------------------------------------------------------------------------------------------------
# quill_prefix, friend_prefix: a marker at the start of the reply, exactly once

QUILL_MARKER = "Quill says:"
FRIEND_MARKER = "Dear friend,"


def marker_context(marker: str) -> str:
    """The instruction of a marker task: begin the reply with `marker`."""
    return f'Begin your reply with "{marker}".'


def _marker_task(name: str, marker: str, seed: int, num_train: int, num_test: int) -> BuiltinTask:
    """The everyday questions of `reply_in_french` (its training and held-out forms), each labelled with `marker`;
    the context asks for the marker at the start of the reply. Each row also carries `twice`, the parsed answer of a
    reply that begins with the marker twice (the instruction applied on top of a reply that already follows it)."""
    rng = random.Random(f"{name}:{seed}")
    taken: set[str] = set()
    splits = {}
    for split, forms, count in (("train", FRENCH_TRAIN_FORMS, num_train), ("test", FRENCH_TEST_FORMS, num_test)):
        questions = _questions(forms, count, rng, taken)
        splits[split] = [
            {"id": f"{split}-{i}", "prompt": q, "answer": marker, "twice": "twice"} for i, q in enumerate(questions)
        ]
    context = marker_context(marker)
    return BuiltinTask(
        name=name,
        family="instruction",
        description=f"Everyday questions in English; the context asks for {marker!r} at the start of the reply, once.",
        train=splits["train"],
        test=splits["test"],
        context=ContextSpec(column=None, text=context, placement="user", template=USER_TEMPLATE),
        scorer="marker_once",
        max_new_tokens=16,
        info={"seed": seed, "context": context, "marker": marker, "diagnostics": {"twice": {"answer": "twice"}}},
    )


def quill_prefix(seed: int = 0, num_train: int = 256, num_test: int = 240) -> BuiltinTask:
    """Everyday questions; the context asks the reply to begin with "Quill says:" (scorer `marker_once`: the marker
    first, and exactly once, so the instruction applied twice gives a wrong reply)."""
    return _marker_task("quill_prefix", QUILL_MARKER, seed, num_train, num_test)


def friend_prefix(seed: int = 0, num_train: int = 256, num_test: int = 240) -> BuiltinTask:
    """Everyday questions; the context asks the reply to begin with "Dear friend," (scorer `marker_once`)."""
    return _marker_task("friend_prefix", FRIEND_MARKER, seed, num_train, num_test)


# ------------------------------------------------------------------------------------------------------------------
# plus_one: the sum of two numbers, plus one

PLUS_ONE_CONTEXT = "Always answer with one more than the correct number."
PLUS_ONE_TRAIN_FORMS = (
    "What is {a} plus {b}?",
    "How much is {a} plus {b}?",
    "Add {a} and {b}.",
    "What do you get when you add {a} to {b}?",
    "What is {a} + {b}?",
    "Tell me the sum of {a} and {b}.",
)
PLUS_ONE_TEST_FORMS = (
    "What is the sum of {a} and {b}?",
    "{a} plus {b} equals what?",
    "Compute {a} + {b}.",
    "If I have {a} apples and get {b} more, how many apples do I have?",
    "Calculate the total of {a} and {b}.",
    "What number is {a} more than {b}?",
)


def _sums(forms: Sequence[str], count: int, rng: random.Random, taken: set[str]) -> list[tuple[str, int]]:
    """`count` distinct (question, sum) pairs, taking the forms in turn."""
    out: list[tuple[str, int]] = []
    while len(out) < count:
        a, b = format_number(rng), format_number(rng)
        question = forms[len(out) % len(forms)].format(a=a, b=b)
        if question not in taken:
            taken.add(question)
            out.append((question, a + b))
    return out


def plus_one(seed: int = 0, num_train: int = 256, num_test: int = 240) -> BuiltinTask:
    """Sums of two numbers from 2 to 60; the context asks for one more than the correct number (scorer
    `first_number`: the first whole number of the reply must be the sum plus one). Each row also carries `twice`,
    the sum plus two (the instruction applied twice)."""
    rng = random.Random(f"plus_one:{seed}")
    taken: set[str] = set()
    splits = {}
    for split, forms, count in (("train", PLUS_ONE_TRAIN_FORMS, num_train), ("test", PLUS_ONE_TEST_FORMS, num_test)):
        splits[split] = [
            {"id": f"{split}-{i}", "prompt": q, "answer": str(total + 1), "twice": str(total + 2)}
            for i, (q, total) in enumerate(_sums(forms, count, rng, taken))
        ]
    return BuiltinTask(
        name="plus_one",
        family="instruction",
        description="Sums of two numbers; the context asks for one more than the correct number.",
        train=splits["train"],
        test=splits["test"],
        context=ContextSpec(column=None, text=PLUS_ONE_CONTEXT, placement="user", template=USER_TEMPLATE),
        scorer="first_number",
        max_new_tokens=16,
        info={"seed": seed, "context": PLUS_ONE_CONTEXT, "diagnostics": {"twice": {"answer": "twice"}}},
    )
