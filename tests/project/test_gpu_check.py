"""benchmarks/gpu_check.sh: its `--dry-run` runs here on the CPU through the same functions as on a GPU; its inline
architectures are those of the published models; the wheel plan of download_wheels.sh and the import check say what
is missing."""

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]


def _gpu_check():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return gpu_check


def _run_script(args, tmp_path, **env):
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        GPU_CHECK_WHEELS=str(tmp_path / "no-wheels"),
        **env,
    )
    return subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), *args], env=env, capture_output=True, text=True, timeout=900
    )


def assert_every_figure_is_labelled(document, path=()):
    """Every number of the JSON is a setting (under `settings`, `budget`, `target` or a `timeout_s`) or a figure under
    a `measured` key, and every dict holding `measured` says what it was measured on (device, dtype, versions)."""
    if isinstance(document, dict):
        if "measured" in document:
            on = document.get("measured_on")
            assert isinstance(on, dict) and {"device", "dtype", "versions"} <= set(on), path
        for key, value in document.items():
            assert_every_figure_is_labelled(value, (*path, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            assert_every_figure_is_labelled(value, (*path, index))
    elif isinstance(document, (int, float)) and not isinstance(document, bool):
        labelled = {"settings", "budget", "target", "timeout_s", "measured", "measured_on"}
        assert labelled & {str(key) for key in path}, f"{'/'.join(map(str, path))} = {document} is not labelled"


@pytest.mark.slow
def test_dry_run_runs_every_part_and_labels_every_figure(tmp_path):
    """The CPU dry run with its tiny shape: every part ends ok, the whole within the 10 minutes it is given (it took
    254 s on the 2-core machine with another job's load, 2026-12-04), every figure labelled."""
    out = tmp_path / "gpu_check.json"
    result = _run_script(["--dry-run", "--out", str(out)], tmp_path)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    report = json.loads(out.read_text())
    gpu_check = _gpu_check()
    parts = report["parts"]
    assert list(parts) == [p.name for p in gpu_check.PARTS]
    assert {name: entry["status"] for name, entry in parts.items()} == dict.fromkeys(parts, "ok")
    assert report["measured"]["wall_s"] <= gpu_check.DRY_RUN_CALL_S
    assert_every_figure_is_labelled(report)
    env = parts["environment"]["settings"]
    assert env["missing"] == [] and all(status == "ok" for status in env["imports"].values())
    assert env["deepspeed_accelerator"] == "cpu"  # detected at run time ("cuda" on the GPU machine)
    assert parts["environment"]["measured_on"]["dtype"] == "float32" and parts["opd"]["measured_on"]["dry_run"]
    # the ZeRO-3 launch of examples/medmcqa.py ran to the end with LoRA: 2 steps saving checkpoints, a resume to step
    # 3, the paired evaluation of both models
    launch = parts["launch"]
    assert launch["measured"]["ok"] and launch["measured"]["rc"] == 0, launch["settings"]["problems"]
    assert "--config_file examples/accelerate/zero3.yaml --num_processes 1" in launch["settings"]["command"]
    assert "--use_peft true" in launch["settings"]["command"] and "--save_steps 1" in launch["settings"]["command"]
    assert "--resume_from_checkpoint true" in launch["settings"]["commands"][1]
    assert launch["measured"]["records"] == {"base": 8, "student": 8}
    # the step parts: the Qwen3 architecture at the tiny sizes, the settings each part ran with
    workload = gpu_check.DRY_RUN_WORKLOAD
    expected = {
        "opd": (0.0, "fixed random tokens"),
        "nca": (0.5, "fixed random tokens"),
        "nca-zero3": (0.5, "fixed random tokens"),
        "nca-sampled": (0.5, "sampled on-policy"),
    }
    for name, (beta, completions) in expected.items():
        settings, measured = parts[name]["settings"], parts[name]["measured"]
        assert (settings["nca_beta"], settings["completions"]) == (beta, completions), name
        assert settings["shape"]["model_type"] == "qwen3" and settings["shape"]["hidden_size"] == 64
        assert settings["gradient_checkpointing"] and settings["teacher_type"] == "SelfTeacher"
        assert settings["batch"] == workload.batch and settings["prompt_tokens"] >= workload.prompt_tokens
        assert settings["context_prompt_tokens"] - settings["prompt_tokens"] >= workload.context_tokens
        steps = workload.sampled_steps if name == "nca-sampled" else workload.steps
        assert len(measured["step_s_all"]) == steps and measured["steps_done"] == workload.warmup + steps
    assert (parts["nca-zero3"]["settings"]["zero_stage"], parts["nca-zero3"]["settings"]["world_size"]) == (3, 1)
    assert "zero_stage" not in parts["nca"]["settings"]
    sampled = parts["nca-sampled"]["measured"]
    assert sampled["sampled_tokens_per_step"] == workload.batch * workload.sampled_tokens
    assert 0 < sampled["sampling_s"] < sampled["step_s"]
    checks = {c["check"] for c in report["targets"]}
    assert {"peak memory NCA / OPD", "NCA step peak (reserved) GiB", "step time NCA under ZeRO-3 / NCA"} <= checks
    assert all(c["pass"] is None for c in report["targets"])  # a dry run judges nothing
    assert report["table"] in result.stdout and "no timing or memory claims" in result.stdout
    assert not any("8B" in entry["what"] or "real lengths" in entry["what"] for entry in parts.values())


def test_the_parts_and_the_install_fit_one_device_call():
    """On the GPU the wheel install and the parts' timeouts add up to at most 540 s (the device tool's call is 10
    minutes, of which the machine's start and the transfers take some); the dry run's to at most 10 minutes. Each part
    has its own timeout, and gpu_check.sh takes its install limit from gpu_check.py."""
    gpu_check = _gpu_check()
    assert gpu_check.GPU_CALL_S <= 540 and gpu_check.DRY_RUN_CALL_S <= 600
    assert gpu_check.INSTALL_TIMEOUT_S + sum(p.timeout_s for p in gpu_check.PARTS) <= gpu_check.GPU_CALL_S
    assert gpu_check.INSTALL_TIMEOUT_S + sum(p.dry_run_timeout_s for p in gpu_check.PARTS) <= gpu_check.DRY_RUN_CALL_S
    assert all(p.timeout_s > 0 and p.dry_run_timeout_s > 0 for p in gpu_check.PARTS)
    names = [p.name for p in gpu_check.PARTS]
    assert names[0] == "environment" and set(gpu_check.STEP_PARTS) <= set(names) and "launch" in names
    script = (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    assert "gpu_check.py --install-timeout" in script and 'timeout "$(left)"' in script


@pytest.mark.slow
def test_the_shell_script_reads_the_install_limit_from_the_python_check():
    """gpu_check.sh's install step waits as long as gpu_check.py says (`--install-timeout`), one number in one place."""
    gpu_check = _gpu_check()
    printed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--install-timeout"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert printed.stdout.strip() == str(gpu_check.INSTALL_TIMEOUT_S)


def test_the_real_lengths_fit_the_8b_shape():
    """The GPU workload's rows as built (the tiny tokenizer, the chat template): a prompt of at least 1536 tokens, a
    context of at least 1024 more, and with the 1024-token completion within the 8B shape's positions."""
    gpu_check = _gpu_check()
    from trl_nca.testing import make_tiny_tokenizer

    workload = gpu_check.GPU_WORKLOAD
    assert (workload.prompt_tokens, workload.context_tokens, workload.completion_tokens) == (1536, 1024, 1024)
    assert workload.sampled_tokens == 256
    _, (prompt, context) = gpu_check.build_dataset(make_tiny_tokenizer(), 2, workload)
    assert prompt >= 1536 and context - prompt >= 1024
    assert context + workload.completion_tokens <= gpu_check.SHAPES["qwen3-8b"]["max_position_embeddings"]


def test_a_part_past_its_timeout_is_killed_and_the_json_keeps_what_finished(tmp_path, monkeypatch):
    """Parts whose commands stand in for the real ones: `opd` ends, `nca` writes a first figure and hangs. The JSON
    is rewritten when `opd` ends (the hanging part reads it), `nca` is killed with its process group at its timeout
    and keeps the figure it wrote, and the call exits 1."""
    gpu_check = _gpu_check()
    out = tmp_path / "gpu_check.json"
    child = tmp_path / "child.py"
    child.write_text(
        "import json, os, subprocess, sys, time\n"
        "name, part_out, out = sys.argv[1:4]\n"
        "on = {'device': 'test', 'dtype': 'none', 'versions': {}}\n"
        "doc = {'status': 'ok', 'settings': {'missing': [], 'missing_wheels': [], 'cuda_available': False},"
        " 'measured': {}, 'measured_on': on}\n"
        "if name == 'opd':\n"
        "    doc['measured'] = {'step_s': 1.5}\n"
        "if name == 'nca':\n"
        "    seen = json.load(open(out))['parts']['opd']['status']\n"
        "    doc.update(status='running', measured={'step_s_all': [2.5]}, settings={'saw_opd': seen})\n"
        "    json.dump(doc, open(part_out, 'w'))\n"
        "    grandchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"    open({str(tmp_path / 'grandchild.pid')!r}, 'w').write(str(grandchild.pid))\n"
        "    time.sleep(60)\n"
        "json.dump(doc, open(part_out, 'w'))\n"
    )
    parts = (
        gpu_check.Part("environment", 30, 30, "stand-in"),
        gpu_check.Part("opd", 30, 30, "stand-in"),
        gpu_check.Part("nca", 3, 3, "stand-in"),
    )
    monkeypatch.setattr(gpu_check, "PARTS", parts)
    monkeypatch.setattr(gpu_check, "print_environment", lambda env: None)
    monkeypatch.setattr(
        gpu_check,
        "_part_command",
        lambda part, cli, part_out, port: [sys.executable, str(child), part.name, str(part_out), str(out)],
    )
    assert gpu_check.main(["--dry-run", "--out", str(out), "--parts", "opd", "nca"]) == 1
    report = json.loads(out.read_text())
    opd, nca = report["parts"]["opd"], report["parts"]["nca"]
    assert opd["status"] == "ok" and opd["measured"]["step_s"] == 1.5
    assert nca["status"] == "timeout" and nca["error"] == "killed at its timeout of 3 s" and nca["timeout_s"] == 3
    assert nca["measured"]["step_s_all"] == [2.5] and nca["settings"]["saw_opd"] == "ok"
    assert 3 <= nca["measured"]["part_wall_s"] < 30
    assert_every_figure_is_labelled(report)
    # killed with its part's group. SIGKILL is delivered at once but the process ends only when next scheduled, which
    # on a loaded CI machine can come after this line: wait for it (a grandchild that was never signalled sleeps 60 s).
    status = Path(f"/proc/{(tmp_path / 'grandchild.pid').read_text()}/status")
    deadline = time.monotonic() + 15
    while not _ended(status) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _ended(status)


def _ended(status: Path) -> bool:
    """Whether the process of a /proc/<pid>/status file has ended: gone, or a zombie not yet reaped."""
    try:
        return "zombie" in status.read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True


@pytest.mark.slow  # runs benchmarks/gpu_check.sh
def test_a_missing_package_is_named_and_nothing_else_runs(tmp_path):
    """A `datasets` that cannot be imported (as on the GPU machine before the wheels) is named, with everything that
    needs it, and the script stops with its own exit status instead of a traceback halfway through."""
    shadow = tmp_path / "shadow" / "datasets"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no module named datasets (simulated)')\n")
    out = tmp_path / "gpu_check.json"
    result = _run_script(["--dry-run", "--out", str(out)], tmp_path, PYTHONPATH=str(shadow.parent))
    assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]
    assert "gpu_check: import datasets: ImportError: no module named datasets (simulated)" in result.stdout
    assert (
        "gpu_check: import trl_nca.trainers.nca_trainer: ImportError: no module named datasets (simulated)"
        in result.stdout
    )
    # `import trl_nca` and `trl_nca.eval.compare` load their heavy modules on first use, so they import without it
    assert (
        "gpu_check: MISSING: datasets, trl.experimental.gkd, trl_nca.trainers.nca_trainer: nothing else can run"
        in result.stdout
    )
    assert "gpu_check: exit status 3" in result.stdout
    report = json.loads(out.read_text())
    assert report["parts"]["environment"]["status"] == "ok"
    assert "datasets" in report["parts"]["environment"]["settings"]["missing"]
    assert {entry["status"] for name, entry in report["parts"].items() if name != "environment"} == {"not run"}


def _wheel(directory: Path, filename: str, requires=(), requires_python=None):
    name, version = filename.split("-")[:2]
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Python: {requires_python}"] * bool(requires_python)
    lines += [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(directory / filename, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", "\n".join(lines) + "\n\nDescription\n")


def test_the_wheel_plan_names_every_requirement_the_machine_lacks(tmp_path):
    """download_wheels.sh's check: each wheel's requirements against the other wheels and the GPU machine."""
    gpu_check = _gpu_check()
    machine = dict(gpu_check.GPU_MACHINE)
    _wheel(
        tmp_path,
        "trl-1.16.0-py3-none-any.whl",
        ["transformers>=4.56.2", "datasets>=4.7.0", "psutil>=5.9.4", "deepspeed>=0.14; extra == 'deepspeed'"],
        ">=3.11",
    )
    _wheel(tmp_path, "datasets-5.2.0-py3-none-any.whl", ["dill<0.4.2,>=0.3.0", "multiprocess<0.70.20"])
    _wheel(tmp_path, "dill-0.4.1-py3-none-any.whl")
    assert gpu_check.plan_wheels(tmp_path, machine) == [
        "datasets-5.2.0-py3-none-any.whl requires multiprocess<0.70.20, which neither the machine nor a wheel provides"
    ]
    _wheel(tmp_path, "multiprocess-0.70.19-py312-none-any.whl", ["dill>=0.4.1"])
    assert gpu_check.plan_wheels(tmp_path, machine) == []
    # an older transformers on the machine than trl needs: fetch one; a wheel for another Python
    _wheel(tmp_path, "regex-2026.5.9-cp311-cp311-manylinux_2_17_x86_64.whl")
    problems = gpu_check.plan_wheels(tmp_path, dict(machine, transformers="4.50.0"))
    assert problems == [
        "regex-2026.5.9-cp311-cp311-manylinux_2_17_x86_64.whl: not installable on CPython 3.12 x86-64 Linux (tags "
        "cp311-cp311-manylinux_2_17_x86_64)",
        "trl-1.16.0-py3-none-any.whl requires transformers>=4.56.2, the machine has 4.50.0: fetch a wheel of it",
        "trl-nca requires transformers<6,>=5.17, the machine has 4.50.0: fetch a wheel of it",
    ]


def test_inline_architectures_have_the_published_parameter_counts():
    """Built on the meta device (no memory). The model card gives Qwen3-8B 8.2B parameters, 6.95B besides the
    embedding and the output layer."""
    gpu_check = _gpu_check()
    counts = {name: gpu_check._parameters(shape) for name, shape in gpu_check.SHAPES.items()}
    assert counts == {"qwen3-8b": 8_190_735_360}
    assert round((counts["qwen3-8b"] - 2 * 151936 * 4096) / 1e9, 2) == 6.95


def test_the_requirement_walk_names_what_is_missing_or_at_the_wrong_version():
    """On the GPU machine the check walks trl-nca's requirements through the installed distributions; here the same
    walk, from roots that this environment cannot meet (directly, and one level down through a real distribution)."""
    gpu_check = _gpu_check()
    import transformers

    problems = gpu_check.unmet_requirements(["transformers<5", "no-such-package-gpu-check>=1"])
    assert problems == [
        "no-such-package-gpu-check: not installed (trl-nca requires no-such-package-gpu-check>=1)",
        f"transformers {transformers.__version__} installed, trl-nca requires transformers<5",
    ]


def test_the_tested_floors_are_the_gpu_machines_versions_and_every_admitted_python_is_tested():
    """.ci/run tests the fast suite once more at the floors of pyproject.toml (scripts/oldest_versions.py), which must
    stay the lent GPU machine's transformers and accelerate for that one run to cover both; the GitHub workflow tests
    every Python minor version that `requires-python` admits; the license is an SPDX string and LICENSE ships."""
    import tomllib

    from packaging.specifiers import SpecifierSet

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from oldest_versions import oldest
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    pins = dict(line.split("==") for line in oldest(ROOT / "pyproject.toml"))
    machine = _gpu_check().GPU_MACHINE
    assert pins["transformers"] == machine["transformers"] and pins["accelerate"] == machine["accelerate"]
    assert "scripts/oldest_versions.py" in (ROOT / ".ci" / "run").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    admitted = [
        f"3.{minor}" for minor in range(8, 20) if SpecifierSet(project["requires-python"]).contains(f"3.{minor}.0")
    ]
    workflow = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    matrix = json.loads(workflow.split("python-version: ", 1)[1].splitlines()[0])
    assert matrix == admitted
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()


def test_a_carried_set_missing_a_wheel_is_named(tmp_path):
    """download_wheels.sh's list (deepspeed's pure-Python wheel and its requirements included) against a wheel folder:
    an empty folder carries nothing (the installed packages are used); a partial one names each wheel it lacks."""
    gpu_check = _gpu_check()
    carried = gpu_check.carried_packages()
    assert {"trl", "datasets", "dill", "multiprocess", "deepspeed", "pydantic", "typing-extensions"} <= set(carried)
    assert gpu_check.missing_wheels(tmp_path) == []
    _wheel(tmp_path, "trl-1.16.0-py3-none-any.whl")
    _wheel(tmp_path, "py_cpuinfo-9.0.0-py3-none-any.whl")
    missing = gpu_check.missing_wheels(tmp_path)
    assert "trl" not in missing and "py-cpuinfo" not in missing
    assert missing == [name for name in carried if name not in ("trl", "py-cpuinfo")]


def _read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    try:
        done = subprocess.run(
            ["mount", "--bind", "-o", "ro", str(folder), str(folder)], capture_output=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return folder if done.returncode == 0 else None


# (case, the --out given, the one line it must print before any part runs) (issue 50)
OUT_CASES = [
    (
        "an existing folder",
        "{tmp}",
        "gpu_check: error: --out '{tmp}' is a folder; give the path of the JSON file to write (e.g. {tmp}/check.json).",
    ),
    (
        "below a file",
        "{tmp}/file.txt/check.json",
        "gpu_check: error: --out '{tmp}/file.txt/check.json' lies below "
        "'{tmp}/file.txt', which is a file; give a path in a folder.",
    ),
    (
        "in a read-only folder",
        "{tmp}/ro/check.json",
        "gpu_check: error: --out '{tmp}/ro/check.json' cannot be written "
        "(Read-only file system); give a path in a folder you can write to.",
    ),
]


@pytest.mark.slow  # starts `mount` and `umount`
@pytest.mark.parametrize("case, out, expected", OUT_CASES, ids=[c[0] for c in OUT_CASES])
def test_a_bad_out_is_one_line_before_any_part(tmp_path, capsys, monkeypatch, case, out, expected):
    """A `--out` that cannot be written is found before the parts run (not after the environment part's lent GPU
    time), and nothing is left behind."""
    import subprocess as sp

    gpu_check = _gpu_check()
    read_only = _read_only_folder(tmp_path) if "/ro/" in out else None
    if "/ro/" in out and read_only is None:
        pytest.skip("cannot bind-mount a read-only folder here (needs root and CAP_SYS_ADMIN)")
    (tmp_path / "file.txt").write_text("x")
    monkeypatch.setattr(gpu_check, "_run_part", lambda *a: pytest.fail("a part ran before --out was checked"))
    before = sorted(p.name for p in tmp_path.iterdir())
    try:
        assert gpu_check.main(["--dry-run", "--out", out.format(tmp=tmp_path)]) == 2
    finally:
        if read_only is not None:
            sp.run(["umount", str(read_only)], capture_output=True, timeout=30)
    captured = capsys.readouterr()
    assert captured.err.strip() == expected.format(tmp=tmp_path) and "gpu_check: environment" not in captured.out
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no stray .tmp


def test_the_dry_run_does_not_label_its_figures_as_the_8b_shape():
    """The dry run measures the tiny model at a few tokens: no part says "8B-shaped" or "at the real lengths"."""
    gpu_check = _gpu_check()
    for part in gpu_check.PARTS:
        what = gpu_check.what_of(part, dry_run=True)
        assert "8B" not in what and "real lengths" not in what, what
    assert any("8B-shaped" in gpu_check.what_of(part, dry_run=False) for part in gpu_check.PARTS)
