"""Rules the test suite keeps: every test that starts another process (a multi-process launch, a script or a fresh
interpreter run with `subprocess`, a `multiprocessing` child) is marked `slow`, so `pytest -m "not slow"` runs in
this process alone."""

import ast
from pathlib import Path


TESTS = Path(__file__).parents[1]  # tests/, whose folders mirror the package
PROCESS_MODULES = {"subprocess", "multiprocessing"}


def _marked_slow(node: ast.AST) -> bool:
    return any("mark.slow" in ast.unparse(d) for d in getattr(node, "decorator_list", []))


def _process_starters(tree: ast.Module) -> set[str]:
    """Module-level functions (tests, helpers, fixtures) that reach `subprocess` or `multiprocessing`, directly or
    through another such function they call or a fixture they take."""
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    used = {}
    for name, node in functions.items():
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        names |= {
            a.name.split(".")[0] for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names
        }
        names |= {n.module.split(".")[0] for n in ast.walk(node) if isinstance(n, ast.ImportFrom) and n.module}
        names |= {a.arg for a in node.args.args}
        used[name] = names
    starters = {name for name, names in used.items() if names & PROCESS_MODULES}
    while True:
        more = {name for name, names in used.items() if names & starters} - starters
        if not more:
            return starters
        starters |= more


def test_tests_that_start_processes_are_marked_slow():
    unmarked = []
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module_slow = any(
            isinstance(n, ast.Assign)
            and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
            and "mark.slow" in ast.unparse(n.value)
            for n in tree.body
        )
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and not module_slow:
                if node.name in _process_starters(tree) and not _marked_slow(node):
                    unmarked.append(f"{path.relative_to(TESTS)}::{node.name}")
    assert not unmarked, f"tests that start processes without @pytest.mark.slow: {unmarked}"


def test_the_rule_sees_a_process_started_through_a_helper_or_a_fixture():
    tree = ast.parse(
        "import subprocess\n"
        "def run(cmd): return subprocess.run(cmd)\n"
        "def launched(tmp_path): return run(['x'])\n"
        "def test_direct(): subprocess.run(['x'])\n"
        "def test_helper(): run(['x'])\n"
        "def test_fixture(launched): pass\n"
        "def test_lazy():\n    import multiprocessing\n    multiprocessing.get_context('fork')\n"
        "def test_none(tmp_path): pass\n"
    )
    assert _process_starters(tree) == {"run", "launched", "test_direct", "test_helper", "test_fixture", "test_lazy"}
