"""The import contracts of pyproject.toml hold (import-linter): the layers of docs/design.md, imports pointing from the
command line down to the core and never back (lazy imports inside functions included), and no import cycle between
sibling modules at any depth."""

import ast
from pathlib import Path

import pytest

import trl_nca


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # import-linter runs in a process of its own
def test_import_contracts_hold():
    """Run in a subprocess: import-linter's command configures logging (dictConfig), which would disable the loggers
    of this test session."""
    import os
    import subprocess
    import sys

    import importlinter  # noqa: F401  (a dev dependency: pyproject.toml)

    assert Path(trl_nca.__file__).resolve().is_relative_to(ROOT), "checking another copy of trl_nca than this one"
    code = (
        "import sys\n"
        "from importlinter.cli import lint_imports\n"
        f"sys.exit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, no_cache=True, no_logo=True))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "Contracts: 5 kept, 0 broken." in result.stdout


@pytest.mark.slow  # a fresh interpreter
def test_importing_trl_nca_changes_nothing_process_wide():
    """No environment variable is set and no warning filter is left behind by `import trl_nca`; TRL's notice about
    `trl.experimental` is silenced only around our own import of GKD."""
    import os
    import subprocess
    import sys

    # transformers' modeling module imports torch._dynamo, which sets TORCHINDUCTOR_CACHE_DIR: imported first, so that
    # the comparison sees what importing trl_nca adds, whatever this worker had imported before (trl_nca imports lazily)
    code = (
        "import os, warnings\n"
        "import transformers.modeling_utils\n"
        "before, filters = dict(os.environ), list(warnings.filters)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import trl_nca, trl_nca.trainers.nca_trainer\n"
        "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())\n"
        "assert list(warnings.filters) == filters\n"
        "print(sorted({type(w.message).__name__ for w in caught}))\n"
    )
    # A fresh environment: this process imported trl_nca already, so whatever that set would be inherited and unseen
    kept = ("PATH", "HOME", "PYTHONPATH", "OMP_NUM_THREADS", "HF_HUB_OFFLINE", "HF_HUB_DISABLE_TELEMETRY", "HF_HOME")
    env = {k: os.environ[k] for k in kept if k in os.environ}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "TRLExperimentalWarning" not in result.stdout


def test_no_function_over_60_lines_and_no_module_over_700():
    """The house rules: no function over 60 lines, no module over 700, in every module of trl_nca."""
    over = set()
    for path in sorted((ROOT / "trl_nca").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > 700:
            over.add(name)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
                over.add(f"{name}:{node.name}")
    assert over == set(), "split these: a function has at most 60 lines, a module at most 700"
