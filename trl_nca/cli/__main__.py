"""`python -m trl_nca.cli ...` (and `accelerate launch -m trl_nca.cli ...`) runs `trl-nca ...`."""

import sys

from . import main


sys.exit(main())
