"""Deprecated: `trl_nca.losses` moved to `trl_nca.core.losses`. Importing it warns
(`trl_nca.core.deprecation`); it is removed in the next minor release."""

from .core import losses
from .core.deprecation import moved_module, warn_renamed


warn_renamed("The module trl_nca.losses", "trl_nca.core.losses", stacklevel=2)
__getattr__ = moved_module(__name__, losses)
