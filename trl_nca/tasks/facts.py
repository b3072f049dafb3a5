"""Knowledge tasks for the embedded model: made-up facts the context states and the question asks for (scorer
`contains`).

- `island_facts` (like the paper's game experience): each item's context is a short fact sheet about a fictional
  island (capital, currency, ruler, national dish); the question asks for one of those facts. Held-out questions ask
  for the same facts with question forms never used in training, so a student can only answer them without the
  context by having internalised the sheets.
- `town_facts` (a second real-model task: docs/results.md section 11): one made-up town's four-fact sheet (river,
  festival month, mayor, founding year) is the one context; each question asks for one fact, held-out questions in
  forms and lead-ins never used in training.
"""

from __future__ import annotations

import random

from ..core.views import ContextSpec
from .base import USER_TEMPLATE, BuiltinTask


# island_facts: one fact sheet per island

_SYLLABLES = (
    "ka",
    "lo",
    "mer",
    "vin",
    "tas",
    "qua",
    "rel",
    "dor",
    "ni",
    "zu",
    "bex",
    "fal",
    "gor",
    "shi",
    "pen",
    "ulm",
    "tra",
    "vek",
    "mo",
    "sel",
    "dru",
    "yth",
    "wen",
    "kor",
)
ISLAND_ATTRIBUTES = ("capital", "currency", "ruler", "dish")

ISLAND_TRAIN_FORMS = {
    "capital": (
        "What is the capital of {island}?",
        "Which city is the capital of {island}?",
        "Name the capital city of {island}.",
        "What city serves as the capital of {island}?",
        "Tell me the capital of {island}.",
    ),
    "currency": (
        "What currency is used on {island}?",
        "What is the currency of {island}?",
        "Which money do people use on {island}?",
        "Name the currency of {island}.",
        "What do people on {island} pay with?",
    ),
    "ruler": (
        "Who rules {island}?",
        "Who is the ruler of {island}?",
        "Name the ruler of {island}.",
        "Which queen rules {island}?",
        "Who governs {island}?",
    ),
    "dish": (
        "What is the national dish of {island}?",
        "Which dish is {island} famous for?",
        "Name the national dish of {island}.",
        "What food is {island} known for?",
        "Which meal is the national dish of {island}?",
    ),
}
ISLAND_TEST_FORMS = {
    "capital": (
        "I am flying to the capital of {island}. Which city is that?",
        "The capital of {island} is which city?",
        "What is {island}'s capital?",
        "Where is the seat of government of {island}?",
        "In which city is the capital of {island}?",
    ),
    "currency": (
        "I am visiting {island}. Which currency should I bring?",
        "The currency of {island} is called what?",
        "What is {island}'s currency?",
        "What coins are used on {island}?",
        "What is money called on {island}?",
    ),
    "ruler": (
        "Who sits on the throne of {island}?",
        "The ruler of {island} is who?",
        "Who is {island}'s ruler?",
        "Who is the queen of {island}?",
        "Who is in charge of {island}?",
    ),
    "dish": (
        "I want to try the food of {island}. Which dish should I order?",
        "The national dish of {island} is what?",
        "What is {island}'s national dish?",
        "What is the traditional dish of {island}?",
        "Which dish do people on {island} call their national dish?",
    ),
}


def island_sheet(island: dict[str, str]) -> str:
    """The fact sheet (the context) of one island."""
    return (
        f"Facts about the island of {island['island']}: its capital is {island['capital']}; its currency is the "
        f"{island['currency']}; it is ruled by Queen {island['ruler']}; its national dish is {island['dish']}."
    )


def _made_up_words(rng: random.Random, count: int, syllables: int, taken: set[str]) -> list[str]:
    words = []
    while len(words) < count:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(syllables))
        if word not in taken:
            taken.add(word)
            words.append(word)
    return words


def islands(seed: int = 0, num_islands: int = 12) -> list[dict[str, str]]:
    """`num_islands` fictional islands; every name and value is a distinct made-up word."""
    rng = random.Random(f"island_facts:{seed}")
    taken: set[str] = set()
    columns = {
        "island": [w.capitalize() for w in _made_up_words(rng, num_islands, 3, taken)],
        "capital": [w.capitalize() for w in _made_up_words(rng, num_islands, 3, taken)],
        "currency": _made_up_words(rng, num_islands, 2, taken),
        "ruler": [w.capitalize() for w in _made_up_words(rng, num_islands, 2, taken)],
        "dish": _made_up_words(rng, num_islands, 3, taken),
    }
    return [{key: values[i] for key, values in columns.items()} for i in range(num_islands)]


def island_facts(seed: int = 0, num_islands: int = 12) -> BuiltinTask:
    """Questions about fictional islands; each item's context is its island's fact sheet (scorer `contains`)."""
    world = islands(seed, num_islands)
    splits = {}
    for split, forms in (("train", ISLAND_TRAIN_FORMS), ("test", ISLAND_TEST_FORMS)):
        rows = []
        for island in world:
            for attribute in ISLAND_ATTRIBUTES:
                for k, form in enumerate(forms[attribute]):
                    rows.append(
                        {
                            "id": f"{split}-{island['island']}-{attribute}-{k}",
                            "prompt": form.format(island=island["island"]),
                            "context": island_sheet(island),
                            "answer": island[attribute],
                            "attribute": attribute,
                        }
                    )
        random.Random(f"island_facts:{seed}:{split}").shuffle(rows)
        splits[split] = rows
    return BuiltinTask(
        name="island_facts",
        family="knowledge",
        description="Questions about fictional islands; each item's context is the island's four-fact sheet.",
        train=splits["train"],
        test=splits["test"],
        context=ContextSpec(column="context", placement="user", template=USER_TEMPLATE),
        scorer="contains",
        max_new_tokens=32,
        info={"seed": seed, "islands": world},
    )


