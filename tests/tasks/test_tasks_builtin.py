"""Built-in tasks: deterministic generation, disjoint splits, context placement, and scorers that read small models."""

import pytest

from trl_nca.core.views import add_context, render_prompt_ids, split_example
from trl_nca.eval.scorers import (
    ContainsScorer,
    LanguageScorer,
    MultipleChoiceScorer,
    detect_language,
    get_scorer,
    parse_mcq_lenient,
    prompt_options,
    safe_score,
)
from trl_nca.tasks import get_task, task_names
from trl_nca.tasks.everyday import FRENCH_TEST_FORMS, FRENCH_TRAIN_FORMS
from trl_nca.tasks.facts import ISLAND_ATTRIBUTES, TOWN_ATTRIBUTES, island_sheet, town_sheet
from trl_nca.testing import make_tiny_tokenizer


@pytest.mark.parametrize("name", task_names())
def test_tasks_are_deterministic_and_sized(name):
    a, b, other = get_task(name, seed=0), get_task(name, seed=0), get_task(name, seed=1)
    assert a.train == b.train and a.test == b.test
    assert a.test != other.test
    assert len(a.test) >= 200 and len(a.train) >= 200
    ids = [r["id"] for r in a.train + a.test]
    assert len(ids) == len(set(ids))
    scorer = get_scorer(a.scorer)
    for row in a.train + a.test:
        scorer.check_label(row["answer"])
        assert a.context.context_of(row)  # every row has a non-empty context


def test_french_held_out_questions_use_unseen_forms():
    task = get_task("reply_in_french")
    train, test = {r["prompt"] for r in task.train}, {r["prompt"] for r in task.test}
    assert not train & test

    def form_of(question, forms):
        import re

        return [
            f
            for f in forms
            if re.fullmatch(
                re.escape(f)
                .replace(r"\{", "{")
                .replace(r"\}", "}")
                .format(a=r"\d+", b=r"\d+", country=".+", animal=".+", object=".+", food=".+", activity=".+", job=".+"),
                question,
            )
        ]

    assert all(form_of(q, FRENCH_TRAIN_FORMS) and not form_of(q, FRENCH_TEST_FORMS) for q in train)
    assert all(form_of(q, FRENCH_TEST_FORMS) and not form_of(q, FRENCH_TRAIN_FORMS) for q in test)
    assert len({form for q in test for form in form_of(q, FRENCH_TEST_FORMS)}) == len(FRENCH_TEST_FORMS)


def test_island_items_ask_for_facts_of_their_own_sheet():
    task = get_task("island_facts", num_islands=12)
    assert len(task.test) == 12 * len(ISLAND_ATTRIBUTES) * 5
    world = {i["island"]: i for i in task.info["islands"]}
    values = [v for island in world.values() for k, v in island.items()]
    assert len(values) == len(set(values))  # every made-up word is distinct
    for row in task.test:
        island = next(name for name in world if name in row["prompt"])
        assert row["context"] == island_sheet(world[island])
        assert row["answer"] == world[island][row["attribute"]]
        assert row["answer"] in row["context"] and row["answer"] not in row["prompt"]
    train_prompts = {r["prompt"] for r in task.train}
    assert not train_prompts & {r["prompt"] for r in task.test}


def test_town_items_ask_for_a_fact_of_the_one_sheet_in_unseen_forms():
    task = get_task("town_facts")
    facts = task.info["town"]
    assert task.context.text == town_sheet(facts) and task.context.column is None  # one sheet for every item
    assert len(set(facts.values())) == len(facts)
    assert {row["attribute"] for row in task.test} == set(TOWN_ATTRIBUTES)
    for row in task.train + task.test:
        assert row["answer"] == facts[row["attribute"]] and row["answer"] in task.context.text
        assert facts["town"] in row["prompt"] and row["answer"] not in row["prompt"]
    questions = {
        split: {row["prompt"].split(". ")[-1].split(": ")[-1] for row in rows}
        for split, rows in (("train", task.train), ("test", task.test))
    }
    assert not questions["train"] & questions["test"]  # no question form is shared
    assert len(task.test) == 240 and len({r["prompt"] for r in task.test}) == 240


@pytest.mark.parametrize("name", task_names())
def test_context_goes_into_the_user_turn_before_the_question(name):
    task = get_task(name)
    row = task.test[0]
    messages, _ = split_example(row)
    with_context = add_context(messages, task.context.context_of(row), task.context)
    assert [m["role"] for m in with_context] == ["user"]
    assert with_context[0]["content"] == f"{task.context.context_of(row)}\n\n{row['prompt']}"
    tokenizer = make_tiny_tokenizer()
    assert len(render_prompt_ids(tokenizer, with_context)) > len(render_prompt_ids(tokenizer, messages))


def test_unknown_task_names_the_choices():
    with pytest.raises(ValueError, match="reply_in_french"):
        get_task("french")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("La fer de la légère, le tarte de la maison.", "french"),
        ("L'addition des trois et d'un étoile est 51.", "french"),
        ("The car in this sentence is a sleek, modern vehicle.", "english"),
        ("26 + 28 = 54", None),
        ("Paris", None),
        ("Le chat is on the mat and the dog is in the house.", "english"),
    ],
)
def test_detect_language(text, expected):
    assert detect_language(text) == expected


def test_language_scorer_verdicts():
    scorer = LanguageScorer()
    assert scorer("Le chat est sur la table.", "french").correct
    assert not scorer("The cat is on the table.", "french").correct
    assert scorer("The cat is on the table.", "french").answer == "english"
    assert scorer("1234", "french").format_failure
    with pytest.raises(ValueError, match="french"):
        scorer.check_label("klingon")


