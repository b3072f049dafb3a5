"""trl-nca: on-policy context distillation with No-Context Anchoring, as a Hugging Face TRL extension."""

import os


os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # NCATrainer builds on trl.experimental.gkd on purpose

__version__ = "0.1.0"

from .config import NCAConfig  # noqa: E402
from .losses import DivergenceSpec, token_divergences  # noqa: E402
from .trainer import NCATrainer  # noqa: E402
from .views import ContextSpec  # noqa: E402


__all__ = ["NCAConfig", "NCATrainer", "ContextSpec", "DivergenceSpec", "token_divergences", "__version__"]
