"""The prompts and completions the measures run on: from a dataset or built-in task, sampled here or read from the
records of `trl-nca eval` / `trl-nca compare`.

Prompts are rendered with `trl_nca.core.views` (`split_example`, `add_context`, `render_prompt_ids`), the functions the
trainer and the evaluation use, so both views are exactly the ones a model saw there.

Evaluation records (`records.jsonl`) keep, per item, the response text of each view, its token count, whether it hit
the token limit, and the item's row index, context hash and prompt token counts, but neither the prompt nor the
completion's token ids. So the prompt is rebuilt from the dataset row the record names (and checked against the
record's context hash and prompt token counts: a different dataset, context or chat template is an error), and the
completion is re-tokenised from its text, followed by the end-of-turn token when the response was not cut off by the
token limit (generation decodes without special tokens). Re-tokenising may not give back the sampled ids (a
tokenizer can merge the decoded text differently); the number of completions whose length then differs from the
recorded token count is reported. A record view that carries its ids in `extra["completion_ids"]` is used as is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..console import progress_bar
from ..core.sampling import HFBackend, item_seed
from ..core.views import ContextSpec, add_context, render_prompt_ids, split_example
from ..inputs import InputError
from .measures import AnalysisItem


class AnalysisInputError(InputError):
    """Bad input to the analysis (dataset, records, models, options); the message names it and the fix."""


@dataclass
class PromptItem:
    """A dataset row rendered in both views."""

    item_id: str
    index: int
    prompt_ids_x: list[int]
    prompt_ids_xc: list[int]
    context_sha256: str


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _messages(row: Mapping[str, Any], prompt_column: str | None, where: str):
    if prompt_column in (None, "prompt", "messages"):
        example = row if prompt_column is None else {prompt_column: row.get(prompt_column)}
    else:
        example = {"prompt": row.get(prompt_column)}
    messages, _ = split_example(example, where)
    return messages


def item_id_of(row: Mapping[str, Any], index: int, id_column: str | None) -> str:
    """The item id `trl-nca eval` gives a row: its id column's value, or its row index."""
    if id_column is None:
        return str(index)
    if row.get(id_column) is None:
        raise AnalysisInputError(f"Row {index} has no id in column {id_column!r}; fill it in or leave out --id-column.")
    return str(row[id_column])