def test_contains_scorer_matches_whole_words_after_normalising():
    scorer = ContainsScorer()
    assert scorer("The capital of Velmora is TASQUADRU.", "Tasquadru").correct
    assert not scorer("The capital is Tasquadrumer.", "Tasquadru").correct
    assert scorer("", "Tasquadru").format_failure
    with pytest.raises(ValueError):
        scorer.check_label("")


MCQ_PROMPT = "Which organ makes insulin?\n(A) Liver\n(B) Spleen\n(C) Pancreas\n(D) Kidney\nGive the letter."


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("(C) Pancreas", "C"),
        ("D - Kidney", "D"),
        ("Answer: C", "C"),
        ("The answer is b.", None),  # a lower-case letter after "is" is too ambiguous
        ("The answer is B.", "B"),
        ("[D]", "D"),
        ("B. Spleen", "B"),
        ("C", "C"),
        ("It is made by the pancreas.", "C"),
        ("Both the liver and the pancreas.", None),  # two option texts: no answer
        ("A drug that lowers sugar", None),
        ("<answer>The answer is B</answer>", "B"),
    ],
)
def test_lenient_mcq_parser(text, expected):
    assert parse_mcq_lenient(text, options=prompt_options(MCQ_PROMPT)) == expected


def test_lenient_scorer_reads_options_from_the_row_and_is_reported_next_to_the_others():
    scorer = get_scorer("mcq_lenient")
    row = {"prompt": [{"role": "user", "content": MCQ_PROMPT}], "answer": "C"}
    assert safe_score(scorer, "I think it is the pancreas.", "C", row).correct
    assert safe_score(scorer, "I think it is the pancreas.", "C").format_failure  # no row: no option texts
    assert not safe_score(MultipleChoiceScorer(), "(C) Pancreas", "C", row).correct  # reference parser: no tag
    from trl_nca.eval.scorers import COMPANION_SCORERS

    assert set(COMPANION_SCORERS["mcq"]) == {"mcq_strict", "mcq_lenient"}


@pytest.mark.parametrize("name", task_names())
def test_a_tasks_context_survives_the_config_fields(name, tmp_path):
    """`trl-nca compare` gives a task's context to the config as its fields (`context_fields`); the config builds it
    back with `ContextSpec.from_options`, the same spec (a fixed text keeps the config's default column)."""
    import dataclasses

    from trl_nca.trainers.nca_config import NCAConfig, context_fields

    spec = get_task(name, seed=0).context
    config = NCAConfig(output_dir=str(tmp_path), report_to="none", **context_fields(spec))
    expected = spec if spec.text is None else dataclasses.replace(spec, column="context")
    assert config.context_spec == expected


@pytest.mark.parametrize(
    "text, answer, correct",
    [
        ("Quill says: Paris is the capital.", "once", True),
        ("**Quill says:** a cat eats fish.", "once", True),
        ("Quill says: Quill says: a cat eats fish.", "twice", False),
        ("Quill says: a cat. Quill says more.", "repeated", False),
        ("A cat eats fish. Quill says: yes.", "late", False),
        ("A cat eats fish.", "absent", False),
    ],
)
def test_marker_once_wants_the_marker_first_and_once(text, answer, correct):
    score = get_scorer("marker_once")(text, "Quill says:")
    assert (score.answer, score.correct, score.format_failure) == (answer, correct, False)
    assert get_scorer("marker_once")("  ...  ", "Quill says:").format_failure


@pytest.mark.parametrize(
    "text, answer, correct",
    [
        ("It is 36.", "36", True),
        ("1,036 apples", "1036", False),
        ("35.5 or 36", "35.5", False),
        ("7 + 29 = 36", "7", False),
    ],
)
def test_first_number_reads_the_first_number(text, answer, correct):
    score = get_scorer("first_number")(text, "36")
    assert (score.answer, score.correct) == (answer, correct)
    assert get_scorer("first_number")("no number here", "36").format_failure


def test_tasks_that_cannot_be_applied_twice_count_the_twice_applied_reply():
    """`twice` of the marker, sum and swap tasks is the scorer's answer for the instruction applied twice, and the
    comparison's diagnostic counts the replies whose parsed answer is it (`{"answer": column}`)."""
    from trl_nca.eval.records import PairedRecord, ViewOutcome
    from trl_nca.recipes.compare_eval import diagnostic_rates

    cases = {
        "quill_prefix": ("Quill says: Quill says: hi", "Quill says: hi"),
        "plus_one": ("{twice} it is", "{answer} it is"),
        "swap_language": ("The cat is in the garden and it is happy.", "Le chat est dans le jardin et il est content."),
    }
    for name, (twice, once) in cases.items():
        task = get_task(name)
        row = task.test[0]
        scorer = get_scorer(task.scorer)
        twice, once = twice.format(**row), once.format(**row)
        assert scorer(twice, row["answer"]).answer == row["twice"] and not scorer(twice, row["answer"]).correct
        assert scorer(once, row["answer"]).correct

        x, xc = (scorer(text, row["answer"]) for text in (once, twice))
        record = PairedRecord(
            row["id"],
            ViewOutcome(once, x.answer, x.correct, 5, False, x.format_failure),
            ViewOutcome(twice, xc.answer, xc.correct, 5, False, xc.format_failure),
        )
        assert diagnostic_rates(task, [record]) == {"twice_x": 0.0, "twice_xc": 1.0}
