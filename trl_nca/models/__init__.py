"""Where models come from: the one resolver of model names (`names`), the embedded SmolLM2-135M-Instruct and the model
organism (`organism`)."""

from .names import (
    CACHE_ENV_VAR,
    EMBEDDED_MODEL_ALIASES,
    EMBEDDED_MODEL_NAME,
    INSTALL_COMMAND,
    EmbeddedModelUnavailableError,
    ModelNotFoundError,
    default_cache_dir,
    embedded_model_path,
    locate_embedded_gguf,
    resolve_model_name_or_path,
)
from .organism import ORGANISM_ALIASES, organism_model_path


__all__ = [
    "CACHE_ENV_VAR",
    "EMBEDDED_MODEL_ALIASES",
    "EMBEDDED_MODEL_NAME",
    "INSTALL_COMMAND",
    "ORGANISM_ALIASES",
    "EmbeddedModelUnavailableError",
    "ModelNotFoundError",
    "default_cache_dir",
    "embedded_model_path",
    "locate_embedded_gguf",
    "organism_model_path",
    "resolve_model_name_or_path",
]
