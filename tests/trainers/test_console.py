"""What a run prints (issue 38 items 1 and 5, `trl_nca.console`, `trl_nca.trainers.console`, `trl_nca.cli.explain`): one compact line per
logging step (the full dicts behind `TRL_NCA_VERBOSE=1` / `--verbose`), the phase-named bar, the libraries' bars off,
the training estimate from this run's first steps checked against the measured time, and the opening and closing
lines of the commands. Printing never changes what is recorded: `log_history` is the same in both modes."""

import json
import re
import time
import types

import pytest
import torch

from trl_nca import NCAConfig, NCATrainer, console
from trl_nca.testing import SHORT_RUN, make_tiny_model, prompt_dataset, run_args
from trl_nca.trainers import console as trainer_console
from trl_nca.trainers.console import (
    CompactPrinterCallback,
    PhaseProgressCallback,
    TrainingEstimate,
    compact_log_line,
    explain_training,
)


STEP_LOG = {
    "loss": 0.4123,
    "grad_norm": 0.07,
    "learning_rate": 0.001,
    "opd_loss": 0.4,
    "nca_loss": 0.0123,
    "view_kl": 0.0123,
    "completions/mean_length": 3.0,
    "nca_beta": 0.05,
    "nca/stall": 0.0,
    "epoch": 0.25,
}


def test_a_training_log_is_one_compact_line():
    line = compact_log_line(STEP_LOG, 3, 30, 3.21)
    assert line == "step 3/30  loss 0.412  opd 0.4  nca 0.0123  beta 0.05  lr 1e-3  3.21 s/step"
    assert compact_log_line({**STEP_LOG, "nca/stall": 1.0}, 3, 30, None).endswith("stall on")
    tracked = {
        "paired/n": 32,
        "paired/acc_x": 0.5,
        "paired/acc_xc": 0.25,
        "paired/n_correct_x": 16,
        "paired/n_correct_xc": 8,
        "paired/harm_count": 9.5,
        "paired/help_count": 1.5,
        "paired/mcnemar_p": 0.6,
        "epoch": 1.0,
    }
    # rates in % with their counts, as the tables print them (expected counts, fractional with several samples)
    assert compact_log_line(tracked, 10, 40, None) == (
        "track step 10/40  Acc_x 50.0% (16/32)  Acc_xc 25.0% (8/32)  Harm 59.4% (9.5/16)  Help 9.4% (1.5/16)"
    )
    nothing_right = {**tracked, "paired/n_correct_x": 0, "paired/harm_count": 0, "paired/help_count": 8}
    assert "Harm n/a (0/0)  Help 25.0% (8/32)" in compact_log_line(nothing_right, 10, 40, None)
    end = {"train_runtime": 12.5, "train_samples_per_second": 3.0, "train_loss": 0.2, "epoch": 1.0}
    assert compact_log_line(end, 5, 5, None) == "trained to step 5/5 in 12 s (2.5 s/step), mean loss 0.2"
    assert (
        compact_log_line({"eval_loss": 0.3, "eval_runtime": 1.0, "epoch": 1}, 5, 5, None)
        == "eval step 5/5  eval_loss 0.3"
    )


def tiny_trainer(tok, tmp_path, **fields):
    torch.manual_seed(0)
    args = run_args(NCAConfig, tmp_path / "out", SHORT_RUN, **{"max_steps": 3, **fields})
    return NCATrainer(model=make_tiny_model(tok, 0), args=args, train_dataset=prompt_dataset(6), processing_class=tok)


def _records(history):
    timing = ("train_runtime", "train_samples_per_second", "train_steps_per_second")
    return [{k: v for k, v in entry.items() if k not in timing} for entry in history]


