"""Dataset builders for the paper's system-prompt domains: MedMCQA and yes/no safety classification.

Each builder returns rows with `id`, `prompt` (the user message, without the context) and `answer` (the label the
paired evaluation scores against), ready for `NCATrainer` with a fixed `context_text`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


LETTERS = "ABCD"
MEDMCQA_TRAIN_SUBJECTS = ("Gynaecology & Obstetrics", "Medicine", "Pharmacology", "Pathology")
MEDMCQA_TEST_SUBJECTS = ("Dental", "Anatomy", "Surgery", "Pediatrics")
MCQ_INSTRUCTION = "Give the letter of the correct option inside <answer></answer> tags."
YESNO_INSTRUCTION = "Answer with <answer>yes</answer> or <answer>no</answer>."


def medmcqa_prompt(row: Mapping[str, Any]) -> str:
    options = "\n".join(f"({letter}) {row[key]}" for letter, key in zip(LETTERS, ("opa", "opb", "opc", "opd")))
    return f"{row['question'].strip()}\n{options}\n{MCQ_INSTRUCTION}"


def medmcqa_answer(cop: Any, one_based: bool) -> str:
    """Letter of the correct option; the Hub copy stores `cop` as 0-3, the original JSON as 1-4."""
    index = int(cop) - (1 if one_based else 0)
    if not 0 <= index < 4:
        raise ValueError(f"MedMCQA `cop`={cop!r} is outside the expected range (hidden test labels are -1).")
    return LETTERS[index]


def detect_one_based(cops: Iterable[Any]) -> bool:
    """True when the labels run 1-4 (original JSON), False for 0-3 (Hub copy); fails on mixed or hidden labels."""
    values = {int(c) for c in cops}
    if -1 in values:
        raise ValueError("This MedMCQA split has hidden labels (cop = -1); use train or validation.")
    if values <= {0, 1, 2, 3} and 0 in values:
        return False
    if values <= {1, 2, 3, 4}:
        return True
    raise ValueError(f"Unexpected MedMCQA `cop` values {sorted(values)}; expected 0-3 or 1-4.")


def build_medmcqa(dataset, subjects: Iterable[str] | None = None, limit: int | None = None):
    """MedMCQA rows -> `id`, `prompt`, `answer`, `subject`; only multiple-choice ('single') items of `subjects`."""
    if subjects is not None:
        wanted = set(subjects)
        dataset = dataset.filter(lambda r: r["subject_name"] in wanted)
    if "choice_type" in dataset.column_names:
        dataset = dataset.filter(lambda r: r["choice_type"] == "single")
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    one_based = detect_one_based(dataset["cop"])
    return dataset.map(
        lambda r: {
            "id": str(r["id"]),
            "prompt": medmcqa_prompt(r),
            "answer": medmcqa_answer(r["cop"], one_based),
            "subject": r.get("subject_name"),
        },
        remove_columns=dataset.column_names,
    )


def build_prepared(dataset, limit: int | None = None):
    """The papers' prepared splits (chat `messages` + `answer`): the user turns become the prompt, any system
    message is dropped (it is the context being distilled)."""
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))

    def convert(row, index):
        messages = [m for m in row["messages"] if m["role"] != "system"]
        if messages and messages[-1]["role"] == "assistant":
            messages = messages[:-1]
        return {"id": str(row.get("id", index)), "prompt": messages, "answer": str(row["answer"]).strip().lower()}

    return dataset.map(convert, with_indices=True, remove_columns=dataset.column_names)
