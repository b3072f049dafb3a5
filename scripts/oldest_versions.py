"""Print the oldest versions of trl-nca's core dependencies that pyproject.toml allows, as pip requirements.

    python scripts/oldest_versions.py            # trl==1.16.0 transformers==5.17.0 peft==0.18.0 accelerate==1.15.0

`.ci/run` installs them into a separate venv and runs the fast tests there again, so every floor in pyproject.toml is
one that was tested. A floor `>=X.Y` becomes `==X.Y.0`.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement


PACKAGES = ("trl", "transformers", "peft", "accelerate")


def oldest(pyproject: Path) -> list[str]:
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    found = {}
    for text in dependencies:
        requirement = Requirement(text)
        if requirement.name not in PACKAGES:
            continue
        floors = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        if len(floors) != 1:
            raise SystemExit(f"{requirement.name}: expected one `>=` floor in pyproject.toml, got {text!r}")
        parts = floors[0].split(".")
        found[requirement.name] = ".".join(parts + ["0"] * (3 - len(parts)))
    missing = [name for name in PACKAGES if name not in found]
    if missing:
        raise SystemExit(f"pyproject.toml names no floor for {missing}")
    return [f"{name}=={found[name]}" for name in PACKAGES]


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[1]
    print(" ".join(oldest(Path(sys.argv[1]) if len(sys.argv) > 1 else root / "pyproject.toml")))
