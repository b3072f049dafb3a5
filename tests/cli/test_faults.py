"""Fault injection (issue 8): a training run killed after a checkpoint resumes through `trl-nca train` to the same
weights as an uninterrupted run, and a killed game evaluation resumes to the same records."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import trl_nca.trainers.nca_trainer
from trl_nca.cli import main as cli_main
from trl_nca.cli import train as cli_train


ROOT = Path(__file__).resolve().parents[2]

# Runs `python -m trl_nca.cli ...` with one addition: the process SIGKILLs itself right after checkpoint `KILL_AT` has
# been written (the callback runs after Trainer's save), like a job killed by the scheduler.
KILL_AFTER_SAVE = """
import os, signal, sys
from transformers import TrainerCallback
import trl_nca.trainers.nca_trainer

class KillAfterSave(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        if state.global_step == int(os.environ["KILL_AT"]):
            os.kill(os.getpid(), signal.SIGKILL)

init = trl_nca.trainers.nca_trainer.NCATrainer.__init__
def patched(self, *a, **k):
    init(self, *a, **k)
    self.add_callback(KillAfterSave())
trl_nca.trainers.nca_trainer.NCATrainer.__init__ = patched
from trl_nca.cli import main
sys.exit(main(sys.argv[1:]))
"""


def train_argv(tiny_dir, output_dir, *extra):
    return [
        "--model_name_or_path",
        tiny_dir,
        "--dataset_name",
        "quickstart",
        "--max_train_samples",
        "8",
        "--per_device_train_batch_size",
        "2",
        "--max_steps",
        "4",
        "--max_new_tokens",
        "4",
        "--learning_rate",
        "1e-3",
        "--save_strategy",
        "steps",
        "--save_steps",
        "2",
        "--logging_steps",
        "1",
        "--output_dir",
        str(output_dir),
        "--bf16",
        "false",
        "--use_cpu",
        "true",
        "--report_to",
        "none",
        *extra,
    ]


def weights(folder):
    return load_file(str(Path(folder) / "model.safetensors"))


@pytest.fixture
def count_steps(monkeypatch):
    """Counts the optimizer steps a run actually computes (one micro-batch per step here)."""
    calls = []
    original = trl_nca.trainers.nca_trainer.NCATrainer.training_step

    def counted(self, *args, **kwargs):
        calls.append(self.state.global_step)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(trl_nca.trainers.nca_trainer.NCATrainer, "training_step", counted)
    return calls


@pytest.mark.slow  # the killed run is a process of its own
def test_cli_training_killed_after_a_checkpoint_resumes_exactly(tiny_dir, tmp_path, count_steps):
    reference = cli_train(train_argv(tiny_dir, tmp_path / "uninterrupted"))
    assert reference.state.global_step == 4
    count_steps.clear()

    killed = tmp_path / "killed"
    env = dict(os.environ, KILL_AT="2", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_SAVE, "train", *train_argv(tiny_dir, killed)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == -9, result.stderr[-3000:]
    assert (killed / "checkpoint-2").is_dir() and not (killed / "checkpoint-4").exists()
    assert not (killed / "model.safetensors").exists()
    by_folder = tmp_path / "by-folder"
    shutil.copytree(killed, by_folder)

    # resume with `true` (the last checkpoint of output_dir): only steps 3 and 4 are computed
    resumed = cli_train(train_argv(tiny_dir, killed, "--resume_from_checkpoint", "true"))
    assert count_steps == [2, 3] and resumed.state.global_step == 4
    expected = weights(tmp_path / "uninterrupted")
    for earlier in (weights(tiny_dir), weights(by_folder / "checkpoint-2")):  # steps 3 and 4 moved the weights
        assert any(not torch.equal(earlier[name], expected[name]) for name in expected)
    for name, tensor in weights(killed).items():
        assert torch.equal(tensor, expected[name]), name

    # resume from an explicit checkpoint folder
    count_steps.clear()
    cli_train(train_argv(tiny_dir, by_folder, "--resume_from_checkpoint", str(by_folder / "checkpoint-2")))
    assert count_steps == [2, 3]
    for name, tensor in weights(by_folder).items():
        assert torch.equal(tensor, expected[name]), name


def test_cli_resume_mistakes_are_one_line_errors(tiny_dir, tmp_path, capsys):
    out = tmp_path / "fresh"
    assert cli_main(["train", *train_argv(tiny_dir, out, "--resume_from_checkpoint", "true")]) == 2
    err = capsys.readouterr().err
    assert "trl-nca train: error: --resume_from_checkpoint true, but output_dir" in err and "Traceback" not in err
    missing = str(tmp_path / "nowhere" / "checkpoint-2")
    assert cli_main(["train", *train_argv(tiny_dir, out, "--resume_from_checkpoint", missing)]) == 2
    assert f"--resume_from_checkpoint {missing!r} is not a folder" in capsys.readouterr().err


# Runs `trl-nca eval` and SIGKILLs the process at the first generate call after RECORDS holds KILL_AFTER records: the
# evaluation dies in the middle of a map, as a job killed by the scheduler would.
KILL_MID_GAME = """
import os, signal, sys
from pathlib import Path
import trl_nca.core.sampling as generation

original = generation.HFBackend.generate
def generate(self, *args, **kwargs):
    path = Path(os.environ["RECORDS"])
    if path.exists() and len(path.read_text().splitlines()) >= int(os.environ["KILL_AFTER"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return original(self, *args, **kwargs)
generation.HFBackend.generate = generate
from trl_nca.cli.eval import main
sys.exit(main(sys.argv[1:]))
"""


def game_argv(tiny_dir, output_dir):
    return [
        "--model",
        f"m={tiny_dir}",
        "--game",
        "frozenlake",
        "--game-option",
        "num_seeds=5",
        "--max-new-tokens",
        "4",
        "--batch-size",
        "2",
        "--bootstrap",
        "0",
        "--no-plots",
        "--no-progress",
        "--output-dir",
        str(output_dir),
    ]


@pytest.mark.slow  # the killed evaluation is a process of its own
def test_game_evaluation_killed_mid_run_resumes_to_the_same_records(tiny_dir, tmp_path):
    from trl_nca.cli.eval import main as eval_main

    assert eval_main(game_argv(tiny_dir, tmp_path / "uninterrupted")) == 0
    expected = {
        json.loads(line)["item_id"]: json.loads(line)
        for line in (tmp_path / "uninterrupted" / "m" / "records.jsonl").read_text().splitlines()
    }
    assert len(expected) == 5

    records = tmp_path / "killed" / "m" / "records.jsonl"
    env = dict(
        os.environ, RECORDS=str(records), KILL_AFTER="2", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT)
    )
    result = subprocess.run(
        [sys.executable, "-c", KILL_MID_GAME, *game_argv(tiny_dir, tmp_path / "killed")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == -9, result.stderr[-3000:]
    kept = records.read_text().splitlines()
    assert len(kept) == 2  # the maps finished before the kill were written as they ended

    assert eval_main(game_argv(tiny_dir, tmp_path / "killed")) == 0
    lines = records.read_text().splitlines()
    assert lines[:2] == kept and len(lines) == 5  # nothing replayed, nothing lost
    assert {json.loads(line)["item_id"]: json.loads(line) for line in lines} == expected
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    reference = json.loads((tmp_path / "uninterrupted" / "summary.json").read_text())
    assert summary["models"][0]["metrics"] == reference["models"][0]["metrics"]