def prompt_item(
    row: Mapping[str, Any],
    index: int,
    tokenizer,
    context: ContextSpec,
    *,
    item_id: str | None = None,
    prompt_column: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> PromptItem:
    """One row rendered without and with its context (errors name the row)."""
    item_id = str(index) if item_id is None else item_id
    where = f"row {index} (item {item_id!r})"
    try:
        messages = _messages(row, prompt_column, where)
        text = context.context_of(row, index)
        kwargs = dict(chat_template_kwargs or {})
        ids_x = render_prompt_ids(tokenizer, messages, **kwargs)
        ids_xc = render_prompt_ids(tokenizer, add_context(messages, text, context), **kwargs)
    except (KeyError, TypeError, ValueError) as error:
        raise AnalysisInputError(f"{where}: {str(error).strip(chr(34) + chr(39))}") from error
    return PromptItem(item_id, index, ids_x, ids_xc, _sha256(text))


def prepare_prompts(
    rows: Sequence[Mapping[str, Any]],
    tokenizer,
    context: ContextSpec,
    *,
    id_column: str | None = None,
    prompt_column: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    limit: int | None = None,
) -> list[PromptItem]:
    """The first `limit` rows (all by default) rendered in both views; item ids must be unique."""
    if limit is not None and limit < 1:
        raise AnalysisInputError(f"--limit must be at least 1, got {limit}.")
    rows = list(rows)[:limit] if limit is not None else list(rows)
    if not rows:
        raise AnalysisInputError("The dataset has no rows to analyse.")
    items, seen = [], {}
    for index, row in enumerate(rows):
        item_id = item_id_of(row, index, id_column)
        if item_id in seen:
            raise AnalysisInputError(
                f"Item id {item_id!r} appears in rows {seen[item_id]} and {index}; ids must be unique."
            )
        seen[item_id] = index
        items.append(
            prompt_item(
                row,
                index,
                tokenizer,
                context,
                item_id=item_id,
                prompt_column=prompt_column,
                chat_template_kwargs=chat_template_kwargs,
            )
        )
    return items


def end_token_id(model, tokenizer) -> int | None:
    """The token a finished response ends with: the tokenizer's eos when generation stops on it, else the first of
    the generation config's eos ids."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    if tokenizer.eos_token_id is not None and (not ids or tokenizer.eos_token_id in ids):
        return tokenizer.eos_token_id
    return ids[0] if ids else None


@dataclass
class RecordsInfo:
    """How the completions of one records file were obtained, for the report."""

    path: str
    view: str
    items: int
    retokenized: int
    length_mismatches: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "view": self.view,
            "items": self.items,
            "retokenized": self.retokenized,
            "length_mismatches": self.length_mismatches,
        }


class RecordItems(NamedTuple):
    """The items made from a records file, and how their completions were obtained."""

    items: list[AnalysisItem]
    info: RecordsInfo


def items_from_records(
    records: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    tokenizer,
    context: ContextSpec,
    *,
    path: str = "records",
    view: str = "x",
    end_id: int | None = None,
    id_column: str | None = None,
    prompt_column: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    limit: int | None = None,
) -> RecordItems:
    """Items from paired evaluation records (`trl_nca.eval.store.load_records`) and the dataset they were made on.

    Each record names its row (`meta["index"]`); the row is rendered again and must match the record's context hash
    and prompt token counts. `view` picks the completion: "x" (sampled without the context, what training samples)
    or "xc". The first `limit` records by row index are used.
    """
    if view not in ("x", "xc"):
        raise AnalysisInputError(f"The records view must be 'x' or 'xc', got {view!r}.")
    if not records:
        raise AnalysisInputError(f"{path} holds no records.")
    ordered = _records_by_row(records, path)
    if limit is not None:
        ordered = ordered[:limit]
    items, retokenized, mismatches = [], 0, 0
    for index, item_id, record in ordered:
        row = _record_row(rows, index, item_id, id_column, path)
        prompt = prompt_item(
            row,
            index,
            tokenizer,
            context,
            item_id=item_id,
            prompt_column=prompt_column,
            chat_template_kwargs=chat_template_kwargs,
        )
        _check_record_prompt(record, prompt, path)
        completion = _recorded_completion(getattr(record, view), tokenizer, end_id)
        if completion.source == "records:retokenized":
            retokenized += 1
            mismatches += completion.length_differs
        items.append(
            AnalysisItem(item_id, prompt.prompt_ids_x, prompt.prompt_ids_xc, completion.ids, completion.source)
        )
    return RecordItems(items, RecordsInfo(path, view, len(items), retokenized, mismatches))


class _RecordAt(NamedTuple):
    index: int  # the dataset row the record was made on
    item_id: str
    record: Any


def _records_by_row(records: Mapping[str, Any], path: str) -> list[_RecordAt]:
    ordered = []
    for item_id, record in records.items():
        index = record.meta.get("index")
        if not isinstance(index, int):
            raise AnalysisInputError(
                f"The record of item {item_id!r} in {path} has no row index (meta['index']): it was not written by a "
                "dataset evaluation (game records hold played episodes, not one prompt per item). Analyse a dataset "
                "evaluation, or give --dataset/--task to sample completions here."
            )
        ordered.append(_RecordAt(index, item_id, record))
    return sorted(ordered, key=lambda r: r.index)


def _record_row(rows: Sequence[Mapping[str, Any]], index: int, item_id: str, id_column: str | None, path: str):
    """The dataset row a record names, checked to carry the record's item id."""
    if index >= len(rows):
        raise AnalysisInputError(
            f"The record of item {item_id!r} in {path} is row {index}, but the dataset has {len(rows)} rows. Give the "
            "dataset (and split) the evaluation ran on."
        )
    row = rows[index]
    expected_id = item_id_of(row, index, id_column)
    if expected_id != item_id and id_column is None and "id" in row and str(row["id"]) == item_id:
        expected_id = item_id  # evaluated with --id-column id
    if expected_id != item_id:
        raise AnalysisInputError(
            f"The record of item {item_id!r} in {path} is row {index}, whose item id here is {expected_id!r}. Give the "
            "dataset the evaluation ran on, and --id-column if it used one."
        )
    return row


class _RecordedCompletion(NamedTuple):
    ids: list[int]
    source: str  # "records:ids" or "records:retokenized" (see `AnalysisItem.completion_source`)
    length_differs: bool  # re-tokenised to another length than the recorded token count


def _recorded_completion(outcome, tokenizer, end_id: int | None) -> _RecordedCompletion:
    """A record view's completion ids: stored in `extra["completion_ids"]`, else re-tokenised from its text."""
    ids = outcome.extra.get("completion_ids") if isinstance(outcome.extra, Mapping) else None
    if isinstance(ids, list) and all(isinstance(t, int) for t in ids):
        return _RecordedCompletion(list(ids), "records:ids", False)
    ids = tokenizer(outcome.completion, add_special_tokens=False)["input_ids"]
    if not outcome.truncated and end_id is not None:
        ids = ids + [end_id]
    return _RecordedCompletion(list(ids), "records:retokenized", len(ids) != outcome.num_tokens)


def _check_record_prompt(record, prompt: PromptItem, path: str) -> None:
    """The prompt rendered here must be the one the evaluation rendered (context hash, token counts of both views)."""
    meta = record.meta
    fix = (
        "Give the dataset, split, prompt column, context (text/file/column, placement, template, separator), chat "
        "template options and model (tokenizer) that the evaluation used."
    )
    if meta.get("context_sha256") not in (None, prompt.context_sha256):
        raise AnalysisInputError(
            f"Item {prompt.item_id!r} of {path}: its context differs from the one the evaluation used. {fix}"
        )
    for view, ids in (("x", prompt.prompt_ids_x), ("xc", prompt.prompt_ids_xc)):
        recorded = meta.get(f"prompt_tokens_{view}")
        if recorded is not None and recorded != len(ids):
            raise AnalysisInputError(
                f"Item {prompt.item_id!r} of {path}: the {view} prompt renders to {len(ids)} tokens here but had "
                f"{recorded} in the evaluation. {fix}"
            )


def sample_items(
    model,
    tokenizer,
    prompts: Sequence[PromptItem],
    settings,
    *,
    progress: bool = False,
    desc: str = "sampling",
) -> list[AnalysisItem]:
    """One completion per prompt, sampled from `model` WITHOUT the context (as training samples), with the paired
    evaluation's sampler (`trl_nca.core.sampling`: per-item seeds, independent of the batch)."""
    backend = HFBackend(model, tokenizer)
    was_training = model.training
    model.eval()
    items = []
    try:
        with progress_bar(len(prompts), desc, "item", progress) as bar:
            for start in range(0, len(prompts), settings.batch_size):
                chunk = prompts[start : start + settings.batch_size]
                seeds = [item_seed(settings.seed, p.item_id) for p in chunk]
                outputs = backend.generate([p.prompt_ids_x for p in chunk], seeds, settings)
                for prompt, out in zip(chunk, outputs):
                    items.append(
                        AnalysisItem(prompt.item_id, prompt.prompt_ids_x, prompt.prompt_ids_xc, list(out.token_ids))
                    )
                bar.update(len(chunk))
    finally:
        model.train(was_training)
    return items
