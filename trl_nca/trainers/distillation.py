"""Deprecated: `trl_nca.trainers.distillation` moved to `trl_nca.trainers.nca_distillation_trainer`, following TRL's file names. Importing it warns
(`trl_nca.core.deprecation`); it is removed in the next minor release."""

from ..core.deprecation import moved_module, warn_renamed
from . import nca_distillation_trainer


warn_renamed("The module trl_nca.trainers.distillation", "trl_nca.trainers.nca_distillation_trainer", stacklevel=2)
__getattr__ = moved_module(__name__, nca_distillation_trainer)
