"""Deprecated: `trl_nca.objective` moved to `trl_nca.trainers.objective` (the step statistics to
`trl_nca.trainers.stats`, the checkpoints to `trl_nca.trainers.checkpoints`, the setup to `trl_nca.trainers.setup`).
Importing it warns (`trl_nca.core.deprecation`); it is removed in the next minor release."""

from .core.deprecation import moved_module, warn_renamed
from .trainers import checkpoints, objective, setup, stats


warn_renamed("The module trl_nca.objective", "trl_nca.trainers.objective", stacklevel=2)
__getattr__ = moved_module(__name__, objective, stats, checkpoints, setup)
