"""Documentation that is derived from the code stays in step with it: the configuration field reference, the
NCAConfig docstring and the layer contract shown in docs/design.md."""

import dataclasses
import re
from pathlib import Path

import pytest

from trl_nca import NCAConfig, NCADistillationConfig
from trl_nca.testing import load_script


ROOT = Path(__file__).resolve().parents[2]


def _script():
    return load_script(ROOT / "scripts" / "config_reference.py")


def test_configuration_page_holds_the_generated_field_reference():
    script = _script()
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert script.render(page) == page, "docs/configuration.md is out of date: run python scripts/config_reference.py"
    for name in NCAConfig.__annotations__:
        assert f"| `{name}` |" in page


def _docstring_entries(doc: str) -> dict[str, str]:
    """The `name (type...): text` entries of a docstring's `Parameters:` blocks, their text with white space folded."""
    entry = re.compile(r"^    (\w+) \(.*\):\n((?:        .*(?:\n|$))+)", re.M)
    return {m.group(1): " ".join(m.group(2).split()) for m in entry.finditer(doc)}


@pytest.mark.parametrize("config_class", [NCAConfig, NCADistillationConfig])
def test_every_field_says_the_same_in_help_docstring_and_page(config_class, capsys):
    """Each field of ours is written once, in its `metadata["help"]`: `--help`, the class docstring (what `help()` and
    the API pages show) and docs/configuration.md carry that same text."""
    from trl import TrlParser

    from trl_nca.trainers.field_docs import changed_defaults, field_names

    names = field_names(config_class)
    changed = changed_defaults(config_class)
    declared = {n for k in config_class.__mro__ if k.__module__.startswith("trl_nca") for n in k.__annotations__}
    assert set(names) | set(changed) == declared & {f.name for f in dataclasses.fields(config_class)}
    assert len(names) == len(set(names)) > 20
    entries = _docstring_entries(config_class.__doc__)
    assert list(entries) == names + changed  # every field once, in documentation order
    with pytest.raises(SystemExit):
        TrlParser((config_class,)).parse_args(["--help"])
    cli_help = "".join(capsys.readouterr().out.split())  # argparse rewraps, breaking lines after hyphens too
    page = " ".join((ROOT / "docs" / "configuration.md").read_text(encoding="utf-8").replace("\\|", "|").split())
    for name in names + changed:
        text = " ".join(config_class.__dataclass_fields__[name].metadata["help"].split())
        assert entries[name].startswith(text), f"{config_class.__name__}'s docstring says otherwise of {name}"
        assert "".join(text.split()) in cli_help, f"--help says otherwise of {name}"
        assert f"`{name}` |" in page and text in page, f"docs/configuration.md says otherwise of {name}"


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


def test_documented_commands_name_configs_of_that_command():
    """Every `trl-nca compare --config X` and `trl-nca train --config X` in the README, the docs and the CLI's own
    help names a config (shipped name or path) whose keys are options of that command: `quickstart.yaml` is a train
    config, and `compare --config quickstart.yaml` would stop on its `dataset_name`."""
    import yaml
    from trl import ModelConfig

    from trl_nca.cli import TrainScriptArguments, with_builtin_config
    from trl_nca.recipes import CompareArguments

    options = {
        command: {f.name for t in (first, NCAConfig, ModelConfig) for f in dataclasses.fields(t)}
        for command, first in (("compare", CompareArguments), ("train", TrainScriptArguments))
    }
    sources = [ROOT / "README.md", ROOT / "trl_nca" / "cli" / "__init__.py", *sorted((ROOT / "docs").rglob("*.md"))]
    found = []
    for source in sources:
        for command, config in re.findall(r"trl-nca (compare|train) --config ([\w./-]+)", source.read_text()):
            path = Path(with_builtin_config(["--config", config])[1])
            path = path if path.is_absolute() else ROOT / path
            if "/" not in config and not path.exists():  # the user's own file of a tutorial (`my.yaml`, ...)
                continue
            keys = set(yaml.safe_load(path.read_text()))
            assert keys <= options[command], (
                f"{source.name}: `trl-nca {command} --config {config}`: {keys - options[command]}"
            )
            found.append((command, config))
    assert ("compare", "main_quick") in found and ("train", "quickstart") in found
