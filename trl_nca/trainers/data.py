"""Dataset checks, tokenisation of both views, and the collator.

Every example becomes three token lists: the no-context prompt, the context prompt, and (when the dataset has one)
the reference completion used by off-policy steps. Length limits are checked here, once, with errors that name the
row and the sizes; nothing is truncated unless the user opted in to shortening the context itself.

`max_length` keeps GKD's meaning but not its truncation: GKD's collator drops the oldest tokens of dataset conversations
longer than `max_length` (it never limits sampling); here such rows are kept whole, with one warning that counts them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from datasets import Dataset

from ..core.checks import is_int
from ..core.views import (
    ContextSpec,
    add_context,
    check_text_sizes,
    left_pad,
    missing_column_message,
    render_completion_ids,
    render_prompt_ids,
    right_pad,
    split_example,
    text_bytes,
)
from .batch import VIEW_KEYS


logger = logging.getLogger(__name__)
TOKEN_COLUMNS = ("prompt_ids", "context_prompt_ids", "completion_ids")


@dataclass(frozen=True)
class Limits:
    """Token budgets. `max_context_length` bounds both views (an error, or a shortened context if
    `truncate_context`); `max_length` is GKD's cut of dataset conversations, which NCA reports but never applies."""

    max_new_tokens: int
    max_length: int | None = None
    max_context_length: int | None = None
    truncate_context: bool = False


def check_tokenizer(tokenizer) -> None:
    """Fail early, with the fix, on tokenizers that cannot build the two views."""
    if tokenizer is None:
        raise ValueError("NCATrainer needs a tokenizer as `processing_class` (or a model path to load one from).")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "The tokenizer has no chat template, so prompts with and without context cannot be rendered as chats. "
            "Set `tokenizer.chat_template` (e.g. copy it from the model's instruct version) before creating the trainer."
        )
    if tokenizer.pad_token_id is None:
        raise ValueError(
            "The tokenizer has neither a pad token nor an end-of-sequence token to pad with. Set one, e.g. "
            "`tokenizer.pad_token = tokenizer.eos_token` (supported: padding is tracked by masks, never by token id)."
        )


def check_columns(column_names: Sequence[str], spec: ContextSpec, split: str) -> None:
    """The dataset must hold a prompt (`messages` or `prompt`) and, unless a fixed context is given, the context."""
    if "messages" not in column_names and "prompt" not in column_names:
        raise ValueError(
            f"The {split} dataset has neither a `messages` nor a `prompt` column; its columns are "
            f"{sorted(column_names)}. Rename the prompt column to `prompt` (a string or a list of chat messages)."
        )
    if spec.text is None and spec.column not in column_names:
        raise ValueError(missing_column_message(spec.column, column_names, what="context"))


def tokenize_example(
    example: Mapping[str, Any], index: int | None, tokenizer, spec: ContextSpec, limits: Limits
) -> dict[str, list[int]]:
    """Token ids of the no-context prompt, the context prompt and the reference completion (possibly empty)."""
    where = f"row {index}" if index is not None else "an example"
    prompt, completion = split_example(example, where)
    context = spec.context_of(example, index)
    prompt_ids = render_prompt_ids(tokenizer, prompt)
    completion_ids = render_completion_ids(tokenizer, prompt, completion) if completion else []
    context_prompt_ids = render_prompt_ids(tokenizer, add_context(prompt, context, spec))
    fix = "Shorten the context, lower `max_new_tokens`, or set `truncate_context=True` to cut the context itself."
    if not _check_lengths(prompt_ids, context_prompt_ids, completion_ids, limits, where, fix):
        budget = limits.max_context_length - max(limits.max_new_tokens, len(completion_ids))
        context_prompt_ids = _truncate_context(tokenizer, prompt, context, spec, budget, where)
    return {"prompt_ids": prompt_ids, "context_prompt_ids": context_prompt_ids, "completion_ids": completion_ids}


