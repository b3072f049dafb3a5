"""The launches the docs print, run as a user runs them: the shipped example scripts under the shipped
`examples/accelerate/*.yaml` configs, on 2 CPU processes (gloo), with full fine-tuning, on-policy sampling and the
default settings, through to the paired evaluation at the end (examples/accelerate/README.md lists them)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trl_nca.testing import free_port


pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "accelerate"
EXAMPLES = ROOT / "examples"
SCRIPTS = Path(__file__).parents[1] / "scripts"
SMALL = [
    "--max_steps",
    "2",
    "--per_device_train_batch_size",
    "2",
    "--max_new_tokens",
    "8",
    "--bf16",
    "false",
    "--report_to",
    "none",
    "--ddp_backend",
    "gloo",
    "--eval_batch_size",
    "4",
]


def launch(config: str, script: Path, *args: str, cwd: Path, processes: int = 2) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file examples/accelerate/<config>.yaml --num_processes 2 --mixed_precision no ...`
    as examples/accelerate/README.md says for a machine without GPUs: DeepSpeed with `--ddp_backend gloo`, DDP with
    `--use_cpu true` too (accelerate's own `--cpu` starts one process)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(CONFIGS / f"{config}.yaml"),
        "--num_processes",
        str(processes),
        "--mixed_precision",
        "no",
        "--main_process_port",
        str(free_port()),
        str(script),
        *args,
        *(["--use_cpu", "true"] if config == "ddp" else []),
    ]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _medmcqa_rows(path: Path) -> Path:
    """64 MedMCQA-format rows; every third question opens with the same long case description, so the rows of a
    micro-batch share prompt prefixes of different lengths on different processes."""
    subjects = ["Medicine", "Anatomy", "Pharmacology", "Dental"]
    opening = "A patient of forty-five presents with severe abdominal pain radiating to the back since two days. "
    rows = [
        {
            "id": f"m{i}",
            "question": (opening if i % 3 == 0 else "") + f"Case {i}" + " and more" * (i % 5) + "?",
            "opa": "a",
            "opb": "b",
            "opc": "c",
            "opd": "d",
            "cop": i % 4,
            "choice_type": "single",
            "exp": "",
            "subject_name": subjects[i % 4],
            "topic_name": "t",
        }
        for i in range(64)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def _assert_paired_report(out: Path, items: int) -> None:
    summary = json.loads((out / "paired_eval" / "summary.json").read_text())
    assert [m["name"] for m in summary["models"]] == ["base", "student"]
    for name in ("base", "student"):
        assert len((out / "paired_eval" / name / "records.jsonl").read_text().splitlines()) == items
    assert (out / "paired_eval" / "report.md").is_file()


@pytest.mark.parametrize("config", ["ddp", "zero2", "zero3", "zero3_offload"])
def test_medmcqa_example_under_each_launcher(tiny_dir, tmp_path, config):
    """Full fine-tuning, on-policy, defaults (prefix sharing on, self-teacher as a frozen copy), then the paired
    evaluation of the saved student on the main process alone."""
    data = _medmcqa_rows(tmp_path / "medmcqa.jsonl")
    out = tmp_path / "out"
    result = launch(
        config,
        EXAMPLES / "medmcqa.py",
        "--model_name_or_path",
        str(tiny_dir),
        "--dataset_path",
        str(data),
        "--train_limit",
        "16",
        "--eval_limit",
        "8",
        "--eval_max_new_tokens",
        "8",
        "--output_dir",
        str(out),
        *SMALL,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert (out / "model.safetensors").is_file()
    _assert_paired_report(out, 8)  # the 8 Anatomy/Dental items of the first 64 rows... limited to 8
    assert result.stdout.count("## ") > 0  # the report was printed once, by the main process
    assert result.stdout.count("paired evaluation") == 1


def test_medmcqa_example_one_process_zero3_lora_defaults(tiny_dir, tmp_path):
    """The single-GPU recipe: one process, ZeRO-3, LoRA, TRL's defaults (gradient checkpointing on, which TRL makes
    reentrant for PEFT + ZeRO-3; the trainer keeps it non-reentrant and says so once), on-policy NCA, then the paired
    evaluation."""
    data = _medmcqa_rows(tmp_path / "medmcqa.jsonl")
    out = tmp_path / "out"
    result = launch(
        "zero3",
        EXAMPLES / "medmcqa.py",
        "--model_name_or_path",
        str(tiny_dir),
        "--dataset_path",
        str(data),
        "--train_limit",
        "16",
        "--eval_limit",
        "8",
        "--eval_max_new_tokens",
        "8",
        "--output_dir",
        str(out),
        "--use_peft",
        "--lora_target_modules",
        "q_proj",
        "v_proj",
        *SMALL,
        cwd=tmp_path,
        processes=1,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert (out / "adapter_model.safetensors").is_file()
    _assert_paired_report(out, 8)
    assert (result.stdout + result.stderr).count("Gradient checkpointing stays non-reentrant") == 1


def test_sokoban_example_under_zero3(tiny_dir, tmp_path):
    """Rollouts under ZeRO-3: each process plays its own maps, whose episodes end after different numbers of model
    calls; then the paired evaluation on held-out maps."""
    out = tmp_path / "out"
    result = launch(
        "zero3",
        EXAMPLES / "sokoban.py",
        "--model_name_or_path",
        str(tiny_dir),
        "--eval_seeds",
        "2",
        "--eval_max_new_tokens",
        "6",
        "--max_length",
        "4096",
        "--output_dir",
        str(out),
        *SMALL,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    _assert_paired_report(out, 2)


def test_distillation_trainer_under_zero3(tiny_dir, tmp_path):
    """`NCADistillationTrainer` (TRL's DistillationTrainer sampling) under ZeRO-3, full fine-tuning, 2 steps."""
    result = launch("zero3", SCRIPTS / "ds_distill.py", str(tmp_path / "out"), str(tiny_dir), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    logs = json.loads((tmp_path / "out" / "logs.json").read_text())
    assert len(logs) == 2 and all(log["loss"] == log["loss"] for log in logs)  # two finite steps
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_a_failing_process_stops_the_launch_with_its_error(tiny_dir, tmp_path):
    """Process 1 raises at the start of step 2 while process 0 enters the step's ZeRO-3 gathers: the launch ends
    within a minute or two (not after the collective timeout), failed, with process 1's error in its output."""
    started = time.monotonic()
    result = launch("zero3", SCRIPTS / "rank_failure.py", str(tmp_path / "out"), str(tiny_dir), cwd=tmp_path)
    assert result.returncode != 0
    assert "process 1 stops here on purpose" in result.stderr, result.stderr[-3000:]
    assert time.monotonic() - started < 300  # gloo's collective timeout is 30 minutes
