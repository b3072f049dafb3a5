"""docs/results.md is built from the committed run summaries: its tables must equal what build.py renders from them,
and every experiment it reports has the config that reruns it."""

import importlib.util
import json
import re
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]


def _build_module():
    spec = importlib.util.spec_from_file_location("results_build", ROOT / "docs" / "results" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_page_matches_its_data(capsys):
    assert _build_module().main(["--check"]) == 0, capsys.readouterr().out


def test_check_notices_a_changed_summary(tmp_path, monkeypatch):
    build = _build_module()
    data = tmp_path / "data"
    data.mkdir()
    for path in (ROOT / "docs" / "results" / "data").glob("*.json"):
        summary = json.loads(path.read_text())
        if path.stem == "org-100":
            summary["aggregated"]["opd"]["harm"]["mean"] += 0.1  # one number off
        (data / path.name).write_text(json.dumps(summary))
    monkeypatch.setattr(build, "DATA", data)
    assert build.main(["--check"]) == 1


def test_every_reported_experiment_can_be_rerun():
    page = (ROOT / "docs" / "results.md").read_text()
    names = set(re.findall(r"<!-- table:([\w.-]+) -->", page))
    assert names, "results.md has no generated tables"
    configs = {p.stem for p in (ROOT / "examples" / "configs" / "results").glob("*.yaml")}
    assert names <= configs, f"no config in examples/configs/results/ for {sorted(names - configs)}"
    script = (ROOT / "benchmarks" / "reproduce_results.sh").read_text()
    missing = [name for name in configs if name not in script]
    assert not missing, f"benchmarks/reproduce_results.sh does not run {missing}"
