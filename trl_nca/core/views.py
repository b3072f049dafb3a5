"""Prompt construction for the two views and token alignment of a shared completion.

The no-context view is the prompt x as the dataset gives it; the context view is the same conversation with the
privileged context c placed either as a system message or inside the first user turn. A completion y is sampled once,
as token ids, and appended unchanged to both prompts: y is never re-tokenised, so position t of the completion is the
same token in every view.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch


Message = dict[str, str]
PLACEMENTS = ("system", "user")


@dataclass(frozen=True)
class ContextSpec:
    """Where the privileged context comes from and where it goes in the chat.

    `text` (one string for every example) wins over `column` (a per-example field). With `placement="system"` the
    context becomes the system message; an existing system message is kept after it, joined by `separator`. With
    `placement="user"` the first user message is rewritten through `template`, which must contain `{prompt}` and
    `{context}`.
    """

    column: str | None = "context"
    text: str | None = None
    placement: Literal["system", "user"] = "system"
    template: str = "{context}\n\n{prompt}"
    separator: str = "\n\n"

    def __post_init__(self):
        if self.placement not in PLACEMENTS:
            raise ValueError(f"context placement must be one of {PLACEMENTS}, got {self.placement!r}.")
        names = check_template(self.template)
        if self.placement == "user":
            missing = ["{" + p + "}" for p in TEMPLATE_FIELDS if p not in names]
            if missing:
                raise ValueError(
                    f"The context template {self.template!r} lacks {', '.join(missing)}. It must contain both "
                    "`{prompt}` and `{context}`, e.g. '{context}\\n\\n{prompt}'."
                )
        if self.text is None and not self.column:
            raise ValueError("Give the context either as a dataset column name or as one fixed string.")
        if self.text is not None:
            check_context(self.text, where="the fixed context string")

    def context_of(self, example: Mapping[str, Any], index: int | None = None) -> str:
        """The context string of one example, validated."""
        if self.text is not None:
            return self.text
        if self.column not in example:
            raise KeyError(missing_column_message(self.column, list(example.keys()), what="context"))
        where = f"row {index}" if index is not None else "an example"
        return check_context(example[self.column], where=f"{where} of column {self.column!r}")


TEMPLATE_FIELDS = ("prompt", "context")


def check_template(template: Any) -> set[str]:
    """A context template may only use the `{prompt}` and `{context}` placeholders (literal braces written doubled)."""
    if not isinstance(template, str):
        raise TypeError(f"The context template must be a string, got the {type(template).__name__} {template!r}.")
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as error:
        raise ValueError(
            f"The context template {template!r} is not a valid format string ({error}). Write literal braces as "
            "'{{' and '}}'; the placeholders are {prompt} and {context}."
        ) from None
    unknown = [name for name in names if name not in TEMPLATE_FIELDS]
    if unknown:
        shown = ", ".join("{" + name + "}" for name in dict.fromkeys(unknown))
        raise ValueError(
            f"The context template {template!r} has the unknown placeholder(s) {shown}; only {{prompt}} and "
            "{context} are filled in. Remove the others, or write literal braces as '{{' and '}}'."
        )
    return set(names)


def missing_column_message(column: str, available: Sequence[str], what: str) -> str:
    return (
        f"The dataset has no {what} column {column!r}; its columns are {sorted(available)}. Rename the column, or set "
        f"`context_column` to the right name, or give one fixed context with `context_text`."
    )


def check_context(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"The context in {where} is a {type(value).__name__}, expected a non-empty string.")
    if not value.strip():
        fix = "Give the context text" if where == "the fixed context string" else "Drop such rows"
        raise ValueError(f"The context in {where} is empty. {fix}, or the student would be distilled from x to x.")
    return value


def split_example(example: Mapping[str, Any], where: str = "an example") -> tuple[list[Message], list[Message] | None]:
    """Return (prompt messages, reference completion messages or None) for a `messages` or `prompt` example.

    `messages` ending with an assistant turn gives that turn as the reference completion (used by off-policy steps);
    `prompt` may be a string (one user turn) or a list of messages, with an optional `completion` column. The example is
    validated: messages must be dicts with string `role` and `content`, and the prompt must hold a user turn (the
    context view puts the context next to it, and a chat without one is almost always a data mistake, such as
    ShareGPT's `human`/`gpt` roles). Errors name the example by `where` (e.g. "row 3").
    """
    if "messages" in example and example["messages"] is not None:
        messages = check_messages(example["messages"], where, "messages")
        completion = None
        if messages and messages[-1]["role"] == "assistant":
            messages, completion = messages[:-1], [messages[-1]]
    elif "prompt" in example and example["prompt"] is not None:
        prompt = example["prompt"]
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError(f"In {where}, the prompt is an empty string. Drop the row or fill in its prompt.")
            messages = [{"role": "user", "content": prompt}]
        else:
            messages = check_messages(prompt, where, "prompt")
        completion = example.get("completion")
        if isinstance(completion, str):
            completion = [{"role": "assistant", "content": completion}]
        elif completion is not None:
            completion = check_messages(completion, where, "completion")
    else:
        raise KeyError(
            f"{where[:1].upper() + where[1:]} has neither a `messages` nor a `prompt` (its columns are "
            f"{sorted(example.keys())}, or they are empty). Use GKD's conversational `messages` format or a "
            "prompt-only `prompt` column."
        )
    if not any(m["role"] == "user" for m in messages):
        raise ValueError(
            f"In {where}, the prompt has no user turn (its roles are {[m['role'] for m in messages]}). Every prompt "
            "needs a {'role': 'user', 'content': ...} message; rename roles such as 'human' to 'user', or drop the row."
        )
    return messages, completion


def check_messages(value: Any, where: str, column: str) -> list[Message]:
    """A list of chat messages, each a dict with string `role` and `content`; errors name the example and message."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        kind = "a single message" if isinstance(value, Mapping) else f"the {type(value).__name__} {value!r:.60}"
        raise TypeError(
            f"In {where}, `{column}` must be a string or a list of chat messages ({{'role': ..., 'content': ...}}), "
            f"got {kind}."
        )
    messages = []
    for number, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise TypeError(
                f"In {where}, message {number} of `{column}` is the {type(message).__name__} {message!r:.60}, "
                "expected a dict with 'role' and 'content'."
            )
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                got = "missing or null" if message.get(key) is None else f"the {type(message[key]).__name__}"
                raise TypeError(
                    f"In {where}, message {number} of `{column}` has no string {key!r} ({got}). Chat messages need "
                    "'role' (system, user or assistant) and 'content' text."
                )
        messages.append(dict(message))
    return messages


def add_context(messages: Sequence[Message], context: str, spec: ContextSpec) -> list[Message]:
    """The context view of a prompt: a new list, the input is not modified."""
    messages = [dict(m) for m in messages]
    if spec.placement == "system":
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = context + spec.separator + messages[0]["content"]
        else:
            messages.insert(0, {"role": "system", "content": context})
        return messages
    for m in messages:
        if m["role"] == "user":
            m["content"] = spec.template.format(prompt=m["content"], context=context)
            return messages
    raise ValueError("The prompt has no user message to put the context into; use `context_placement='system'`.")


def text_bytes(messages: Sequence[Message]) -> int:
    """The UTF-8 bytes of the messages' text (their `content`), read without a tokenizer."""
    return sum(len(str(m.get("content", "")).encode("utf-8")) for m in messages)


def check_text_sizes(sizes, tokenizer, limit: int, budget: int, budget_name: str, limit_name: str, error=ValueError):
    """Refuse, before any prompt is tokenised, the first prompt whose text alone proves it too long: no token of
    `tokenizer` holds more than `most` UTF-8 bytes (the longest entry of its vocabulary), so a text of n bytes is at
    least n / most tokens (a normalizer that deletes text could make it fewer; none of the chat models' tokenizers
    deletes text). A 20 MB prompt is refused in a second instead of tokenised for minutes.

    `sizes`: (label, bytes without the context[, bytes with it]) per prompt (`text_bytes`); `limit_name`: what the
    `limit` is, e.g. "the 4096 positions of the model M (max_position_embeddings)". Used by `trl-nca eval` and
    `trl-nca train`."""
    if budget >= limit:  # no prompt fits: the budget is the mistake, whatever the rows hold
        raise error(f"{budget_name} {budget} leaves no room for a prompt in {limit_name}. Lower {budget_name}.")
    most = max((len(token.encode("utf-8")) for token in tokenizer.get_vocab()), default=1)
    for label, *views in sizes:
        for view, size in zip(("without", "with"), views):
            least = -(-size // most)
            if least + budget > limit:
                raise error(
                    f"{label}: its prompt {view} the context holds {size:,} bytes of text, so at least {least:,} "
                    f"tokens (no token of the tokenizer holds more than {most} bytes), which with {budget_name} "
                    f"{budget} exceeds {limit_name}. Shorten the prompt or the context, lower {budget_name}, or leave "
                    "such items out of the dataset; prompts are never truncated."
                )


def render_prompt_ids(tokenizer, messages: Sequence[Message], **template_kwargs) -> list[int]:
    """Token ids of a chat prompt ending with the generation prompt of the assistant turn."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "The tokenizer has no chat template. Set `tokenizer.chat_template` (for example to the template of the "
            "model's instruct version) before training, so prompts with and without context render as chats."
        )
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **template_kwargs)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def render_completion_ids(tokenizer, prompt: Sequence[Message], completion: Sequence[Message]) -> list[int]:
    """Token ids of a reference completion: the chat rendering of prompt + completion minus that of the prompt."""
    prompt_text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    full_text = tokenizer.apply_chat_template(list(prompt) + list(completion), tokenize=False)
    if not full_text.startswith(prompt_text):
        raise ValueError("The chat template renders the prompt differently inside the full conversation.")
    return tokenizer(full_text[len(prompt_text) :], add_special_tokens=False)["input_ids"]


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int, width: int | None = None):
    """Left-pad token lists into (ids, attention_mask) tensors."""
    width = max((len(s) for s in sequences), default=0) if width is None else width
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        if len(s):
            ids[i, width - len(s) :] = torch.as_tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def right_pad(sequences: Sequence[Sequence[int]], pad_id: int):
    """Right-pad token lists into (ids, mask) tensors; an empty batch of completions gives width 0."""
    width = max((len(s) for s in sequences), default=0)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        if len(s):
            ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
            mask[i, : len(s)] = 1
    return ids, mask


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that start at 0 on the first real token of each left-padded row."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


@dataclass
class View:
    """One view of a batch: `[left-padded prompt | right-padded completion]` minus the last completion column.

    The last completion token is never an input (nothing is predicted from it), so the hidden state at column
    `prompt_width - 1 + t` predicts completion token `t` for every t in `[0, C)`.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    prompt_width: int


def build_view(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor, completion_mask: torch.Tensor
) -> View:
    """Join a left-padded prompt block and the shared right-padded completion block into model inputs."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)[:, :-1]
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)[:, :-1]
    return View(input_ids, attention_mask, position_ids_from_mask(attention_mask), prompt_ids.shape[1])


def completion_hidden(hidden: torch.Tensor, view: View, completion_mask: torch.Tensor) -> torch.Tensor:
    """Hidden states that predict the valid completion tokens, flattened to (num_valid_tokens, hidden)."""
    start = view.prompt_width - 1
    width = completion_mask.shape[1]
    return hidden[:, start : start + width][completion_mask.bool()]


def completion_states(model, view: View, completion_mask: torch.Tensor) -> torch.Tensor:
    """The model's final hidden states that predict the valid completion tokens of `view`, as (num_valid_tokens,
    hidden), from its decoder stack (`model.get_decoder()`); the losses apply the LM head in tiles, so no
    (batch x sequence x vocabulary) logits are ever built."""
    output = model.get_decoder()(
        input_ids=view.input_ids,
        attention_mask=view.attention_mask,
        position_ids=view.position_ids,
        use_cache=False,
    )
    return completion_hidden(output[0], view, completion_mask)
