"""Deprecated: `trl_nca.config` moved to `trl_nca.trainers.nca_config` and `trl_nca.trainers.nca_distillation_config`
(the script options to `trl_nca.trainers.script_options`). Importing it warns (`trl_nca.core.deprecation`); it is
removed in the next minor release."""

from .core.deprecation import moved_module, warn_renamed
from .trainers import nca_config, nca_distillation_config, script_options


warn_renamed("The module trl_nca.config", "trl_nca.trainers.nca_config", stacklevel=2)
__getattr__ = moved_module(__name__, nca_config, nca_distillation_config, script_options)
