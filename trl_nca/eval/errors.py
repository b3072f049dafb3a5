"""The error type of bad evaluation input: `trl_nca.inputs.InputError`, named for the evaluation."""

from ..inputs import InputError


EvalInputError = InputError  # bad evaluation input (missing column, unusable label, unreadable file, unknown model)

__all__ = ["EvalInputError"]