@pytest.mark.parametrize("disable_tqdm", [True, False], ids=["printer", "bar"])
def test_each_logging_step_is_one_line_and_verbose_prints_the_dicts(tok, tmp_path, capsys, monkeypatch, disable_tqdm):
    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    trainer = tiny_trainer(tok, tmp_path, disable_tqdm=disable_tqdm)
    kinds = {type(cb) for cb in trainer.callback_handler.callbacks}
    assert (CompactPrinterCallback if disable_tqdm else PhaseProgressCallback) in kinds
    trainer.train()
    out = capsys.readouterr().out
    steps = [line for line in out.splitlines() if re.match(r"step \d/3  loss ", line)]
    assert len(steps) == 3 and all(line.endswith(" s/step") for line in steps), out
    assert "{'loss'" not in out and "trained to step 3/3 in " in out
    compact = _records(trainer.state.log_history)
    assert all("opd_loss" in entry for entry in compact[:-1])  # the full dicts are still recorded

    monkeypatch.setenv(console.VERBOSE_ENV, "1")
    trainer = tiny_trainer(tok, tmp_path, disable_tqdm=disable_tqdm)
    trainer.train()
    out = capsys.readouterr().out
    assert out.count("{'loss'") == 3 and not re.search(r"^step \d/3  loss ", out, re.M)
    assert _records(trainer.state.log_history) == compact  # printing changes nothing that is recorded