# ------------------------------------------------------------------------------------------------------------------
# town_facts: one made-up town's four-fact sheet, shared by every item

TOWN_ATTRIBUTES = ("river", "festival", "mayor", "founded")
_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)

TOWN_TRAIN_FORMS = {
    "river": (
        "What river flows through {town}?",
        "Which river runs through {town}?",
        "Name the river of {town}.",
        "What is the river in {town} called?",
        "Which river crosses {town}?",
        "What river is {town} on?",
    ),
    "festival": (
        "In which month is the festival of {town}?",
        "When is {town}'s festival held?",
        "Which month does {town} hold its festival in?",
        "What month is the {town} festival?",
        "When does {town} celebrate its festival?",
        "Name the month of the festival of {town}.",
    ),
    "mayor": (
        "Who is the mayor of {town}?",
        "Name the mayor of {town}.",
        "Who is {town}'s mayor?",
        "Which person is mayor of {town}?",
        "Who leads the town council of {town}?",
        "Who runs {town}?",
    ),
    "founded": (
        "When was {town} founded?",
        "In which year was {town} founded?",
        "What year was {town} founded in?",
        "How old is {town}: when was it founded?",
        "Name the founding year of {town}.",
        "When did {town} come into being?",
    ),
}
TOWN_TEST_FORMS = {
    "river": (
        "The river that flows past {town} is called what?",
        "If I walk along the water in {town}, which river is it?",
        "{town} lies on which river?",
        "Tell me the name of the river at {town}.",
        "What is the name of {town}'s river?",
        "Which river would I see in {town}?",
    ),
    "festival": (
        "I want to visit {town} for its festival. In which month should I go?",
        "The festival of {town} takes place in which month?",
        "Which month is festival time in {town}?",
        "Tell me when {town}'s yearly festival is.",
        "What month do people in {town} celebrate?",
        "In what month does the {town} festival happen?",
    ),
    "mayor": (
        "The mayor of {town} is who?",
        "Who was elected mayor of {town}?",
        "Tell me who the mayor of {town} is.",
        "Who holds the office of mayor in {town}?",
        "Whom should I write to as the mayor of {town}?",
        "Which name does the mayor of {town} have?",
    ),
    "founded": (
        "The town of {town} was founded in which year?",
        "Tell me the year {town} was founded.",
        "In what year did {town} get founded?",
        "What is the founding year of {town}?",
        "Since which year has {town} existed?",
        "Which year is {town}'s founding year?",
    ),
}
TOWN_TRAIN_LEADS = (
    "",
    "Quick question. ",
    "I am reading about {town}. ",
    "For a school project: ",
    "My friend asked me this. ",
    "I am curious. ",
    "Help me with a quiz. ",
    "Please answer briefly. ",
    "I forgot this fact. ",
    "Here is a question. ",
)
TOWN_TEST_LEADS = (
    "",
    "One thing I wonder: ",
    "I am planning a trip. ",
    "For my travel notes: ",
    "A visitor asks: ",
    "Settle a bet for me. ",
    "I need this for an essay. ",
    "Short answer please. ",
    "My grandmother lived there. ",
    "A question about a town. ",
)


def town(seed: int = 0) -> dict[str, str]:
    """The made-up town of `seed`: its name, river, festival month, mayor and founding year."""
    rng = random.Random(f"town_facts:{seed}")
    taken: set[str] = set()
    name, river = (w.capitalize() for w in _made_up_words(rng, 2, 3, taken))
    first, last = (w.capitalize() for w in _made_up_words(rng, 2, 2, taken))
    return {
        "town": name,
        "river": river,
        "festival": rng.choice(_MONTHS),
        "mayor": f"{first} {last}",
        "founded": str(rng.randint(1612, 1889)),
    }


def town_sheet(facts: dict[str, str]) -> str:
    """The fact sheet (the one context) of the town."""
    return (
        f"Facts about the town of {facts['town']}: the river {facts['river']} flows through it; its festival is held "
        f"every {facts['festival']}; its mayor is {facts['mayor']}; it was founded in {facts['founded']}."
    )


def town_facts(seed: int = 0) -> BuiltinTask:
    """Questions about one made-up town; every item's context is the town's four-fact sheet (scorer `contains`).
    Held-out items use question forms and lead-ins never used in training."""
    facts = town(seed)
    sheet = town_sheet(facts)
    splits = {}
    for split, forms, leads in (
        ("train", TOWN_TRAIN_FORMS, TOWN_TRAIN_LEADS),
        ("test", TOWN_TEST_FORMS, TOWN_TEST_LEADS),
    ):
        rows = [
            {
                "id": f"{split}-{attribute}-{k}-{j}",
                "prompt": (lead + form).format(town=facts["town"]),
                "answer": facts[attribute],
                "attribute": attribute,
            }
            for attribute in TOWN_ATTRIBUTES
            for k, form in enumerate(forms[attribute])
            for j, lead in enumerate(leads)
        ]
        random.Random(f"town_facts:{seed}:{split}").shuffle(rows)
        splits[split] = rows
    return BuiltinTask(
        name="town_facts",
        family="knowledge",
        description="Questions about one made-up town; the context is the town's four-fact sheet, shared by all items.",
        train=splits["train"],
        test=splits["test"],
        context=ContextSpec(column=None, text=sheet, placement="user", template=USER_TEMPLATE),
        scorer="contains",
        max_new_tokens=32,
        info={"seed": seed, "context": sheet, "town": facts},
    )
