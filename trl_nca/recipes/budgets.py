"""The token budgets of a comparison, checked before any work: every training prompt in both views with each method's
`max_new_tokens`, and every evaluated prompt with the evaluation's reply budget, must fit each model's positions.

`NCATrainer` checks the same budgets row by row (`trl_nca.trainers.data.tokenize_example`), but only when a student's
training starts, after the base models were evaluated; an unreachable setting (`max_new_tokens: 1000000000`) is
refused here instead, reading each model's config and tokenizer only (no weights).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from transformers import AutoConfig, AutoTokenizer

from ..inputs import InputError


def position_limit_of(model_path: str) -> int | None:
    """A model's `max_position_embeddings` (of its text config), read from its config alone."""
    config = AutoConfig.from_pretrained(model_path)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(config, "max_position_embeddings", None)
    return int(limit) if limit else None


def check_token_budgets(
    run_configs: Mapping[str, Any], train_rows: Sequence[Mapping[str, Any]], evaluator, model_paths: Mapping[Any, str]
) -> None:
    """Refuse, with one `InputError` naming the method or item, the row and the fix, a budget no model can hold.

    `run_configs` maps each method's name to the config its students train with (`recipes.compare.run_config`; an
    SDFT method's config has no NCA budgets and is skipped), `evaluator` is the comparison's `PairedEvaluator`."""
    from ..trainers.data import Limits, tokenize_example

    for model_path in dict.fromkeys(model_paths.values()):
        positions = position_limit_of(model_path)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        checked = set()
        for name, config in run_configs.items():
            if not hasattr(config, "context_spec"):
                continue
            limits = Limits(
                max_new_tokens=config.max_new_tokens,
                max_context_length=config.max_context_length or positions,
                truncate_context=config.truncate_context,
            )
            if (limits, config.context_spec) in checked:
                continue
            checked.add((limits, config.context_spec))
            for index, row in enumerate(train_rows):
                try:
                    tokenize_example(row, index, tokenizer, config.context_spec, limits)
                except ValueError as error:
                    raise InputError(f"Method {name!r} on the model {model_path}: {error}") from None
        budget = evaluator.generation.max_new_tokens
        if positions is None:
            continue
        for item in evaluator.items(tokenizer, cache=False):  # a tokenizer freed after the check
            for view, ids in (("without", item.prompt_ids_x), ("with", item.prompt_ids_xc)):
                if len(ids) + budget > positions:
                    raise InputError(
                        f"Evaluated item {item.item_id!r}: its prompt {view} the context has {len(ids)} tokens, which "
                        f"with a reply budget of {budget} tokens (eval_max_new_tokens, else max_new_tokens) exceeds "
                        f"the {positions} positions of the model {model_path}. Lower eval_max_new_tokens (or "
                        "max_new_tokens)."
                    )
