"""Anchor-weight schedules in the trainer: their use step by step, exact resume, the checks at construction and the
model card (the schedules on their own: tests/core/test_schedule_rules.py)."""

import json
import logging
import math
from pathlib import Path

import pytest
import torch
import yaml
from test_trainer import make_args

from trl_nca import NCAConfig, NCATrainer
from trl_nca.core.schedule import AdaptiveSchedule, schedule_reads
from trl_nca.testing import SHORT_RUN, STORED32, cloned_parameters, make_tiny_model, prompt_dataset, run_args


# Tolerances: pytest.approx with its default tolerance compares float64 arithmetic on counts and rewards with exact
# fractions (error near 1e-16); trl_nca.testing names the tolerances of float computations.


def _logged_steps(trainer):
    return [entry for entry in trainer.state.log_history if "loss" in entry and "nca_beta" in entry]


@pytest.mark.parametrize("accumulation", [1, 2])
def test_trainer_uses_the_adaptive_weight_of_each_step(tok, tmp_path, accumulation):
    """Each logged step used the weight the formula gives from the previous step's logged terms, and its loss is
    opd_loss + nca_beta * nca_loss with that weight (also with gradient accumulation)."""
    args = make_args(
        tmp_path,
        max_steps=4,
        learning_rate=5e-2,
        nca_beta=0.5,
        nca_beta_schedule="adaptive",
        nca_adaptive_init=0.1,
        per_device_train_batch_size=4 // accumulation,
        gradient_accumulation_steps=accumulation,
    )
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=make_tiny_model(tok, 1),
        args=args,
        train_dataset=prompt_dataset(16),
        processing_class=tok,
    )
    trainer.train()
    steps = _logged_steps(trainer)
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    expected = AdaptiveSchedule(beta=0.5, adaptive_init=0.1)
    for entry in steps:
        assert entry["nca_beta"] == pytest.approx(expected.value, rel=1e-12)  # the same float64 updates, in order
        assert entry["loss"] == STORED32.approx(entry["opd_loss"] + entry["nca_beta"] * entry["nca_loss"])
        expected.update({"opd_loss": entry["opd_loss"], "view_kl": entry["view_kl"]})
    assert trainer.nca_beta == pytest.approx(expected.value, rel=1e-12)  # the same float64 updates, in order
    assert len({s["nca_beta"] for s in steps}) > 1  # the weight did move


def test_logging_steps_leave_the_anchor_weights_unchanged(tok, tmp_path):
    """The schedule follows the optimizer steps, not the logs: logging every third step gives every step the same
    adaptive weight (read by each step's loss) and the same final weight as logging every step."""
    from transformers import TrainerCallback

    class WeightOfEachStep(TrainerCallback):
        def __init__(self):
            self.trainer, self.weights = None, []

        def on_step_begin(self, args, state, control, **kwargs):
            self.weights.append(self.trainer.nca_beta)

    runs = []
    for logging_steps in (1, 3):
        args = make_args(
            tmp_path,
            output_dir=str(tmp_path / str(logging_steps)),
            max_steps=4,
            learning_rate=5e-2,
            nca_beta=0.5,
            nca_beta_schedule="adaptive",
            nca_adaptive_init=0.1,
            logging_steps=logging_steps,
        )
        weights = WeightOfEachStep()
        trainer = NCATrainer(
            model=make_tiny_model(tok, 0),
            teacher_model=make_tiny_model(tok, 1),
            args=args,
            train_dataset=prompt_dataset(16),
            processing_class=tok,
            callbacks=[weights],
        )
        weights.trainer = trainer
        trainer.train()
        runs.append((weights.weights, trainer.nca_beta, trainer.nca.schedule.steps_done))
    (every, final_every, done_every), (third, final_third, done_third) = runs
    assert len(every) == 4 and len(set(every)) > 1  # the weight moved at every step
    assert third == every and final_third == final_every
    assert done_every == done_third == 4  # the schedule counts Trainer's optimizer steps


def test_warmup_starts_without_anchor(tok, tmp_path):
    args = make_args(tmp_path, max_steps=3, nca_beta=0.5, nca_beta_schedule="warmup", nca_warmup_steps=2)
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0), args=args, train_dataset=prompt_dataset(8), processing_class=tok
    )
    trainer.train()
    steps = _logged_steps(trainer)
    assert [s["nca_beta"] for s in steps] == pytest.approx([0.0, 0.25, 0.5])
    assert steps[0]["loss"] == STORED32.approx(steps[0]["opd_loss"]) and steps[0]["nca_loss"] > 0


def test_constant_schedule_logs_its_weight(tok, tmp_path):
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0),
        args=make_args(tmp_path, nca_beta=0.25),
        train_dataset=prompt_dataset(4),
        processing_class=tok,
    )
    trainer.train()
    assert [s["nca_beta"] for s in _logged_steps(trainer)] == [0.25, 0.25]


