"""Recipes: end-to-end jobs built from the trainer, the tasks and the evaluation (the layer just below the CLI)."""

from .compare import CompareArguments, Method, aggregate, conclusion, parse_method, run_comparison


__all__ = ["CompareArguments", "Method", "aggregate", "conclusion", "parse_method", "run_comparison"]
