"""Answer parsers and scorers on tricky responses."""

import pytest

from trl_nca.eval.scorers import (
    CallableScorer,
    MultipleChoiceScorer,
    Score,
    StringMatchScorer,
    YesNoScorer,
    get_scorer,
    last_tag_content,
    normalize_text,
    parse_mcq_reference,
    parse_mcq_strict,
    safe_score,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>B</answer>", "B"),
        ("<answer>(c)</answer>", "C"),
        ("<answer>The answer is B</answer>", "A"),  # the reference quirk: the "a" of "answer"
        ("<answer>I pick (D) because of (B)</answer>", "D"),  # first parenthesised letter wins
        ("<answer>A</answer> on reflection <answer>(C)</answer>", "C"),  # the last tag wins
        ("<answer>\n  d \n</answer>", "D"),  # multi-line content
        ("<answer>Option (E) is wrong, so B</answer>", "B"),  # (E) is no option; falls back to the first letter
        ("The answer is (B)", None),  # no tag
        ("<answer>(B)", None),  # unclosed tag
        ("<answer>42</answer>", None),  # nothing parsable inside
        ("<answer></answer>", None),
    ],
)
def test_reference_mcq_parser(text, expected):
    assert parse_mcq_reference(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>B</answer>", "B"),
        ("<answer> (c) </answer>", "C"),
        ("<answer>B. Aspirin</answer>", "B"),
        ("<answer>(A) Aspirin</answer>", "A"),
        ("<answer>D) none of the above</answer>", "D"),
        ("<answer>The answer is B</answer>", None),
        ("<answer>A drug of choice</answer>", None),  # a word starting with a letter is not an answer
        ("<answer>BC</answer>", None),
        ("<answer>E</answer>", None),
        ("B", None),
    ],
)
def test_strict_mcq_parser(text, expected):
    assert parse_mcq_strict(text) == expected


def test_mcq_scorers_report_correct_and_format_failure():
    reference, strict = MultipleChoiceScorer(), MultipleChoiceScorer(strict=True)
    quirk = "<answer>The answer is B</answer>"
    assert reference(quirk, "A") == Score("A", True, False)
    assert reference(quirk, "B") == Score("A", False, False)
    assert strict(quirk, "B") == Score(None, False, True)
    assert reference("no tags at all", "B") == Score(None, False, True)
    assert reference("<answer>(b)</answer>", "(B)").correct  # labels may carry parentheses or lower case
    assert MultipleChoiceScorer(letters="ABCDE")("<answer>E</answer>", "E").correct


@pytest.mark.parametrize("label", [1, "E", "", None, "AB", True])
def test_mcq_rejects_unusable_labels(label):
    with pytest.raises(ValueError, match="option-letter labels"):
        MultipleChoiceScorer().check_label(label)


def test_mcq_integer_label_message_mentions_index_base():
    with pytest.raises(ValueError, match="counts from 0 or 1"):
        MultipleChoiceScorer().check_label(2)


@pytest.mark.parametrize(
    "text, label, expected",
    [
        ("<answer>yes</answer>", "yes", Score("yes", True, False)),
        ("<answer> YES </answer>", "Yes", Score("yes", True, False)),
        ("<answer>no</answer> wait <answer>yes</answer>", "no", Score("yes", False, False)),
        ("<answer>Yes.</answer>", "yes", Score("yes.", False, True)),  # not exactly yes/no
        ("yes", "yes", Score(None, False, True)),  # missing tag
    ],
)
def test_yesno_scorer(text, label, expected):
    assert YesNoScorer()(text, label) == expected


def test_yesno_rejects_other_labels():
    with pytest.raises(ValueError, match="'yes' or 'no'"):
        YesNoScorer().check_label("A")
    with pytest.raises(ValueError):
        YesNoScorer().check_label(True)


def test_string_match_scorers():
    exact, normalized = StringMatchScorer(), StringMatchScorer(normalize=True)
    assert exact("<answer> Paris </answer>", "Paris").correct
    assert not exact("<answer>paris.</answer>", "Paris").correct
    assert normalized("<answer>The  Paris.</answer>", "paris").correct
    assert normalized("Paris!", "paris").correct  # no tag: the whole response is the answer
    assert StringMatchScorer(require_tag=True)("Paris", "Paris") == Score(None, False, True)
    assert exact("<answer>   </answer>", "Paris").format_failure
    assert normalize_text("An Apple, the pie!") == "apple pie"
    with pytest.raises(ValueError):
        exact.check_label(3)


def test_callable_scorer_accepts_several_return_shapes_and_records_errors():
    assert CallableScorer(lambda t, y: t == y)("x", "x") == Score(None, True, False)
    assert CallableScorer(lambda t, y: (t.upper(), True))("x", "X") == Score("X", True, False)
    assert CallableScorer(lambda t, y: {"correct": False, "answer": 3})("x", "y") == Score("3", False, False)

    def broken(text, label):
        raise RuntimeError("boom")

    score = CallableScorer(broken)("x", "y")
    assert score.format_failure and not score.correct and "boom" in score.error
    assert CallableScorer(lambda t, y: "weird")("x", "y").format_failure
    # safe_score protects against scorer objects that raise too
    assert safe_score(YesNoScorer(), None, "yes").format_failure


def test_registry_and_import_paths():
    assert get_scorer("mcq").name == "mcq"
    assert get_scorer("mcq_strict").strict
    assert isinstance(get_scorer("yesno"), YesNoScorer)
    assert get_scorer("normalized").normalize and not get_scorer("exact").normalize
    assert get_scorer("trl_nca.eval.scorers:last_tag_content").name == "last_tag_content"  # callable as (text, label)
    with pytest.raises(ValueError, match=r"has the signature \(text: 'str'\) -> 'str', but a scorer is called as"):
        get_scorer("trl_nca.eval.scorers:normalize_text")  # one argument: it would score every answer as a failure
    with pytest.raises(ValueError, match="Unknown scorer"):
        get_scorer("nope")
    with pytest.raises(ValueError, match="Cannot import"):
        get_scorer("trl_nca.eval.scorers:missing")


def test_last_tag_content_other_tags():
    assert last_tag_content("<final>1</final><final>2</final>", "final") == "2"
    assert last_tag_content("<answer>a</answer>") == "a"