def test_resume_restores_the_adaptive_weight_exactly(tok, tmp_path):
    """4 straight steps == 2 steps, checkpoint, resume for 2: same weights and the same anchor weights."""
    finals, betas = [], []
    for resume in (False, True):
        out = tmp_path / ("resumed" if resume else "straight")
        args = make_args(
            tmp_path,
            output_dir=str(out),
            max_steps=4,
            save_strategy="steps",
            save_steps=2,
            learning_rate=5e-2,
            nca_beta=0.5,
            nca_beta_schedule="adaptive",
            nca_adaptive_init=0.1,
        )
        trainer = NCATrainer(
            model=make_tiny_model(tok, 0),
            teacher_model=make_tiny_model(tok, 1),
            args=args,
            train_dataset=prompt_dataset(8),
            processing_class=tok,
        )
        if resume:
            checkpoint = out.parent / "straight" / "checkpoint-2"
            assert json.loads((checkpoint / "nca_schedule.json").read_text())["steps_done"] == 2
            trainer.train(resume_from_checkpoint=str(checkpoint))
        else:
            trainer.train()
        finals.append(cloned_parameters(trainer.model))
        betas.append({s["step"]: s["nca_beta"] for s in _logged_steps(trainer)})
    for name in finals[0]:
        assert torch.equal(finals[0][name], finals[1][name]), name
    assert betas[1] == betas[0] and set(betas[0]) == {1, 2, 3, 4}  # steps 1-2 come from the checkpoint
    assert not math.isclose(betas[0][3], 0.1)


def test_resuming_a_schedule_from_a_checkpoint_without_its_state_is_refused(tok, tmp_path):
    from transformers import TrainerState

    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (checkpoint / name).write_bytes(b"")
    TrainerState(global_step=2).save_to_json(str(checkpoint / "trainer_state.json"))  # complete but for the schedule
    args = make_args(tmp_path, nca_beta=0.5, nca_beta_schedule="warmup", nca_warmup_steps=2)
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0), args=args, train_dataset=prompt_dataset(4), processing_class=tok
    )
    with pytest.raises(ValueError, match="holds no nca_schedule.json"):
        trainer.train(resume_from_checkpoint=str(checkpoint))


def test_a_gate_a_live_self_teacher_can_never_open_is_refused_before_training(tok, tmp_path):
    """With self_teacher='live' and reverse-KL OPD, view_kl equals opd_loss at every step, so the gated anchor
    (nca_adaptive_init=0) never opens at a target >= 1: one error line at construction. Below 1 it opens at once."""

    def trainer(target):
        args = make_args(
            tmp_path,
            max_steps=2,
            nca_beta=0.5,
            nca_beta_schedule="adaptive",
            nca_adaptive_init=0.0,
            nca_adaptive_min=0.05,
            nca_adaptive_target=target,
            self_teacher="live",
        )
        return NCATrainer(
            model=make_tiny_model(tok, 0), args=args, train_dataset=prompt_dataset(4), processing_class=tok
        )

    for target in (1.0, 1.2):  # set by the user (1.1 is the default: see the test below)
        with pytest.raises(ValueError, match="can never turn the anchor on") as error:
            trainer(target)
        assert "\n" not in str(error.value) and "self_teacher='initial'" in str(error.value)
    opens = trainer(0.9)
    opens.train()
    steps = _logged_steps(opens)
    assert all(s["opd_loss"] == s["view_kl"] for s in steps)  # why the gate cannot open at a target >= 1
    assert [s["nca_beta"] for s in steps] == [0.0, 0.05]


def default_anchor_args(tmp_path, **fields):
    """A short run at the default anchor settings (the test presets pin the constant anchor)."""
    preset = {k: v for k, v in SHORT_RUN.items() if k != "nca_beta_schedule"}
    return run_args(NCAConfig, tmp_path / "out", preset, **fields)


def test_the_default_gate_a_live_self_teacher_can_never_open_falls_back_to_the_constant_anchor(tok, tmp_path, caplog):
    """Left at its defaults, the gated anchor with self_teacher='live' and reverse-KL OPD (where its gate can never
    open) becomes the paper's constant anchor, with one warning: every step is weighted by nca_beta."""
    import logging

    args = default_anchor_args(tmp_path, max_steps=2, nca_beta=0.5, self_teacher="live")
    assert args.nca_beta_schedule == "gated"  # the default: the gated anchor
    with caplog.at_level(logging.WARNING):
        trainer = NCATrainer(
            model=make_tiny_model(tok, 0), args=args, train_dataset=prompt_dataset(4), processing_class=tok
        )
    warned = [r.getMessage() for r in caplog.records if "its gate can never open" in r.getMessage()]
    assert len(warned) == 1 and "nca_beta_schedule='constant'" in warned[0], warned
    trainer.train()
    assert [s["nca_beta"] for s in _logged_steps(trainer)] == [0.5, 0.5]


