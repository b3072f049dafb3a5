"""What every built-in task is: `BuiltinTask` (its rows, where its context goes, how it is scored) and the user-turn
template that puts the context right before the question."""

from __future__ import annotations

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
