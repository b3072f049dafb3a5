"""The wheel as `pip install trl-nca` gets it (no extras, no repository around it): it holds every shipped resource,
and the configs the CLI's help and the README name are reachable by name from it."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest


pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(out),
        str(ROOT),
    ]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    (path,) = out.glob("trl_nca-*.whl")
    return path


def test_the_wheel_holds_the_shipped_configs_and_resources(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = sorted(p.name for p in (ROOT / "trl_nca" / "resources" / "configs").glob("*.yaml"))
    assert {"main.yaml", "main_quick.yaml", "quickstart.yaml"} <= set(shipped)
    for name in shipped:
        assert f"trl_nca/resources/configs/{name}" in names
    for path in (ROOT / "trl_nca" / "resources" / "organisms").iterdir():
        assert f"trl_nca/resources/organisms/{path.name}" in names
    for link in (ROOT / "examples" / "configs").glob("*.yaml"):  # the repository's copies are these very files
        assert link.resolve() == (ROOT / "trl_nca" / "resources" / "configs" / link.name).resolve()


def test_configs_by_name_from_the_installed_wheel(wheel, tmp_path):
    """Installed into a folder of its own and run from a folder without `examples/`: `--config main_quick` and the
    other shipped names resolve inside the installed package and pass the config checks; a name that is neither a
    file nor shipped is refused with the list of names."""
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    code = f"""
import sys
from trl_nca.cli import CommandLineError, builtin_config_names, check_config_file, with_builtin_config
assert __import__("trl_nca").__file__.startswith({str(target)!r}), __import__("trl_nca").__file__
for name in builtin_config_names():
    argv = with_builtin_config(["--config", name])
    assert argv[1].startswith({str(target)!r}), argv
    check_config_file(argv)
try:
    check_config_file(with_builtin_config(["--config", "no_such_config"]))
except CommandLineError as error:
    assert "main_quick" in str(error), error
else:
    sys.exit("no error")
print(" ".join(builtin_config_names()))
"""
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert {"main", "main_quick", "quickstart"} <= set(result.stdout.split())


def test_the_wheel_holds_the_harness_task_and_lm_eval_is_an_extra(wheel):
    """The shipped lm-eval task (`trl-nca eval --tasks island_facts_mc`) is in the wheel; lm-eval is required only by
    the `harness` (and `dev`) extras, so the core install does not pull it."""
    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())
    for name in ("island_facts_mc.yaml", "island_facts_mc.jsonl", "utils.py"):
        assert f"trl_nca/resources/harness/{name}" in names
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist: lm")]
    assert requires and all('extra == "harness"' in line or 'extra == "dev"' in line for line in requires), requires
