"""The example scripts and the `trl-nca train` CLI run end to end on local data and local models."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
CPU = ["--bf16", "false", "--use_cpu", "true", "--report_to", "none", "--gradient_checkpointing", "false"]


def _run(args, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_medmcqa_example_trains_and_reports(tiny_dir, tmp_path):
    subjects = ["Medicine", "Anatomy", "Pharmacology", "Dental"]
    rows = [
        {"id": f"m{i}", "question": f"Case {i}?", "opa": "a", "opb": "b", "opc": "c", "opd": "d", "cop": i % 4,
         "choice_type": "single", "exp": "", "subject_name": subjects[i % 4], "topic_name": "t"}
        for i in range(8)
    ]  # fmt: skip
    data = tmp_path / "medmcqa.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "out"
    args = ["medmcqa.py", "--model_name_or_path", tiny_dir, "--dataset_path", str(data), "--max_steps", "1",
            "--per_device_train_batch_size", "2", "--max_new_tokens", "4", "--eval_limit", "2",
            "--eval_max_new_tokens", "4", "--output_dir", str(out), *CPU]  # fmt: skip
    _run(args, cwd=ROOT / "examples")
    summary = json.loads((out / "paired_eval" / "summary.json").read_text())
    assert {m["name"] for m in summary["models"]} == {"base", "student"}
    for name in ("base", "student"):
        lines = (out / "paired_eval" / name / "records.jsonl").read_text().splitlines()
        assert len(lines) == 2  # the two Anatomy/Dental test items, both views each


def test_cli_train_with_yaml_config(tiny_dir, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model_name_or_path: {tiny_dir}\ndataset_name: quickstart\nmax_train_samples: 4\nmax_steps: 1\n"
        f"per_device_train_batch_size: 2\nmax_new_tokens: 4\nnca_beta: 0.5\noutput_dir: {tmp_path / 'out'}\n"
        "save_strategy: 'no'\nuse_peft: true\nlora_target_modules: [q_proj, v_proj]\npaired_eval: true\n"
        "paired_eval_limit: 2\npaired_eval_max_new_tokens: 4\n"
    )
    _run(["-m", "trl_nca.cli", "train", "--config", str(config), *CPU], cwd=tmp_path)
    assert (tmp_path / "out" / "adapter_model.safetensors").exists()
    assert "trl-nca" in (tmp_path / "out" / "README.md").read_text()
    summary = json.loads((tmp_path / "out" / "paired_eval" / "summary.json").read_text())
    assert [m["name"] for m in summary["models"]] == ["base", "student"]


@pytest.mark.slow
def test_two_steps_on_the_embedded_model(tmp_path):
    """The real SmolLM2-135M-Instruct: LoRA self-distillation, 2 steps, finite losses, adapter moved."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig

    from trl_nca import NCAConfig, NCATrainer
    from trl_nca.cli import read_context
    from trl_nca.models import embedded_model_path

    path = embedded_model_path()
    ds = Dataset.from_dict({"prompt": ["Which organ produces insulin? (A) Liver (B) Pancreas"] * 4})
    args = NCAConfig(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, max_new_tokens=8, bf16=False,
        use_cpu=True, report_to=[], save_strategy="no", logging_steps=1, learning_rate=1e-3,
        context_text=read_context("medical"), gradient_checkpointing=True,
    )  # fmt: skip
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    trainer = NCATrainer(model=path, args=args, train_dataset=ds, peft_config=lora)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    trainer.train()
    logs = [h for h in trainer.state.log_history if "opd_loss" in h]
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters() if "lora_B" in n)


def test_frozenlake_example_trains_and_reports(tiny_dir, tmp_path):
    out = tmp_path / "out"
    args = ["frozenlake.py", "--model_name_or_path", tiny_dir, "--max_steps", "1", "--per_device_train_batch_size",
            "2", "--max_new_tokens", "6", "--max_length", "4096", "--eval_seeds", "2", "--eval_max_new_tokens", "6",
            "--output_dir", str(out), *CPU]  # fmt: skip
    _run(args, cwd=ROOT / "examples")
    summary = json.loads((out / "paired_eval" / "summary.json").read_text())
    assert {m["name"] for m in summary["models"]} == {"base", "student"}


@pytest.mark.parametrize("name", ["quickstart", "medmcqa", "safety", "sokoban", "frozenlake"])
def test_example_configs_parse(name):
    """Every shipped YAML parses into the dataclasses of the script that uses it (catches renamed fields)."""
    from trl import ModelConfig, TrlParser

    from trl_nca import NCAConfig

    sys.path.insert(0, str(ROOT / "examples"))
    if name == "quickstart":
        from trl_nca.cli import TrainScriptArguments as Script
    elif name in ("medmcqa", "safety"):
        from _qa_common import QAArguments as Script
    else:
        from sokoban import GameArguments as Script
    parser = TrlParser((Script, NCAConfig, ModelConfig))
    config = str(ROOT / "examples" / "configs" / f"{name}.yaml")
    _, args, _ = parser.parse_args_and_config(args=["--config", config, "--bf16", "false", "--use_cpu", "true"])
    assert args.nca_beta == 0.5
