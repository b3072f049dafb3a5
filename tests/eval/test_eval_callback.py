"""PairedEvalCallback in a 2-step NCATrainer run: metrics are logged, a report is written, training is unchanged."""

import json
import random

import numpy as np
import pytest
import torch
from datasets import Dataset

from trl_nca import NCAConfig, NCATrainer
from trl_nca.core.views import ContextSpec
from trl_nca.eval import GenerationSettings
from trl_nca.eval.callback import PairedEvalCallback, preserved_rng_state
from trl_nca.testing import CONTEXT, CPU, make_tiny_model, run_args


def train_dataset(n=4):
    return Dataset.from_dict(
        {"prompt": [f"Which answer? {i} (A) yes (B) no" for i in range(n)], "context": [CONTEXT] * n}
    )


def eval_rows(n=3):
    return [{"prompt": f"Question {i}: (A) yes (B) no", "answer": "AB"[i % 2], "context": CONTEXT} for i in range(n)]


def rng_hungry_scorer(text, label):
    """A scorer that consumes every global RNG, as careless user code would; the callback must hide it."""
    random.random()
    np.random.rand()
    torch.rand(3)
    return "<answer>" in text


def train(tok, tmp_path, callback=None):
    args = run_args(
        NCAConfig,
        tmp_path / "out",
        CPU,
        nca_beta=0.5,
        max_new_tokens=8,
        per_device_train_batch_size=2,
        max_steps=2,
        save_strategy="no",
        logging_steps=1,
        seed=7,
        data_seed=7,
    )
    trainer = NCATrainer(
        model=make_tiny_model(tok), args=args, train_dataset=train_dataset(), processing_class=tok
    )  # self-distillation teacher: the student's initial weights
    if callback is not None:
        trainer.add_callback(callback.bind(trainer))
    trainer.train()
    return trainer


def make_callback(tmp_path, **kwargs):
    return PairedEvalCallback(
        eval_rows(),
        context=ContextSpec(),
        scorer=rng_hungry_scorer,
        eval_steps=1,
        num_items=3,
        generation=GenerationSettings(max_new_tokens=6, batch_size=2),
        output_dir=str(tmp_path / "paired"),
        n_bootstrap=20,
        **kwargs,
    )


def test_callback_does_not_change_training(tok, tmp_path):
    plain = train(tok, tmp_path / "plain")
    callback = make_callback(tmp_path)
    with_eval = train(tok, tmp_path / "with", callback)
    for (name, a), (_, b) in zip(plain.model.named_parameters(), with_eval.model.named_parameters()):
        assert torch.equal(a, b), name
    assert not torch.equal(
        next(plain.model.parameters()), next(make_tiny_model(tok).parameters())
    )  # training did move the weights

    # evaluated after steps 1 and 2; the final report reuses step 2's records
    assert [entry["step"] for entry in callback.history] == [1, 2]
    logged = [entry for entry in with_eval.state.log_history if "paired/acc_x" in entry]
    assert [entry["step"] for entry in logged] == [1, 2]
    assert {"paired/acc_xc", "paired/harm_unconditional", "paired/length_x_mean", "paired/mcnemar_p"} <= set(logged[0])
    assert with_eval.model.training

    # The trainer's own per-step logs are all there, and equal to the run without the callback.
    def own_logs(trainer):
        return [{k: v for k, v in e.items() if "paired/" not in k} for e in trainer.state.log_history if "loss" in e]

    assert [entry["step"] for entry in own_logs(with_eval)] == [1, 2]
    assert own_logs(with_eval) == own_logs(plain)
    out = tmp_path / "paired"
    assert len((out / "history.jsonl").read_text().splitlines()) == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["models"][0]["name"] == "student" and summary["models"][0]["metrics"]["n"] == 3
    assert summary["models"][0]["provenance"]["step"] == 2
    assert (out / "report.md").exists() and (out / "student" / "records.jsonl").exists()


def test_evaluate_restores_mode_and_rng(tok, tmp_path):
    callback = make_callback(tmp_path)
    model = make_tiny_model(tok)
    for training in (True, False):
        model.train(training)
        torch.manual_seed(0)
        expected = torch.rand(2)
        torch.manual_seed(0)
        callback.evaluate(model, tok, step=0)
        assert torch.equal(torch.rand(2), expected)
        assert model.training is training


def test_preserved_rng_state():
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    expected = (random.random(), np.random.rand(), torch.rand(1))
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    with preserved_rng_state():
        random.random(), np.random.rand(), torch.rand(5)
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected


def test_without_trainer_metrics_go_to_log_history(tok, tmp_path):
    from transformers import TrainerState, TrainingArguments

    callback = make_callback(tmp_path, final_report=False)
    state = TrainerState()
    state.global_step = 4
    args = TrainingArguments(output_dir=str(tmp_path / "o"), report_to=[], use_cpu=True)
    callback.on_step_end(args, state, None, model=make_tiny_model(tok), processing_class=tok)
    assert state.log_history[-1]["step"] == 4 and "paired/acc_x" in state.log_history[-1]


@pytest.mark.parametrize("zero3, processes", [(True, 2), (True, 1), (False, 2)])
def test_refused_under_multi_process_zero3(monkeypatch, zero3, processes):
    """On the main process alone, generation under ZeRO-3 would wait for the other processes' shards forever: the
    callback refuses at the trainer's init (on_init_end); one process, or DDP/ZeRO-2, is fine."""
    from types import SimpleNamespace

    monkeypatch.setattr("transformers.integrations.deepspeed.is_deepspeed_zero3_enabled", lambda: zero3)
    callback = PairedEvalCallback(
        Dataset.from_dict({"prompt": ["Q?"], "answer": ["A"], "context": ["c"]}), context=ContextSpec(column="context")
    )
    args = SimpleNamespace(world_size=processes)
    if zero3 and processes > 1:
        with pytest.raises(ValueError, match="ZeRO-3 holds one shard"):
            callback.on_init_end(args, None, None)
    else:
        callback.on_init_end(args, None, None)
