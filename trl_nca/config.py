"""Deprecated: `trl_nca.config` moved to `trl_nca.trainers.config` (the script options to `trl_nca.trainers.script_options`). Importing it warns
(`trl_nca.core.deprecation`); it is removed in the next minor release."""

from .core.deprecation import moved_module, warn_renamed
from .trainers import config, script_options


warn_renamed("The module trl_nca.config", "trl_nca.trainers.config", stacklevel=2)
__getattr__ = moved_module(__name__, config, script_options)
