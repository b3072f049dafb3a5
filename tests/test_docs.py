"""Documentation that is derived from the code stays in step with it: the configuration field reference, the
NCAConfig docstring and the layer contract shown in docs/design.md."""

import importlib.util
import re
from pathlib import Path

from trl_nca import NCAConfig


ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_page_holds_the_generated_field_reference():
    script = _script()
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert script.render(page) == page, "docs/configuration.md is out of date: run python scripts/config_reference.py"
    for name in NCAConfig.__annotations__:
        assert f"| `{name}` |" in page


def test_every_nca_field_has_help_and_a_docstring_entry():
    from trl.experimental.gkd import GKDConfig

    inherited = {f.name for f in GKDConfig.__dataclass_fields__.values()}
    for name, field in NCAConfig.__dataclass_fields__.items():
        if name in NCAConfig.__annotations__:
            assert field.metadata.get("help"), name
            if name not in inherited:
                assert re.search(rf"^\s+{name} \(`", NCAConfig.__doc__, re.M), f"NCAConfig's docstring lacks {name}"


def test_design_page_shows_the_layer_contract():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: import-linter depends on tomli there
        import tomli as tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    page = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    block = page.split("<!-- layers:", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    assert block.splitlines() == layers
