"""Documentation that is derived from the code stays in step with it: the configuration field reference, the
NCAConfig docstring and the layer contract shown in docs/design.md."""

import importlib.util
import re
from pathlib import Path

import pytest

from trl_nca import NCAConfig, NCADistillationConfig


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


@pytest.mark.parametrize("config_class", [NCAConfig, NCADistillationConfig])
def test_every_nca_field_has_help_and_a_docstring_entry(config_class):
    """Both configs document every NCA field (declared once, in NCAFields) in their docstring and their `--help`, and
    the configuration page lists each of them."""
    from trl_nca.config import _nca_field_names

    names = _nca_field_names(config_class)
    assert len(names) == len(set(names)) > 20
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    for name in names:
        field = config_class.__dataclass_fields__[name]
        assert field.metadata.get("help"), name
        assert re.search(rf"^\s+{name} \(`", config_class.__doc__, re.M), (
            f"{config_class.__name__}'s docstring lacks {name}"
        )
        assert f"| `{name}` |" in page, name
    for name in NCAConfig.__annotations__:
        assert NCAConfig.__dataclass_fields__[name].metadata.get("help"), name


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