def check_prompt_sizes(dataset, spec: ContextSpec, tokenizer, limits: Limits, limit_name: str, split: str) -> None:
    """Every row's prompts against `limits.max_context_length` before any model loads (`trl-nca train`), without
    tokenising the rows whose text cannot exceed it. A row whose text alone proves it too long is refused untokenised
    (`check_text_sizes`, as in `trl-nca eval`: a 20 MB row in a second); a row whose text could make it too long is
    tokenised as the trainer will (`tokenize_example`), so its error comes now, not after the model loaded; the others
    are left to the trainer (a token holds at least one byte, so a view has at most its text's bytes in tokens, plus
    the chat template's own tokens for its roles and one more per message). `limit_name` names the limit in the
    message. Pre-tokenised and iterable datasets are left to `prepare_dataset`."""
    limit = limits.max_context_length
    column_names = getattr(dataset, "column_names", None) or []
    if limit is None or all(c in column_names for c in TOKEN_COLUMNS) or not hasattr(dataset, "__len__"):
        return
    check_examples(dataset, spec, split)  # the rows' own problems first, each with its message
    views, sizes = [], []
    for index, example in enumerate(dataset):
        where = f"row {index} of the {split} dataset"
        prompt, completion = split_example(example, where)
        with_context = add_context(prompt, spec.context_of(example, index), spec)
        completion_bytes = text_bytes(completion or [])
        views.append((index, example, prompt, with_context, completion_bytes))
        label = f"Row {index} of the {split} dataset"
        sizes.append(
            (label, text_bytes(prompt))
            if limits.truncate_context
            else (label, text_bytes(prompt), text_bytes(with_context))
        )
    check_text_sizes(sizes, tokenizer, limit, limits.max_new_tokens, "max_new_tokens", limit_name)
    template_tokens: dict[tuple[str, ...], int] = {}

    def most_tokens(messages) -> int:
        roles = tuple(m["role"] for m in messages)
        if roles not in template_tokens:
            template_tokens[roles] = len(render_prompt_ids(tokenizer, [dict(m, content="") for m in messages]))
        return text_bytes(messages) + template_tokens[roles] + len(messages)

    for index, example, prompt, with_context, completion_bytes in views:
        completion_budget = max(limits.max_new_tokens, completion_bytes + 8)
        if max(most_tokens(prompt), most_tokens(with_context)) + completion_budget > limit:
            tokenize_example(example, index, tokenizer, spec, limits)


def _check_lengths(prompt_ids, context_prompt_ids, completion_ids, limits: Limits, where: str, fix: str) -> bool:
    """Check the token budgets of one row; False when only the context is too long and may be truncated."""
    completion_budget = max(limits.max_new_tokens, len(completion_ids))
    limit = limits.max_context_length
    if limit is not None and len(prompt_ids) + completion_budget > limit:
        raise ValueError(
            f"In {where}, the prompt without context has {len(prompt_ids)} tokens; with up to {completion_budget} "
            f"completion tokens that exceeds max_context_length={limit} (by default the models' position limit). "
            "Lower `max_new_tokens` or drop the row; prompts are never truncated."
        )
    if limit is not None and len(context_prompt_ids) + completion_budget > limit:
        if limits.truncate_context:
            return False
        raise ValueError(
            f"In {where}, the context view is too long: {len(prompt_ids)} prompt tokens + "
            f"{len(context_prompt_ids) - len(prompt_ids)} context tokens + {completion_budget} completion tokens "
            f"= {len(context_prompt_ids) + completion_budget} > max_context_length={limit}. {fix}"
        )
    return True


def check_token_row(example: Mapping[str, Any], index: int | None, vocab_size: int, limits: Limits, split: str):
    """Validate a row that arrives already tokenised (the three token columns), as `tokenize_example` validates text.

    The ids must be integers of the tokenizer, both prompts non-empty, the context prompt different from the plain
    prompt (else the row would distil x into x), and the lengths within the same budgets. Such a row cannot be
    re-rendered, so an over-long context view is an error even with `truncate_context=True`.
    """
    where = f"row {index} of the {split} dataset" if index is not None else f"an example of the {split} dataset"
    for column in TOKEN_COLUMNS:
        ids = example[column]
        if not isinstance(ids, Sequence) or isinstance(ids, str) or not all(is_int(t) for t in ids):
            raise TypeError(f"In {where}, `{column}` must be a list of token ids, got {_describe(ids)}.")
        bad = [int(t) for t in ids if not 0 <= int(t) < vocab_size]
        if bad:
            raise ValueError(
                f"In {where}, `{column}` holds ids outside the tokenizer's range [0, {vocab_size}): {bad[:5]}. "
                "Tokenise the dataset with the trainer's tokenizer (or drop the token columns to let NCATrainer do it)."
            )
    for column in ("prompt_ids", "context_prompt_ids"):
        if len(example[column]) == 0:
            raise ValueError(f"In {where}, `{column}` is empty; every row needs a prompt to sample from.")
    if list(example["context_prompt_ids"]) == list(example["prompt_ids"]):
        raise ValueError(
            f"In {where}, `context_prompt_ids` equals `prompt_ids`: the row has no context, so it would train the "
            "student on x -> x distillation. Put the context into `context_prompt_ids`, or drop such rows."
        )
    fix = (
        "Pre-tokenised rows cannot be re-rendered, so `truncate_context` does not apply: shorten the context before "
        "tokenising, lower `max_new_tokens`, or drop the token columns and let NCATrainer tokenise the text."
    )
    limits = replace(limits, truncate_context=False)
    _check_lengths(example["prompt_ids"], example["context_prompt_ids"], example["completion_ids"], limits, where, fix)


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _truncate_context(tokenizer, prompt, context: str, spec: ContextSpec, budget: int, where: str) -> list[int]:
    """Drop tokens from the end of the context until the context prompt fits in `budget` tokens."""
    context_ids = tokenizer(context, add_special_tokens=False)["input_ids"]
    keep = len(context_ids)
    while keep > 0:
        ids = render_prompt_ids(tokenizer, add_context(prompt, tokenizer.decode(context_ids[:keep]), spec))
        if len(ids) <= budget:
            logger.warning(
                "Truncated the context of %s from %d to %d tokens to fit max_context_length.",
                where,
                len(context_ids),
                keep,
            )
            return ids
        keep -= max(1, len(ids) - budget)
    raise ValueError(
        f"In {where}, even without its context the prompt does not fit the context-view budget of {budget} tokens. "
        "Raise `max_context_length` or lower `max_new_tokens`."
    )


