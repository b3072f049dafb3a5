"""trl-nca: on-policy context distillation with No-Context Anchoring, as a Hugging Face TRL extension."""

__version__ = "0.1.0"

from .core.losses import DivergenceSpec, token_divergences
from .core.views import ContextSpec
from .trainers.nca_config import NCAConfig
from .trainers.nca_distillation_config import NCADistillationConfig
from .trainers.nca_distillation_trainer import NCADistillationTrainer
from .trainers.nca_trainer import NCATrainer


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
