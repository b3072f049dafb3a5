"""benchmarks/gpu_check.sh: its `--dry-run` runs here on the CPU through the same functions as on a GPU; its inline
architectures are those of the published models; the wheel plan of download_wheels.sh and the import check say what
is missing."""

import json
import os
import subprocess
import sys
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
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               GPU_CHECK_WHEELS=str(tmp_path / "no-wheels"), **env)  # fmt: skip
    return subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), *args], env=env, capture_output=True, text=True, timeout=900
    )


@pytest.mark.slow
def test_dry_run_launches_the_example_and_times_every_model_and_variant(tmp_path):
    out = tmp_path / "gpu_check.json"
    result = _run_script(["--dry-run", "--sharing", "--out", str(out)], tmp_path)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    report = json.loads(out.read_text())
    meta, runs, env, launch = report["meta"], report["runs"], report["environment"], report["launch"]
    assert env["missing"] == [] and all(status == "ok" for status in env["imports"].values())
    assert env["deepspeed_accelerator"] == "cpu"  # detected at run time ("cuda" on the GPU machine)
    # the ZeRO-3 launch of examples/medmcqa.py ran to the end with LoRA: 2 steps saving checkpoints, a resume to step 3,
    # the paired evaluation of both models
    assert launch["ok"] and launch["rc"] == 0, launch["problems"]
    assert "--config_file examples/accelerate/zero3.yaml --num_processes 1" in launch["command"]
    assert "--use_peft true" in launch["command"] and "--save_steps 1" in launch["command"]
    assert "--resume_from_checkpoint true" in launch["commands"][1]
    assert launch["records"] == {"base": 8, "student": 8}
    assert meta["dry_run"] and meta["batch"] == 2 and meta["completion_tokens"] == 8 and meta["lmbda"] == 1.0
    # tiny models in the published architecture (Qwen3), at the sizes of trl_nca.testing's tiny model
    assert {shape["model_type"] for shape in meta["shapes"].values()} == {"qwen3"}
    assert all(shape["hidden_size"] == 64 and shape["vocab_size"] == 512 for shape in meta["shapes"].values())
    assert [(r["model"], r["variant"], r["nca_beta"], r["share_prefix"]) for r in runs] == [
        (model, variant, beta, share)
        for model in ("qwen3-8b", "qwen3-1.7b")
        for variant, beta, share in (("opd", 0.0, True), ("nca", 0.5, True), ("nca-unshared", 0.5, False))
    ]
    for run in runs:
        assert run["teacher"] == "SelfTeacher"  # LoRA: the student with its adapter disabled, no second copy
        assert len(run["step_s_all"]) == len(run["sampling_s_all"]) == meta["steps"]
        # every timed step sampled on-policy, exactly completion_tokens per row, inside the timed step
        assert run["sampled_tokens_per_step"] == meta["batch"] * meta["completion_tokens"]
        assert 0 < run["sampling_s"] < run["step_s"] and run["train_s"] == run["step_s"] - run["sampling_s"]
    checks = {(c["model"], c["check"]) for c in report["targets"]}
    assert ("qwen3-8b", "NCA step peak (reserved) GiB") in checks
    assert ("qwen3-1.7b", "NCA step time (sampling included), shared prefix / unshared") in checks
    assert ("qwen3-1.7b", "step time NCA / OPD, sampling included") in checks
    assert ("qwen3-1.7b", "peak memory NCA / OPD") in checks
    assert all(c["pass"] is None for c in report["targets"])  # a dry run judges nothing
    assert report["table"] in result.stdout and "no timing or memory claims" in result.stdout
    assert report["skipped"] == []


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
    assert (
        "gpu_check: MISSING: datasets, trl.experimental.gkd, trl_nca, trl_nca.trainers.nca_trainer, trl_nca.eval.compare: "
        "nothing else can run" in result.stdout
    )
    assert "gpu_check: exit status 3" in result.stdout
    report = json.loads(out.read_text())
    assert report["launch"] is None and report["runs"] == []
    assert "datasets" in report["environment"]["missing"]


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
    _wheel(tmp_path, "trl-1.16.0-py3-none-any.whl", ["transformers>=4.56.2", "datasets>=4.7.0", "psutil>=5.9.4",
                                                     "deepspeed>=0.14; extra == 'deepspeed'"], ">=3.11")  # fmt: skip
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
    """Built on the meta device (no memory). The model cards give Qwen3-1.7B 1.7B parameters, 1.4B besides the
    embedding (tied with the output layer), and Qwen3-8B 8.2B, 6.95B besides the embedding and the output layer."""
    gpu_check = _gpu_check()
    counts = {name: gpu_check._parameters(shape) for name, shape in gpu_check.SHAPES.items()}
    assert counts == {"qwen3-1.7b": 1_720_574_976, "qwen3-8b": 8_190_735_360}
    embedding = 151936 * 2048
    assert round((counts["qwen3-1.7b"] - embedding) / 1e9, 1) == 1.4
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
