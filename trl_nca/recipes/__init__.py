"""Recipes: end-to-end jobs built from the trainer, the tasks and the evaluation (the layer just below the CLI)."""

from .compare import (
    CompareArguments,
    CompareInputError,
    Method,
    aggregate,
    conclusion,
    execute,
    parse_method,
    plan_comparison,
    plan_from_config,
    run_comparison,
)


__all__ = [
    "CompareArguments",
    "CompareInputError",
    "Method",
    "aggregate",
    "conclusion",
    "execute",
    "parse_method",
    "plan_comparison",
    "plan_from_config",
    "run_comparison",
]
