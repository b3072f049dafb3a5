"""trl-nca: on-policy context distillation with No-Context Anchoring, as a Hugging Face TRL extension."""

__version__ = "0.1.0"

import importlib


# name -> the module that defines it, imported on first use: `import trl_nca` (and so `trl-nca --help`) imports no
# torch, Transformers or TRL
_NAMES = {
    "NCAConfig": ".trainers.nca_config",
    "NCATrainer": ".trainers.nca_trainer",
    "NCADistillationConfig": ".trainers.nca_distillation_config",
    "NCADistillationTrainer": ".trainers.nca_distillation_trainer",
    "ContextSpec": ".core.views",
    "DivergenceSpec": ".core.losses",
    "token_divergences": ".core.losses",
}


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_NAMES[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_NAMES])


__all__ = [
    "NCAConfig",
    "NCATrainer",
    "NCADistillationConfig",
    "NCADistillationTrainer",
    "ContextSpec",
    "DivergenceSpec",
    "token_divergences",
    "__version__",
]
