"""The error type of bad evaluation input."""


class EvalInputError(ValueError):
    """Bad evaluation input (missing column, unusable label, unreadable file, unknown model): the message names it."""
