"""Loading models, adapters and tokenizers for evaluation, with errors that name what was not found."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import EvalInputError


def load_model(
    model: str,
    adapter: str | None = None,
    *,
    dtype: str = "auto",
    device: str | None = None,
    trust_remote_code: bool = False,
):
    """Load a causal LM (and optional PEFT adapter) for evaluation, with a clear error when it cannot be found."""
    from transformers import AutoModelForCausalLM

    model = _resolve(model, "Model")
    try:
        loaded = AutoModelForCausalLM.from_pretrained(model, dtype=dtype, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:  # ValueError: an id the Hub client rejects as malformed
        raise EvalInputError(
            f"Model {model!r} not found: it is neither a local folder with a config.json nor a reachable Hub model "
            f"({error.__class__.__name__}: {str(error).splitlines()[0] if str(error) else ''})."
        ) from error
    if adapter is not None:
        if not Path(adapter).exists() and os.environ.get("HF_HUB_OFFLINE") == "1":
            raise EvalInputError(f"Adapter {adapter!r} not found (no such folder, and the Hub is offline).")
        from peft import PeftModel

        try:
            loaded = PeftModel.from_pretrained(loaded, adapter)
        except (OSError, ValueError) as error:
            raise EvalInputError(f"Adapter {adapter!r} could not be loaded: {error}") from error
    if device is not None:
        loaded = loaded.to(device)
    elif _cuda_available():
        loaded = loaded.to("cuda")
    loaded.eval()
    return loaded


def _resolve(name: str, what: str) -> str:
    """The resolver of every command (`trl_nca.models.resolve_model_name_or_path`: 'embedded', missing paths)."""
    from ..models import EmbeddedModelUnavailableError, ModelNotFoundError, resolve_model_name_or_path

    try:
        return resolve_model_name_or_path(name, what)
    except (ModelNotFoundError, EmbeddedModelUnavailableError) as error:
        raise EvalInputError(str(error)) from error


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def load_tokenizer(path: str, trust_remote_code: bool = False):
    """Load a tokenizer, with a clear error when it cannot be found."""
    from transformers import AutoTokenizer

    path = _resolve(path, "Tokenizer")
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise EvalInputError(
            f"Tokenizer {path!r} not found: {str(error).splitlines()[0] if str(error) else error}"
        ) from error
