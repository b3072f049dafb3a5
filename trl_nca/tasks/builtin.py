"""Built-in tasks, generated from a seed with nothing downloaded, on which a small chat model uses its context.

Two families, one per kind of context in the paper:

- `reply_in_french` (instruction, like the paper's system prompts): one fixed context, an instruction to answer in
  French, shared by every item; the items are everyday questions asked in English. Scored by the `language` scorer
  (is the reply written in French?). Held-out questions come from question forms never used in training.
- `island_facts` (knowledge, like the paper's game experience): each item's context is a short fact sheet about a
  fictional island (capital, currency, ruler, national dish); the question asks for one of those facts. Scored by
  the `contains` scorer (does the reply name the right made-up word?). Held-out questions ask for the same facts with
  question forms never used in training, so a student can only answer them without the context by having
  internalised the sheets.

`town_facts` (knowledge shared by every item, a second real-model task: docs/results.md section 11): one made-up
town's four-fact sheet (river, festival month, mayor, founding year) is the one context; each question asks for one
fact, held-out questions in forms and lead-ins never used in training.

Three more, `organism_shift`, `organism_flip` and `organism_facts`, speak the model organism's digit language
(`trl_nca.models.organism`): one fixed rule for every item (the instruction family), or per item the one fact of a small
knowledge base that changes its answer (the knowledge family).

Why the first two: the embedded SmolLM2-135M-Instruct follows a context placed in the user turn, hardly a system message,
answers letter-only multiple choice at chance, and follows short instructions or fact sheets right before the question
far better than long shared ones. The measurements that chose them are in `docs/results.md`.

Every task is a pure function of its seed: the same seed gives the same items on every machine.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.views import ContextSpec


USER_TEMPLATE = "{context}\n\n{prompt}"  # the context goes right before the question, inside the user turn


@dataclass(frozen=True)
class BuiltinTask:
    """A generated task: rows for training and held-out evaluation, where the context goes, and how to score.

    Rows carry `id`, `prompt` (the user message without the context), `answer` (the scorer's label) and, for a
    per-item context, `context`. `context` says where the context comes from (a fixed `text` or the `context`
    column) and where it goes (the user turn, before the question); `scorer` names a scorer of
    `trl_nca.eval.get_scorer`. `max_new_tokens` is the reply budget used for training samples and evaluation.
    """

    name: str
    family: str
    description: str
    train: list[dict[str, Any]]
    test: list[dict[str, Any]]
    context: ContextSpec
    scorer: str
    max_new_tokens: int
    info: dict[str, Any] = field(default_factory=dict)

    def split(self, name: str) -> list[dict[str, Any]]:
        """The rows of split `train` or `test`."""
        if name not in ("train", "test"):
            raise ValueError(f"Task {self.name!r} has the splits 'train' and 'test', not {name!r}.")
        return self.train if name == "train" else self.test

    def unknown_token_fraction(self, tokenizer) -> float:
        """The fraction of the tokens of every prompt and context (both splits) that `tokenizer` maps to its unknown
        token: 0 for a byte-level tokenizer, near 1 for a word-level one of another language (the organism's)."""
        unknown = getattr(tokenizer, "unk_token_id", None)
        if unknown is None:
            return 0.0
        texts = [str(row["prompt"]) for row in (*self.train, *self.test)]
        if self.context.text is not None:
            texts.append(self.context.text)
        elif self.context.column is not None:
            texts += [str(row[self.context.column]) for row in (*self.train, *self.test) if self.context.column in row]
        ids = [i for encoded in tokenizer(texts, add_special_tokens=False)["input_ids"] for i in encoded]
        return sum(i == unknown for i in ids) / max(len(ids), 1)

    def dataset(self, name: str):
        """A split as a `datasets.Dataset`."""
        from datasets import Dataset

        return Dataset.from_list(self.split(name))


# ------------------------------------------------------------------------------------------------------------------
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


# ------------------------------------------------------------------------------------------------------------------
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
    from ..models.organism import answer_line, query_line, rule_line

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
    from ..models.organism import answer_line, fact_line, query_line

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


TASKS: dict[str, Callable[..., BuiltinTask]] = {
    "reply_in_french": reply_in_french,
    "island_facts": island_facts,
    "town_facts": town_facts,
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
