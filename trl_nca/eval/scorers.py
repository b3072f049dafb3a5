"""Scorers: turn a generated response into (parsed answer, correct, format failure) given the item's label.

A scorer never raises on a response: whatever it cannot parse is a format failure, which counts as wrong and is also
counted separately, so no item is silently dropped from the accuracy denominator. An exception inside a scorer (a bug
in a user scorer, say) is caught the same way but recorded as an error: the evaluator warns once with its traceback and
reports the number of scorer errors in the summary and the Markdown report. Scorers can raise on a *label*
(`check_label`) so that a scorer/dataset mismatch is caught before any generation starts.
"""

from __future__ import annotations

import importlib
import inspect
import re
import string
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..core.checks import is_int


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class Score:
    """The verdict on one response: the parsed answer (None when nothing parsed), correctness and format failure."""

    answer: str | None
    correct: bool
    format_failure: bool
    error: str | None = None
    traceback: str | None = field(default=None, compare=False, repr=False)


@runtime_checkable
class Scorer(Protocol):
    """Anything with a `name`, a `check_label(label)` that raises `ValueError` on an unusable label, and a call."""

    name: str

    def check_label(self, label: Any) -> None: ...

    def __call__(self, text: str, label: Any) -> Score: ...


def last_tag_content(text: str, tag: str = "answer") -> str | None:
    """The content of the last `<tag>...</tag>` in `text`, or None when there is none."""
    pattern = _ANSWER_TAG if tag == "answer" else re.compile(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", re.DOTALL)
    matches = pattern.findall(text)
    return matches[-1] if matches else None


def parse_mcq_reference(text: str, letters: str = "ABCD") -> str | None:
    """The OPCD multiple-choice parser, quirks included.

    Takes the last `<answer>...</answer>`; inside it, the first parenthesised option letter such as `(B)`; failing
    that, the first character that is an option letter in either case, anywhere in the content. That last rule reads
    `<answer>The answer is B</answer>` as `A` (the "a" of "answer"): kept on purpose so numbers match the paper.
    """
    content = last_tag_content(text)
    if content is None:
        return None
    pool = letters.upper() + letters.lower()
    match = re.search(rf"\(([{pool}])\)", content)
    if match:
        return match.group(1).upper()
    for char in content:
        if char in pool:
            return char.upper()
    return None


def parse_mcq_strict(text: str, letters: str = "ABCD") -> str | None:
    """A strict multiple-choice parser: the last `<answer>` must hold one option letter and nothing ambiguous.

    Accepted contents (after stripping): `B`, `(B)`, `b`, or a letter introducing the option text as `(B) ...`,
    `B) ...`, `B. ...` or `B: ...`. Anything else, such as `The answer is B` or `A drug`, is unparsed.
    """
    content = last_tag_content(text)
    if content is None:
        return None
    content = content.strip()
    pool = letters.upper() + letters.lower()
    match = (
        re.fullmatch(rf"\(?([{pool}])\)?", content)
        or re.match(rf"\(([{pool}])\)(\s|$)", content)
        or re.match(rf"([{pool}])[.:)](\s|$)", content)
    )
    return match.group(1).upper() if match else None


_OPTION_LINE = re.compile(r"^\s*[(\[]([A-Za-z])[)\]]\s*(.+?)\s*$", re.MULTILINE)


def prompt_options(prompt: Any, letters: str = "ABCD") -> dict[str, str]:
    """Option texts of a multiple-choice prompt written one per line as `(A) text` (as `trl_nca.tasks` writes them).

    `prompt` is a string or chat messages (the user turns are read). Returns `{letter: text}`, possibly empty.
    """
    if isinstance(prompt, (list, tuple)):
        prompt = "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict) and m.get("role") == "user")
    if not isinstance(prompt, str):
        return {}
    return {m.group(1).upper(): m.group(2) for m in _OPTION_LINE.finditer(prompt) if m.group(1).upper() in letters}


def parse_mcq_lenient(text: str, letters: str = "ABCD", options: dict[str, str] | None = None) -> str | None:
    """A forgiving multiple-choice parser for small models that ignore the `<answer>` format.

    Reads the last `<answer>` content when there is one, else the whole response, and takes the first of: a letter in
    parentheses or brackets (`(C)`, `[C]`); `Answer: C` / `answer is C` / `option C`; a letter opening a line and
    followed by `)`, `.`, `:` or ` -` (`C) Pancreas`, `D - Pancreas`); a lone capital letter that is the whole reply;
    the text of exactly one option (case-insensitive, when `options` are given). Returns None when nothing matches.
    """
    content = last_tag_content(text)
    content = text if content is None else content
    upper = letters.upper()
    patterns = (
        rf"[(\[]([{upper}])[)\]]",
        rf"\b(?i:answer|option|choice)\s*(?:(?i:is)|:)?\s*[(\[]?([{upper}])\b",
        rf"(?m)^\s*([{upper}])\s*(?:[).:]|\s-)",
        rf"^\s*([{upper}])\s*[.!]?\s*$",
    )
    for pattern in patterns:
        match = re.search(pattern, content)
        if match:
            return match.group(1).upper()
    if options:
        lowered = content.lower()
        hits = [letter for letter, option in options.items() if option.strip() and option.strip().lower() in lowered]
        if len(hits) == 1:
            return hits[0]
    return None


class MultipleChoiceScorer:
    """Option-letter answers in `<answer>` tags, with the reference (OPCD) parser or the strict one.

    Labels are option letters (`"B"`, `"b"` or `"(B)"`). Integer labels are refused rather than guessed, because
    datasets disagree on whether option indices start at 0 or 1 (MedMCQA's `cop` is 0-3 on the Hub, 1-4 originally).
    """

    def __init__(self, strict: bool = False, letters: str = "ABCD", lenient: bool = False):
        if strict and lenient:
            raise ValueError("A multiple-choice scorer is strict or lenient, not both.")
        self.strict = strict
        self.lenient = lenient
        self.letters = letters.upper()
        self.name = "mcq_strict" if strict else "mcq_lenient" if lenient else "mcq"
        self.uses_row = lenient  # the lenient parser also matches the option texts written in the item's prompt

    def normalize_label(self, label: Any) -> str:
        if isinstance(label, str):
            letter = label.strip().strip("()").strip().upper()
            if len(letter) == 1 and letter in self.letters:
                return letter
        raise ValueError(
            f"the {self.name!r} scorer needs option-letter labels in {list(self.letters)}, got {label!r}"
            + (
                " (an integer index: map it to a letter first, checking whether the dataset counts from 0 or 1)"
                if is_int(label)
                else ""
            )
        )

    def check_label(self, label: Any) -> None:
        self.normalize_label(label)

    def __call__(self, text: str, label: Any, row: dict[str, Any] | None = None) -> Score:
        if self.lenient:
            options = prompt_options((row or {}).get("prompt") or (row or {}).get("messages"), self.letters)
            answer = parse_mcq_lenient(text, self.letters, options)
        else:
            answer = (parse_mcq_strict if self.strict else parse_mcq_reference)(text, self.letters)
        if answer is None:
            return Score(None, False, True)
        return Score(answer, answer == self.normalize_label(label), False)


class YesNoScorer:
    """Yes/no answers in `<answer>` tags: the last tag's content, lower-cased and stripped, must equal the label.

    A missing tag, or a tag whose content is neither `yes` nor `no` (e.g. `Yes.`), is a format failure.
    """

    name = "yesno"

    def normalize_label(self, label: Any) -> str:
        if isinstance(label, str) and label.strip().lower() in ("yes", "no"):
            return label.strip().lower()
        raise ValueError(f"the 'yesno' scorer needs labels 'yes' or 'no', got {label!r}")

    def check_label(self, label: Any) -> None:
        self.normalize_label(label)

    def __call__(self, text: str, label: Any) -> Score:
        content = last_tag_content(text)
        if content is None:
            return Score(None, False, True)
        answer = content.lower().strip()
        if answer not in ("yes", "no"):
            return Score(answer, False, True)
        return Score(answer, answer == self.normalize_label(label), False)


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_text(text: str) -> str:
    """Lower-case, drop punctuation and the articles a/an/the, collapse whitespace."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


class StringMatchScorer:
    """Exact or normalised string match against the label.

    The candidate answer is the last `<tag>` content when the response has one, else the whole response; with
    `require_tag=True` a missing tag is a format failure instead. An empty candidate is a format failure.
    """

    def __init__(self, normalize: bool = False, tag: str | None = "answer", require_tag: bool = False):
        self.normalize = normalize
        self.tag = tag
        self.require_tag = require_tag
        self.name = "normalized" if normalize else "exact"

    def _comparable(self, text: str) -> str:
        return normalize_text(text) if self.normalize else text.strip()

    def check_label(self, label: Any) -> None:
        if not isinstance(label, str) or not self._comparable(label):
            raise ValueError(f"the {self.name!r} scorer needs non-empty string labels, got {label!r}")

    def __call__(self, text: str, label: Any) -> Score:
        content = last_tag_content(text, self.tag) if self.tag else None
        if content is None:
            if self.require_tag:
                return Score(None, False, True)
            content = text
        answer = self._comparable(content)
        if not answer:
            return Score(None, False, True)
        return Score(answer, answer == self._comparable(str(label)), False)


class ContainsScorer:
    """Correct when the label appears in the response as whole words, after `normalize_text` on both sides.

    Meant for short factual answers inside free text ("The capital of Velmora is Tasquadru." for the label
    `Tasquadru`). A response without any word is a format failure.
    """

    name = "contains"

    def check_label(self, label: Any) -> None:
        if not isinstance(label, str) or not normalize_text(label):
            raise ValueError(f"the 'contains' scorer needs non-empty string labels, got {label!r}")

    def __call__(self, text: str, label: Any) -> Score:
        response = normalize_text(text)
        if not response:
            return Score(None, False, True)
        found = f" {normalize_text(str(label))} " in f" {response} "
        return Score(str(label) if found else None, found, False)


# Function words that are frequent in one language and rare in the other (no shared spellings such as "a" or "plus").
LANGUAGE_MARKERS: dict[str, frozenset[str]] = {
    "french": frozenset(
        "le la les un une des du de et est sont je tu il elle nous vous ils elles ce cette ces qui que pas pour avec "
        "dans sur au aux mais très où ou en être avoir fait leur leurs mon ma mes son sa ses peut comme".split()
    ),
    "english": frozenset(
        "the is are and of to in it you that this with for was what which be on as can your have has they there "
        "their from by an or not but will would should its".split()
    ),
}
_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)


def detect_language(text: str) -> str | None:
    """`"french"` or `"english"` when one language's marker words are at least two and outnumber the other's."""
    words = [w.lower() for w in _WORD.findall(text)]
    counts = {lang: sum(w in markers for w in words) for lang, markers in LANGUAGE_MARKERS.items()}
    best = max(counts, key=counts.get)
    others = [n for lang, n in counts.items() if lang != best]
    if counts[best] >= 2 and all(counts[best] > n for n in others):
        return best
    return None


class LanguageScorer:
    """Correct when the response is written in the label's language (`french` or `english`), by `detect_language`.

    The answer is the detected language, or `undetermined`; a response without any letter is a format failure.
    """

    name = "language"

    def check_label(self, label: Any) -> None:
        if not isinstance(label, str) or label.strip().lower() not in LANGUAGE_MARKERS:
            raise ValueError(f"the 'language' scorer needs a label in {sorted(LANGUAGE_MARKERS)}, got {label!r}")

    def __call__(self, text: str, label: Any) -> Score:
        if not _WORD.search(text):
            return Score(None, False, True)
        language = detect_language(text)
        return Score(language or "undetermined", language == str(label).strip().lower(), False)


def _word_runs(words: list[str], marker: list[str]) -> list[int]:
    """The positions in `words` where the word sequence `marker` starts (non-overlapping, left to right)."""
    starts, i = [], 0
    while i + len(marker) <= len(words):
        if words[i : i + len(marker)] == marker:
            starts.append(i)
            i += len(marker)
        else:
            i += 1
    return starts


def _plain_words(text: str) -> list[str]:
    """The words of `text`, lower-cased, without punctuation (articles kept, unlike `normalize_text`)."""
    return text.lower().translate(_PUNCTUATION).split()


class MarkerOnceScorer:
    """Correct when the reply begins with the label (a marker such as `Quill says:`) and holds it exactly once, both
    compared as words without case or punctuation (`**quill says**` is the marker).

    The answer says what the reply did: `once` (right), `twice` (the marker twice in a row at the start: an
    instruction to add it, applied on top of a reply that already has it), `repeated` (at the start and again later),
    `late` (not at the start) or `absent`. A reply without any word is a format failure.
    """

    name = "marker_once"

    def check_label(self, label: Any) -> None:
        if not isinstance(label, str) or not _plain_words(label):
            raise ValueError(f"the 'marker_once' scorer needs a non-empty marker as label, got {label!r}")

    def __call__(self, text: str, label: Any) -> Score:
        words = _plain_words(text)
        if not words:
            return Score(None, False, True)
        marker = _plain_words(str(label))
        starts = _word_runs(words, marker)
        if not starts:
            return Score("absent", False, False)
        if starts[0] != 0:
            return Score("late", False, False)
        if len(starts) == 1:
            return Score("once", True, False)
        return Score("twice" if starts[1] == len(marker) else "repeated", False, False)


_NUMBER = re.compile(r"(?<![\d.])-?\d+(?:\.\d+)?")


class FirstNumberScorer:
    """Correct when the first number written in digits in the reply is a whole number equal to the label (an integer
    as text); thousands separators are ignored, and a first number with decimals is wrong.

    The answer is that number as written; a reply without a number in digits is a format failure.
    """

    name = "first_number"

    def check_label(self, label: Any) -> None:
        if not isinstance(label, str) or not re.fullmatch(r"-?\d+", label.strip()):
            raise ValueError(f"the 'first_number' scorer needs a whole number as label, got {label!r}")

    def __call__(self, text: str, label: Any) -> Score:
        match = _NUMBER.search(re.sub(r"(?<=\d),(?=\d{3})", "", text))
        if match is None:
            return Score(None, False, True)
        answer = match.group(0)
        return Score(answer, "." not in answer and int(answer) == int(str(label).strip()), False)


class CallableScorer:
    """Wraps a user function `fn(text, label)` into a scorer.

    `fn` may return a bool (correct), a `(answer, correct)` pair, a `Score`, or a dict with `correct` and optionally
    `answer` and `format_failure`. If it raises, or returns something else, the response is recorded as a format
    failure with the error message, never skipped. `label_check`, if given, validates labels up front.
    """

    def __init__(
        self,
        fn: Callable[[str, Any], Any],
        name: str | None = None,
        label_check: Callable[[Any], None] | None = None,
    ):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "custom")
        self.label_check = label_check

    def check_label(self, label: Any) -> None:
        if self.label_check is not None:
            self.label_check(label)

    def __call__(self, text: str, label: Any) -> Score:
        try:
            result = self.fn(text, label)
        except Exception as error:  # a scorer bug must not lose the item
            return _error_score(error)
        return _coerce_score(result)


def _coerce_score(result: Any) -> Score:
    if isinstance(result, Score):
        return result
    if isinstance(result, bool):
        return Score(None, result, False)
    if isinstance(result, dict) and "correct" in result:
        answer = result.get("answer")
        return Score(
            None if answer is None else str(answer),
            bool(result["correct"]),
            bool(result.get("format_failure", False)),
        )
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], bool):
        answer = result[0]
        return Score(None if answer is None else str(answer), result[1], answer is None)
    return Score(None, False, True, error=f"the scorer returned an unsupported value {result!r}")


SCORERS: dict[str, Callable[[], Scorer]] = {
    "mcq": lambda: MultipleChoiceScorer(strict=False),
    "mcq_strict": lambda: MultipleChoiceScorer(strict=True),
    "mcq_lenient": lambda: MultipleChoiceScorer(lenient=True),
    "contains": ContainsScorer,
    "language": LanguageScorer,
    "marker_once": MarkerOnceScorer,
    "first_number": FirstNumberScorer,
    "yesno": YesNoScorer,
    "exact": lambda: StringMatchScorer(normalize=False),
    "normalized": lambda: StringMatchScorer(normalize=True),
}

# Scorers reported next to the main one by default, e.g. the strict MCQ parser next to the reference parser.
COMPANION_SCORERS: dict[str, tuple[str, ...]] = {
    "mcq": ("mcq_strict", "mcq_lenient"),
    "mcq_strict": ("mcq", "mcq_lenient"),
    "mcq_lenient": ("mcq", "mcq_strict"),
}


def get_scorer(spec: str | Scorer | Callable[[str, Any], Any]) -> Scorer:
    """A scorer from a registry name, a `"package.module:function"` path, a scorer object or a plain callable."""
    if isinstance(spec, str):
        if spec in SCORERS:
            return SCORERS[spec]()
        if ":" in spec:
            module_name, _, attr = spec.partition(":")
            try:
                fn = getattr(importlib.import_module(module_name), attr)
            except (ImportError, AttributeError) as error:
                raise ValueError(f"Cannot import the scorer function {spec!r}: {error}") from error
            if isinstance(fn, Scorer):
                return fn
            _check_takes_text_and_label(fn, spec)
            return CallableScorer(fn, name=attr)
        raise ValueError(f"Unknown scorer {spec!r}; choose one of {sorted(SCORERS)} or give 'package.module:function'.")
    if isinstance(spec, Scorer):
        return spec
    if callable(spec):
        return CallableScorer(spec)
    raise TypeError(f"A scorer must be a name, a Scorer or a callable, got {type(spec).__name__}.")


def _check_takes_text_and_label(fn: Any, spec: str) -> None:
    """A scorer function must take (text, label): one that cannot be called so would score every response as a
    failure and the run would end with exit status 0, so it is refused before any model loads."""
    if not callable(fn):
        raise ValueError(
            f"The scorer {spec!r} is a {type(fn).__name__}, not a function; give a function (text, label)."
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: called as it is
        return
    try:
        signature.bind("text", "label")
    except TypeError:
        raise ValueError(
            f"The scorer function {spec!r} has the signature {signature}, but a scorer is called as fn(text, label) "
            "(the response and the item's label); change it to take those two arguments."
        ) from None


def safe_score(scorer: Scorer, text: str, label: Any, row: dict[str, Any] | None = None) -> Score:
    """Score a response, turning any exception into a recorded format failure.

    Scorers with `uses_row = True` also receive the item's dataset row (e.g. to read the options of a question).
    """
    try:
        score = scorer(text, label, row=row) if getattr(scorer, "uses_row", False) else scorer(text, label)
    except Exception as error:
        return _error_score(error)
    return score if isinstance(score, Score) else _coerce_score(score)


def _error_score(error: Exception) -> Score:
    """The verdict on a response whose scorer raised: wrong, a format failure, and the error with its traceback."""
    return Score(None, False, True, error=f"{type(error).__name__}: {error}", traceback=traceback.format_exc())
