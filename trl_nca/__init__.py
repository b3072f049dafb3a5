"""trl-nca: on-policy context distillation with No-Context Anchoring, as a Hugging Face TRL extension."""

__version__ = "0.1.0"

from .config import NCAConfig, NCADistillationConfig
from .distillation import NCADistillationTrainer
from .losses import DivergenceSpec, token_divergences
from .trainer import NCATrainer
from .views import ContextSpec


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
