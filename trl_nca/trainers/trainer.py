"""Deprecated: `trl_nca.trainers.trainer` moved to `trl_nca.trainers.nca_trainer`, following TRL's file names. Importing it warns
(`trl_nca.core.deprecation`); it is removed in the next minor release."""

from ..core.deprecation import moved_module, warn_renamed
from . import nca_trainer


warn_renamed("The module trl_nca.trainers.trainer", "trl_nca.trainers.nca_trainer", stacklevel=2)
__getattr__ = moved_module(__name__, nca_trainer)