def test_the_bar_is_named_for_its_phase_and_left_out_of_log_files(tok, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    trainer = tiny_trainer(tok, tmp_path, disable_tqdm=False, max_steps=1)
    trainer.train()
    assert "training:" not in capsys.readouterr().err  # stderr is no terminal here: no bar redrawn line after line
    monkeypatch.setattr(console, "on_terminal", lambda: True)
    trainer = tiny_trainer(tok, tmp_path, disable_tqdm=False, max_steps=1)
    explain_training(trainer, "training nca/seed0")
    explain_training(trainer)  # idempotent: one bar, one estimate
    callbacks = trainer.callback_handler.callbacks
    assert sum(isinstance(cb, PhaseProgressCallback) for cb in callbacks) == 1
    assert sum(isinstance(cb, TrainingEstimate) for cb in callbacks) == 1
    trainer.train()
    assert "training nca/seed0: 100%" in capsys.readouterr().err


def test_the_training_estimate_comes_from_the_second_step_and_holds(tok, tmp_path, capsys, monkeypatch):
    """The printed estimate is the second step's measured time (the first holds the warm-up) times the steps left,
    checked against the measured time of the steps after it. The bound is loose because the machine may be shared."""
    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    trainer = tiny_trainer(tok, tmp_path, disable_tqdm=True, max_steps=12, logging_steps=4)
    printed = []
    monkeypatch.setattr(trainer_console, "say", lambda line, level=None: printed.append((line, time.perf_counter())))
    trainer.train()
    end = time.perf_counter()
    ((line, at),) = [(line, at) for line, at in printed if line.startswith("Training: the first step took")]
    assert "for the 10 steps left of 12" in line and "measured in this run" in line
    more = float(re.search(r"about ([\d.]+) s more", line).group(1))
    measured = end - at
    assert measured / 3 < more < 3 * measured, (more, measured)


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_estimate_adds_the_tracking_evaluations(monkeypatch, capsys):
    """A tracking callback's evaluation before the first step is timed and counted once per evaluation left; one
    ending the second step is taken out of its time (a clock driven by hand)."""
    clock = _Clock()
    monkeypatch.setattr(trainer_console.time, "perf_counter", clock)
    tracker = types.SimpleNamespace(eval_steps=2, eval_on_start=True)
    estimate = TrainingEstimate(types.SimpleNamespace(callbacks=[tracker]), phase="training x")
    begins = trainer_console._TrainBegins(estimate)
    state = types.SimpleNamespace(global_step=0, max_steps=10, is_world_process_zero=True)
    begins.on_train_begin(None, state, None)
    clock.now = 5.0  # the evaluation at step 0 took 5 s
    estimate.on_train_begin(None, state, None)
    for step, now in ((1, 9.0), (2, 15.0)):  # a first step of 4 s (warm-up), a second of 1 s and a 5 s evaluation
        clock.now, state.global_step = now, step
        estimate.on_step_end(None, state, None)
    line = capsys.readouterr().out.strip()
    assert line == (
        "Training x: the first step took 4.0 s (with one-time warm-up), the second 1.00 s, so about 28 s more for the "
        "8 steps left of 10 and 4 tracking evaluations of 5.0 s (the second step's rate, measured in this run; not a "
        "bound)."
    )


def test_the_commands_turn_the_libraries_bars_off_unless_verbose(monkeypatch):
    import datasets
    import transformers

    from trl_nca.cli import main

    logging = transformers.utils.logging
    try:
        monkeypatch.setenv(console.VERBOSE_ENV, "0")  # undone after the test, with what --verbose sets
        with pytest.raises(SystemExit):  # a command that runs (no output folder given: one line, exit status 2)
            main(["eval"])
        assert not logging.is_progress_bar_enabled() and datasets.is_progress_bar_enabled() is False
        logging.enable_progress_bar(), datasets.enable_progress_bars()
        with pytest.raises(SystemExit):
            main(["eval", "--verbose"])
        assert logging.is_progress_bar_enabled() and not console.verbose()  # --verbose held for that command only
    finally:
        logging.enable_progress_bar()
        datasets.enable_progress_bars()


def train_argv(model, data, out, *extra):
    return [
        "train",
        "--model_name_or_path",
        str(model),
        "--dataset_name",
        str(data),
        "--context_text",
        "Answer A.",
        "--per_device_train_batch_size",
        "2",
        "--max_steps",
        "3",
        "--max_new_tokens",
        "3",
        "--learning_rate",
        "1e-3",
        "--save_strategy",
        "no",
        "--output_dir",
        str(out),
        "--bf16",
        "false",
        "--use_cpu",
        "true",
        "--report_to",
        "none",
        "--gradient_checkpointing",
        "false",
        "--disable_tqdm",
        "true",
        "--logging_steps",
        "1",
        *extra,
    ]


def test_train_opens_with_what_it_will_do_and_closes_with_time_and_outputs(tiny_dir, tmp_path, capsys, monkeypatch):
    from trl_nca.cli import main

    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Question {i}?", "answer": "A"}) + "\n" for i in range(4)))
    assert main(train_argv(tiny_dir, data, tmp_path / "out")) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == (
        f"trl-nca train: distil the context into all weights of {tiny_dir} (1 student; teacher: the student itself, "
        f"reading the context) for 3 steps of 2 prompts (per device) from 4 rows of {data}; output {tmp_path / 'out'}; "
        "time: printed after the second training step, from its rate measured in this run (no default is assumed)."
    )
    assert re.fullmatch(
        rf"trl-nca train: done in [\d.]+ s; model: {tmp_path / 'out'}; settings: {tmp_path / 'out'}/train_settings.json\.",
        lines[-1],
    )
    # opening, 3 steps, the estimate, the end of training, closing: nothing else
    assert len(lines) == 7, lines


def test_eval_opens_with_its_models_and_items_and_closes_with_its_outputs(tiny_dir, tmp_path, capsys):
    from trl_nca.cli import main
    from trl_nca.testing import CONTEXT

    data = tmp_path / "items.jsonl"
    rows = [{"prompt": f"Which? {i} (A) yes (B) no", "answer": "A", "context": CONTEXT} for i in range(4)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out"
    argv = [
        "eval",
        "--model",
        f"base={tiny_dir}",
        "--dataset",
        str(data),
        "--max-new-tokens",
        "4",
        "--batch-size",
        "2",
        "--bootstrap",
        "0",
        "--no-plots",
        "--output-dir",
        str(out),
    ]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == (
        f"trl-nca eval: evaluate 1 model (base) paired on 4 items x 2 views (without and with the context) x 1 sample, "
        f"at most 4 new tokens each; output {out}; time: printed after each model's first chunk of items, from its "
        "rate measured in this run."
    )
    assert re.fullmatch(
        rf"trl-nca eval: done in [\d.]+ s; report: {out}/report.md; summary: {out}/summary.json; records: {out}\.",
        lines[-1],
    )


def test_an_evaluation_bar_is_named_for_its_model(tok, capsys, monkeypatch):
    from trl_nca.core.views import ContextSpec
    from trl_nca.eval import GenerationSettings, PairedEvaluator
    from trl_nca.testing import CONTEXT

    monkeypatch.setattr(console, "on_terminal", lambda: True)
    rows = [{"prompt": f"Which? {i} (A) yes (B) no", "answer": "A", "context": CONTEXT} for i in range(2)]
    evaluator = PairedEvaluator(rows, context=ContextSpec(), generation=GenerationSettings(max_new_tokens=2))
    evaluator.run(make_tiny_model(tok).eval(), tok, desc="paired eval opd/seed0")
    assert "paired eval opd/seed0 (0 done): 100%" in capsys.readouterr().err


def test_progress_lines_name_their_unit_and_follow_the_log_level(monkeypatch, capsys):
    """Several students at once: each progress line names its student (a `say` line and a `trl_nca` logger's progress
    record alike); `--quiet` keeps neither, compare's default (`units`) keeps a unit's lines but not a step's."""
    import logging

    from trl_nca.console import PROGRESS, install_log_handler, say, speaking_for, take_output_flags

    install_log_handler()
    log = logging.getLogger("trl_nca.eval.paired")
    for level, shown in (("steps", {"units", "steps"}), ("units", {"units"}), ("quiet", set())):
        monkeypatch.setenv(console.LOG_ENV, level)
        with speaking_for("opd/org0/seed1"):
            say("Paired evaluation: about 4 s", level="units")
            say("step 5/100  loss 1", level="steps")
            say("opd/org0/seed1 finished (1 of 12 students)", level="units")  # names it already
            log.warning("Paired evaluation: 8 s in all", extra={PROGRESS: "steps"})
            log.warning("a problem")  # not a progress line: always printed, as it was
        say("trl-nca compare: done")  # no unit, no level: always
        out, err = capsys.readouterr()
        expected = [] if "units" not in shown else ["[opd/org0/seed1] Paired evaluation: about 4 s"]
        expected += ["[opd/org0/seed1] step 5/100  loss 1"] if "steps" in shown else []
        expected += ["opd/org0/seed1 finished (1 of 12 students)"] if "units" in shown else []
        assert out.splitlines() == [*expected, "trl-nca compare: done"], (level, out)
        errors = ["[opd/org0/seed1] Paired evaluation: 8 s in all"] if "steps" in shown else []
        assert err.splitlines() == [*errors, "a problem"], (level, err)
    monkeypatch.delenv(console.LOG_ENV)
    assert take_output_flags(["--config", "x", "--quiet"], "units") == ["--config", "x"]
    assert console.log_level() == "quiet"
    monkeypatch.delenv(console.LOG_ENV)
    assert take_output_flags(["--full_log"], "units") == [] and console.log_level() == "steps"


def test_the_whole_job_estimate_is_its_pace_times_the_units_left(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(console.time, "perf_counter", clock)
    job = console.JobEstimate(4)
    clock.now = 100.0
    assert job.finished("opd/org0/seed0") == (
        "opd/org0/seed0 finished (1 of 4 students, 100 s since the start); the whole job: about 5 min more for the "
        "3 students left (this job's pace so far, measured in this run; not a bound)."
    )
    clock.now = 110.0  # 55 s a student so far
    assert "(2 of 4 students, 110 s since the start); the whole job: about 110 s more for the 2" in job.finished("n")
    clock.now = 400.0
    job.finished("a"), job.finished("b")
    assert job.done == 4


def test_the_whole_job_estimate_counts_the_workers(monkeypatch):
    """Two workers, a student 100 s each: the two students that finish at once give the same pace (issue 57: the
    estimate was 'about 32 min more', then 'about 16 min' seconds later), half of one worker's."""
    clock = _Clock()
    monkeypatch.setattr(console.time, "perf_counter", clock)
    job = console.JobEstimate(6, workers=2)
    clock.now = 100.0
    assert "about 4 min more for the 5 students left, 2 at a time" in job.finished(
        "a", 100.0
    )  # 5 x 100 / 2 s, then 4 x 100 / 2 s
    clock.now = 102.0
    assert "about 3 min more for the 4 students left, 2 at a time" in job.finished("b", 100.0)
    clock.now = 400.0
    job.finished("c", 100.0), job.finished("d", 100.0)
    assert job.finished("e", 100.0).endswith(
        "about 100 s more for the 1 student left (this job's pace so far, measured in this run; not a bound)."
    )