def prepare_dataset(dataset, tokenizer, spec: ContextSpec, limits: Limits, split: str, num_proc: int | None = None):
    """Add the token columns to a `datasets` dataset, validating every row (errors name the row)."""
    if dataset is None:
        return None
    column_names = dataset.column_names
    if column_names is not None:
        if all(c in column_names for c in TOKEN_COLUMNS):
            return _validated_token_dataset(dataset, len(tokenizer), limits, split)
        check_columns(column_names, spec, split)
    map_kwargs = {}
    if isinstance(dataset, Dataset):
        map_kwargs = {"num_proc": num_proc, "desc": f"Tokenizing {split} prompts with and without context"}
    dataset = dataset.map(
        tokenize_example,
        with_indices=True,
        fn_kwargs={"tokenizer": tokenizer, "spec": spec, "limits": limits},
        **map_kwargs,
    )
    warn_beyond_max_length(dataset, limits.max_length, split)
    return dataset


def named_datasets(train_dataset, eval_dataset):
    """(split name, dataset) pairs of the datasets given, for the checks that name the split."""
    pairs = [("train", train_dataset)]
    if isinstance(eval_dataset, dict):
        pairs += [(f"eval {name!r}", ds) for name, ds in eval_dataset.items()]
    else:
        pairs.append(("eval", eval_dataset))
    return [(split, ds) for split, ds in pairs if ds is not None]


def prepare_splits(prepare: Callable[[Any, str], Any], train_dataset, eval_dataset):
    """The train dataset and the eval dataset (or each of a dict of them) through `prepare(dataset, split)`, a
    trainer's tokenisation of one split into both views; a split that is None stays None."""
    if train_dataset is not None:
        train_dataset = prepare(train_dataset, "train")
    if isinstance(eval_dataset, dict):
        eval_dataset = {name: prepare(dataset, f"eval {name}") for name, dataset in eval_dataset.items()}
    elif eval_dataset is not None:
        eval_dataset = prepare(eval_dataset, "eval")
    return train_dataset, eval_dataset


def prepared_eval_dataset(prepare: Callable[[Any, str], Any], eval_dataset, spec: ContextSpec):
    """A dataset (or a dict of them) given to a trainer's `evaluate`, checked (`check_examples`) and tokenised into
    both views as the datasets given at init are (`prepare_splits`)."""
    for split, dataset in named_datasets(None, eval_dataset):
        check_examples(dataset, spec, split)
    return prepare_splits(prepare, None, eval_dataset)[1]


def warn_beyond_max_length(dataset, max_length: int | None, split: str) -> int:
    """Count the rows whose prompt plus reference completion exceed `max_length` and warn once (returns the count).

    GKDTrainer's collator would drop the oldest tokens of such rows; NCATrainer keeps them whole, since both views
    need the same whole prompt and completion (see `NCAConfig`). Sampling is never limited by `max_length`.
    """
    if max_length is None or not isinstance(dataset, Dataset):
        return 0
    over = []
    for index, row in enumerate(dataset.select_columns(["prompt_ids", "completion_ids"])):
        length = len(row["prompt_ids"]) + len(row["completion_ids"])
        if length > max_length:
            over.append((index, length))
    if over:
        index, length = over[0]
        logger.warning(
            "%d rows of the %s dataset have a prompt plus reference completion longer than max_length=%d (first: row "
            "%d, %d tokens). GKDTrainer would drop their oldest tokens; NCATrainer keeps prompts and completions "
            "whole, so these rows are trained at full length (set max_length=None to silence this warning; "
            "max_context_length bounds every sequence).",
            len(over),
            split,
            max_length,
            index,
            length,
        )
    return len(over)


