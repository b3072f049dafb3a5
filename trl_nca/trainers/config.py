"""Deprecated: `trl_nca.trainers.config` moved to `trl_nca.trainers.nca_config` (`NCAConfig`, `NCAFields`) and
`trl_nca.trainers.nca_distillation_config` (`NCADistillationConfig`), following TRL's file names. Importing it warns
(`trl_nca.core.deprecation`); it is removed in the next minor release."""

from ..core.deprecation import moved_module, warn_renamed
from . import nca_config, nca_distillation_config


warn_renamed("The module trl_nca.trainers.config", "trl_nca.trainers.nca_config", stacklevel=2)
__getattr__ = moved_module(__name__, nca_config, nca_distillation_config)