def test_the_default_is_the_gated_anchor_and_plain_opd_needs_no_schedule(tok, tmp_path):
    """The defaults: the anchor is off (weight 0) until the first step whose view_kl exceeds 1.1 x opd_loss, then
    starts at 0.05; nca_beta=0 (plain OPD) runs under the default schedule settings with weight 0 throughout."""
    args = default_anchor_args(tmp_path, max_steps=1, nca_beta=0.5)
    schedule = NCATrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=make_tiny_model(tok, 1),
        args=args,
        train_dataset=prompt_dataset(4),
        processing_class=tok,
    ).nca.schedule
    assert (schedule.kind, schedule.value, schedule.beta) == ("gated", 0.0, 0.5)
    assert schedule.update({"opd_loss": 1.0, "view_kl": 1.1}) == 0.0  # not above the target: still off
    assert schedule.update({"opd_loss": 1.0, "view_kl": 1.2}) == 0.05  # above it: on, at the minimum
    opd = NCATrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=make_tiny_model(tok, 1),
        args=default_anchor_args(tmp_path, nca_beta=0.0),
        train_dataset=prompt_dataset(4),
        processing_class=tok,
    )
    assert opd.nca.schedule.kind == "constant" and opd.nca_beta == 0.0


@pytest.mark.parametrize(
    "fields, says",
    [
        ({}, "trl-nca's default gated anchor"),
        ({"nca_beta_schedule": "constant"}, "the paper's constant one: `nca_beta=0.5`"),
        ({"nca_beta": 0.0}, "plain on-policy context distillation"),
    ],
)
def test_model_card_says_which_anchor_the_run_used(tok, tmp_path, fields, says):
    """The model card cites the paper; the line after the method's name says which anchor weighed the run."""
    args = default_anchor_args(tmp_path, **{"nca_beta": 0.5, **fields})
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=make_tiny_model(tok, 1),
        args=args,
        train_dataset=prompt_dataset(4),
        processing_class=tok,
    )
    trainer.create_model_card(model_name="student")
    card = (tmp_path / "out" / "README.md").read_text()
    named = card.index("This model was trained with NCA")
    assert says in card[named : card.index("\n\n", card.index("\n", named) + 2) + 1] and "2606.11627" in card


SCHEDULE_SETTINGS = ("max_steps", "nca_beta", *schedule_reads())  # what decides a run's schedule and its checks


@pytest.mark.parametrize("path", sorted(Path("examples/configs/results").glob("*.yaml")), ids=lambda p: p.stem)
def test_the_shipped_result_configs_build_every_method_without_a_warning(tmp_path, caplog, path):
    """The result configs pin the adaptive fields under `nca_beta_schedule: constant` for the methods that switch the
    schedule (anchor-shift.yaml, fr-30-default.yaml): each method's config is built as `compare` builds it (the shared
    settings with the method's overrides) and names nothing, since the schedule fields a method's own schedule does
    not read are named by `trl-nca train` only (`core.schedule.unread_settings`), not by the config."""
    config = yaml.safe_load(path.read_text())
    shared = {k: v for k, v in config.items() if k in SCHEDULE_SETTINGS}
    for spec in config.get("methods", ["default"]):
        _, _, overrides = spec.partition(":")
        method = {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in overrides.split(",") if item)}
        with caplog.at_level(logging.WARNING, logger="trl_nca"):
            run_args(
                NCAConfig, tmp_path, {}, **{**shared, **{k: v for k, v in method.items() if k in SCHEDULE_SETTINGS}}
            )
    assert [r.getMessage() for r in caplog.records if r.name.startswith("trl_nca")] == []


def test_a_warmup_longer_than_the_run_is_said_by_the_config_and_the_model_card(tok, tmp_path, caplog):
    """nca_warmup_steps=1000 with max_steps=1: one warning when the config is built, and the model card says what the
    run did (its only step weighed the anchor at 0), not that it warmed up over 1000 steps."""
    with caplog.at_level(logging.WARNING, logger="trl_nca.trainers.nca_config"):
        args = default_anchor_args(
            tmp_path, max_steps=1, nca_beta=0.5, nca_beta_schedule="warmup", nca_warmup_steps=1000
        )
    assert [r.getMessage() for r in caplog.records].count(
        "nca_warmup_steps=1000 is not shorter than the run (max_steps=1): the anchor never reaches nca_beta=0.5, its "
        "last step weighs it at 0. Set nca_warmup_steps below max_steps, or nca_beta_schedule='constant'."
    ) == 1
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=make_tiny_model(tok, 1),
        args=args,
        train_dataset=prompt_dataset(4),
        processing_class=tok,
    )
    trainer.train()
    trainer.create_model_card(model_name="student")
    card = (tmp_path / "out" / "README.md").read_text()
    assert "warmed up linearly" not in card
    assert "but the run ended after 1 optimizer step, the last weighing the anchor at 0 (it never acted)" in card
