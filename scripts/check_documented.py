"""Check that the shipped configs of the main job are read against their documented outcomes with the libraries
installed here: each config is planned (no model trained, nothing written but a lock in a temporary folder), and each
method but the baseline must match an experiment of `trl_nca/resources/documented_organisms.json`. A new release of
PEFT, TRL or transformers that changes what the settings look like makes this fail on the day it appears (`.ci/run`
runs it), not in a new user's hands. Versions that differ from the documented runs' are printed, not a failure.

    python scripts/check_documented.py                       # the README's main job and its quick variant
    python scripts/check_documented.py examples/configs/X.yaml ...
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
CONFIGS = (ROOT / "examples" / "configs" / "main.yaml", ROOT / "examples" / "configs" / "main_quick.yaml")


def reading(config: Path) -> str:
    """The documented experiment each method of `config` is read against (`outcomes.documented_for`)."""
    from trl_nca.recipes import plan_from_config
    from trl_nca.recipes.outcomes import documented_for, planned_summary

    with tempfile.TemporaryDirectory() as output:
        return documented_for(planned_summary(plan_from_config(config, output)))


def main(argv: list[str]) -> int:
    failed = False
    for config in [Path(a) for a in argv] or CONFIGS:
        text = reading(config)
        print(f"{config.name}:\n  " + text.replace("\n", "\n  "))
        failed = failed or "no documented outcome" in text
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
