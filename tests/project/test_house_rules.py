"""The house rule on imports (the layers between modules are import-linter's: `test_architecture.py`): imports sit at the
top of the module, unless a heavy or optional library or a measured start-up cost keeps them inside a function. A
function-level import is allowed only

- of a library in `HEAVY_OR_OPTIONAL` (loaded on use: a module that does not load the library at its own top keeps
  the import where it is used; `--help` and the light modules import none of them);
- anywhere in a module of the command line's start-up path (`STARTUP`), whose lazy imports keep `trl-nca --help` and
  each command's `--help` under a second (`tests/cli/test_help.py`);
- as one of the few relative imports named in `KEPT`, each with its reason.

Every other function-level import (the standard library, the package's own modules) belongs at the module's top."""

import ast
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]

# Imported inside functions where the module does not load them at its top (measured with
# `python -X importtime -c "import trl_nca.<module>"`): each costs from a tenth of a second (yaml is not here: it
# is cheap) to several seconds (torch, transformers, TRL), or is an extra that may not be installed.
HEAVY_OR_OPTIONAL = {
    # the model stack, seconds each: loaded only by the modules that train, evaluate or build models
    "torch",
    "transformers",
    "datasets",
    "trl",
    "peft",
    "safetensors",
    "tokenizers",
    "huggingface_hub",
    "tqdm",  # trl_nca.console draws bars on use; the console is on the `--help` path
    # optional extras, absent from a plain install (pyproject.toml's extras)
    "vllm",
    "deepspeed",
    "lm_eval",
    "matplotlib",
    "requests",  # with urllib3: the served teacher's HTTP client only
    "urllib3",
    "pytest",  # trl_nca.testing's `approx`: a dev dependency
    "fcntl",  # POSIX only: trl_nca.inputs stays importable where it does not exist
}

# `trl-nca --help` and `trl-nca COMMAND --help` import these and nothing heavy; what they need only when a command
# runs (or the help spec is rewritten) is imported there: `dataclasses` in cli.help costs 13-50 ms, the command
# modules seconds
STARTUP = {
    "trl_nca/console.py",
    "trl_nca/cli/__init__.py",
    "trl_nca/cli/help.py",
}

# (module, imported module): relative imports kept inside a function, and why
KEPT = {
    # TRL and datasets are not loaded by cli.train_command, which every command imports (cli._run), nor by the
    # recipes (imported by it, and by the documentation build): the trainers' configs and data load them on use
    ("trl_nca/cli/train_command.py", "trl_nca.trainers.nca_config"),
    ("trl_nca/cli/train_command.py", "trl_nca.trainers.nca_trainer"),
    ("trl_nca/cli/train_command.py", "trl_nca.trainers.data"),
    ("trl_nca/recipes/budgets.py", "trl_nca.trainers.data"),
    ("trl_nca/recipes/compare_plan.py", "trl_nca.trainers.nca_config"),
    ("trl_nca/recipes/compare_students.py", "trl_nca.trainers.nca_trainer"),
    ("trl_nca/recipes/identity.py", "trl_nca.trainers.nca_config"),
    ("trl_nca/recipes/identity.py", "trl_nca.trainers.nca_distillation_config"),
    # read at call time: tests replace the organism's `spec_for_alias`, `organism_model_path` and `pretrain`
    ("trl_nca/recipes/compare_plan.py", "trl_nca.models.organism"),
    ("trl_nca/recipes/compare_report.py", "trl_nca.models.organism"),
    # trl_nca.models and trl_nca.testing import no torch (0.1 s); the views and the sampler load it
    ("trl_nca/models/organism.py", "trl_nca.core.views"),
    ("trl_nca/testing.py", "trl_nca.core.views"),
    ("trl_nca/testing.py", "trl_nca.core.sampling"),
    # `trl_nca.eval.PairedEvalCallback`, loaded on first use (PEP 562): the callback loads PEFT and Trainer's modules
    ("trl_nca/eval/__init__.py", "trl_nca.eval.callback"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.Import | ast.ImportFrom, path: Path) -> list[str]:
    """The absolute names of what `node` imports (a relative `from . import x` names the submodule x)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not node.level:
        return [node.module]
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
    if node.module:
        return [base]
    return [f"{base}.{alias.name}" for alias in node.names]


def function_level_imports(root: Path = ROOT / "trl_nca") -> list[tuple[str, int, str]]:
    """(module path, line, imported name) of every import inside a function of the package."""
    found = []

    def visit(node, path: Path, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and inside:
                found.extend((path.relative_to(ROOT).as_posix(), child.lineno, n) for n in _imported(child, path))
            visit(child, path, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    for path in sorted(root.rglob("*.py")):
        visit(ast.parse(path.read_text(encoding="utf-8")), path, False)
    return found


def _allowed(module: str, name: str) -> bool:
    if name.split(".")[0] in HEAVY_OR_OPTIONAL or module in STARTUP:
        return True
    return any(module == kept and (name == target or name.startswith(target + ".")) for kept, target in KEPT)


def test_imports_sit_at_the_top_of_the_module():
    """A function-level import that no reason keeps inside is moved to the module's top."""
    stray = [
        f"{module}:{line}: {name}" for module, line, name in function_level_imports() if not _allowed(module, name)
    ]
    assert stray == [], "move these imports to the top of their modules (tests/project/test_house_rules.py):\n" + (
        "\n".join(stray)
    )


def test_the_allowances_are_used():
    """Each kept relative import and each start-up module still holds a function-level import: an allowance no
    longer needed is removed."""
    found = function_level_imports()
    unused = [
        (kept, target) for kept, target in KEPT if not any(m == kept and n.startswith(target) for m, _, n in found)
    ]
    unused += [module for module in STARTUP if not any(m == module for m, _, _ in found)]
    assert unused == [], unused