def _validated_token_dataset(dataset, vocab_size: int, limits: Limits, split: str):
    """A dataset that already has the token columns, every row checked (lazily, row by row, for a streamed one)."""
    kwargs = {"vocab_size": vocab_size, "limits": limits, "split": split}
    if isinstance(dataset, Dataset):
        for index, row in enumerate(dataset.select_columns(list(TOKEN_COLUMNS))):
            check_token_row(row, index, **kwargs)
        warn_beyond_max_length(dataset, limits.max_length, split)
        return dataset

    def checked(example, index):
        check_token_row(example, index, **kwargs)
        return example

    return dataset.map(checked, with_indices=True)


# The keys of the collator's batches: both views (`trl_nca.trainers.batch.VIEW_KEYS`), then its own.
BATCH_KEYS = (*VIEW_KEYS, "has_reference")


def check_collator(collator, example: Mapping[str, Any], split: str) -> None:
    """Probe a user's data collator on one prepared example: its batch must hold NCA's keys (`BATCH_KEYS`)."""
    how = (
        f"NCATrainer's batches need the keys {list(BATCH_KEYS)}: left-padded prompts of both views with their "
        "attention masks, right-padded reference completions with their mask, and a boolean `has_reference` per row. "
        "Use the default collator (data_collator=None, `trl_nca.trainers.data.NCACollator`) or one that extends it."
    )
    try:
        batch = collator([dict(example)])
    except Exception as error:
        raise ValueError(
            f"The data_collator failed on the first {split} example ({type(error).__name__}: {error}). {how}"
        ) from error
    missing = [key for key in BATCH_KEYS if key not in batch]
    if missing:
        raise ValueError(f"The data_collator's batch lacks {missing} (it has {sorted(batch)}). {how}")


@dataclass
class NCACollator:
    """Pads the three token columns: prompts to the left (both views), reference completions to the right."""

    pad_token_id: int

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return self.pad(examples)

    def pad(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Pad rows that already hold the three token columns."""
        missing = [c for c in TOKEN_COLUMNS if c not in examples[0]]
        if missing:
            raise KeyError(
                f"The batch lacks {missing}: pass datasets through NCATrainer (which tokenises them) or "
                "`trl_nca.trainers.data.prepare_dataset`."
            )
        prompts, prompt_mask = left_pad([e["prompt_ids"] for e in examples], self.pad_token_id)
        context_prompts, context_mask = left_pad([e["context_prompt_ids"] for e in examples], self.pad_token_id)
        completion_ids, completion_mask = right_pad([e["completion_ids"] for e in examples], self.pad_token_id)
        return {
            "prompts": prompts,
            "prompt_attention_mask": prompt_mask,
            "context_prompts": context_prompts,
            "context_prompt_attention_mask": context_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "has_reference": torch.tensor([len(e["completion_ids"]) > 0 for e in examples]),
        }


def check_examples(dataset, spec: ContextSpec, split: str) -> None:
    """Fail on an empty dataset and on malformed rows (prompt type, chat messages, context) before any model work.

    Cheap (no tokenisation); pre-tokenised datasets and datasets without a length (iterable) are left to
    `prepare_dataset`.
    """
    if isinstance(dataset, Mapping):  # e.g. a DatasetDict from load_dataset without `split=`
        raise TypeError(
            f"The {split} dataset is a {type(dataset).__name__} with splits {sorted(dataset)}; pass one split, e.g. "
            f"dataset[{next(iter(dataset), 'train')!r}] (or load_dataset(..., split='train'))."
        )
    if isinstance(dataset, (list, tuple)):
        raise TypeError(
            f"The {split} dataset is a Python {type(dataset).__name__}; pass a datasets.Dataset, e.g. "
            "datasets.Dataset.from_list(rows)."
        )
    column_names = getattr(dataset, "column_names", None)
    if column_names is not None and all(c in column_names for c in TOKEN_COLUMNS):
        return
    try:
        size = len(dataset)
    except TypeError:
        return
    if size == 0:
        raise ValueError(
            f"The {split} dataset is empty (0 rows). Check the file, the split name and any row limit "
            "(e.g. max_train_samples)."
        )
    if column_names is not None:
        check_columns(column_names, spec, split)
        if isinstance(dataset, Dataset):  # read only the columns checked here
            wanted = ("messages", "prompt", "completion", spec.column if spec.text is None else None)
            dataset = dataset.select_columns([c for c in column_names if c in wanted])
    for index, example in enumerate(dataset):
        try:
            split_example(example, where=f"row {index} of the {split} dataset")
        except KeyError as error:  # a missing or empty prompt is bad input, reported like every other row problem
            raise ValueError(error.args[0] if error.args else str(error)) from None
        spec.context_of(example, index)
