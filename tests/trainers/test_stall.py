"""The stall signal of anchored runs (`trl_nca.core.stall`) in the trainer: its recording, its state in checkpoints,
and a real stalled run (docs/results.md section 10). Its rule on its own: tests/core/test_stall_rule.py."""

import json
import logging

import pytest
from test_trainer import make_args

from trl_nca import NCATrainer
from trl_nca.core.stall import STALL_WINDOW, StallMonitor
from trl_nca.testing import make_tiny_model, prompt_dataset


def _feed(monitor, opd, view):
    return [monitor.update(o, v) for o, v in zip(opd, view)]


def test_trainer_records_the_signal_of_each_step_and_only_for_an_anchor(tok, tmp_path):
    """Logged every step (logging_steps=1), `nca/stall` and `nca/gap_left` equal a monitor fed with the logged
    opd_loss and view_kl; plain OPD logs none."""
    steps = 2 * STALL_WINDOW + 2
    args = make_args(tmp_path, max_steps=steps, nca_beta=0.5, learning_rate=5e-2)
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=make_tiny_model(tok, 1),
        args=args,
        train_dataset=prompt_dataset(4 * steps),
        processing_class=tok,
    )
    trainer.train()
    logged = [h for h in trainer.state.log_history if "opd_loss" in h]
    assert len(logged) == steps
    expected = _feed(StallMonitor(), [h["opd_loss"] for h in logged], [h["view_kl"] for h in logged])
    for entry, want in zip(logged, expected):
        assert {k: entry[k] for k in want} == pytest.approx(want, rel=1e-12)
    assert "nca/gap_left" in logged[-1]
    opd = NCATrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=make_tiny_model(tok, 1),
        args=make_args(tmp_path, nca_beta=0.0, nca_monitor=True),
        train_dataset=prompt_dataset(4),
        processing_class=tok,
    )
    opd.train()
    assert not any(k.startswith("nca/") for h in opd.state.log_history for k in h)


def test_checkpoint_holds_the_signal_and_a_resumed_run_continues_it(tok, tmp_path):
    steps = 2 * STALL_WINDOW + 2
    logs = []
    for resume in (False, True):
        out = tmp_path / ("resumed" if resume else "straight")
        args = make_args(
            tmp_path,
            output_dir=str(out),
            max_steps=steps,
            save_strategy="steps",
            save_steps=STALL_WINDOW + 1,
            nca_beta=0.5,
            learning_rate=5e-2,
        )
        trainer = NCATrainer(
            model=make_tiny_model(tok, 0),
            teacher_model=make_tiny_model(tok, 1),
            args=args,
            train_dataset=prompt_dataset(4 * steps),
            processing_class=tok,
        )
        if resume:
            checkpoint = tmp_path / "straight" / f"checkpoint-{STALL_WINDOW + 1}"
            assert json.loads((checkpoint / "nca_stall.json").read_text())["steps"] == STALL_WINDOW + 1
            trainer.train(resume_from_checkpoint=str(checkpoint))
        else:
            trainer.train()
        logs.append({h["step"]: h["nca/gap_left"] for h in trainer.state.log_history if "nca/gap_left" in h})
    assert logs[1] == logs[0] and max(logs[0]) == steps


# The (organism, seed) whose constant-anchor student stalled on both machines that ran it: docs/results.md 9.4
# (AVX-512) and 10 (AVX2).
STALLED_ORGANISM, STALLED_SEED = 7, 0


@pytest.mark.slow
def test_a_stalled_run_ends_flagged_and_warns(tmp_path, caplog):
    """The constant anchor on a shipped organism and seed where it stalls: the signal is on at the end, the run
    warns once, and the student has indeed not internalised (section 10's rule: Acc_x below 90% of OPD's 100%)."""
    from trl_nca.cli import compare

    config = tmp_path / "stall.yaml"
    config.write_text(
        f"""
model_name_or_path: organism
task: organism_shift
organism_seeds: [{STALLED_ORGANISM}]
seeds: [{STALLED_SEED}]
methods: ["constant:nca_beta=0.5,nca_beta_schedule=constant"]
eval_items: 48
track_every: 0
output_dir: {tmp_path / "out"}
max_steps: 100
logging_steps: 5
max_new_tokens: 12
per_device_train_batch_size: 16
learning_rate: 2.0e-3
lr_scheduler_type: constant
use_peft: true
lora_r: 8
lora_alpha: 16
lora_target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]
report_to: none
disable_tqdm: true
"""
    )
    with caplog.at_level(logging.WARNING, logger="trl_nca"):
        summary = compare(["--config", str(config)])
    folder = tmp_path / "out" / f"org{STALLED_ORGANISM}" / "constant" / f"seed{STALLED_SEED}"
    history = json.loads((folder / "done.json").read_text())["log_history"]
    assert [h["nca/stall"] for h in history if "nca/stall" in h][-1] == 1.0
    assert sum("Training ended stalled" in r.getMessage() for r in caplog.records) == 1
    (row,) = summary["per_seed"]["constant"]
    assert row["acc_x"] < 0.9
