"""NCATrainer as a drop-in for GKDTrainer: shared fields keep their meaning, and what cannot work fails at init.

The configurations below are those of TRL's own GKD tests (short `max_length`, long prompts under the default), run
on tiny local models: each trains under `GKDTrainer` and must train under `NCATrainer`.
"""

import logging

import pytest
import torch
from datasets import Dataset
from trl.experimental.gkd import GKDConfig, GKDTrainer
from trl.experimental.utils import DataCollatorForChatML

from trl_nca import NCAConfig, NCATrainer
from trl_nca.core.views import render_prompt_ids
from trl_nca.testing import CONTEXT, CPU, KL32, full_logprobs, make_tiny_model, record_batches, run_args, token_kl
from trl_nca.trainers.data import NCACollator


LONG = " ".join(f"rule {i}: push the box onto the target." for i in range(120))  # well over 1024 tokens
MEDIUM = " ".join(["ok"] * 15)  # a 46-token reference answer: with its 32-token prompt over 64 tokens


# Fields that GKDConfig and NCAConfig share, with their GKD meaning (`run_args(GKDConfig or NCAConfig, ...)`).
SHARED = {
    **CPU,
    "max_steps": 1,
    "per_device_train_batch_size": 2,
    "max_new_tokens": 8,
    "save_strategy": "no",
    "logging_steps": 1,
    "lmbda": 0.5,
    "beta": 0.5,
    "seed": 0,
}


def conversations(long_prompt=False, long_answer=False):
    prompt = LONG if long_prompt else "Which answer? (A) yes (B) no"
    answer = "<answer>A</answer>" + (" because " + MEDIUM if long_answer else "")
    rows = [[{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]] * 2
    return Dataset.from_dict({"messages": rows, "context": [CONTEXT] * 2})


CASES = {
    "max_length_64": (dict(max_length=64), dict(long_answer=True)),  # TRL's GKD test configs use max_length=64
    "long_prompt_default_max_length": ({}, dict(long_prompt=True)),  # prompt alone > the default max_length=1024
}


@pytest.mark.parametrize("case", list(CASES))
def test_configs_that_train_under_gkd_train_under_nca(tok, tmp_path, case, caplog):
    config, data = CASES[case]
    dataset = conversations(**data)
    gkd = GKDTrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=make_tiny_model(tok, 1),
        args=run_args(GKDConfig, tmp_path / "gkd" / "out", SHARED, **config),
        train_dataset=dataset,
        processing_class=tok,
    )
    gkd.train()
    assert gkd.state.global_step == 1

    with caplog.at_level(logging.WARNING, logger="trl_nca.trainers.data"):
        nca = NCATrainer(
            model=make_tiny_model(tok, 0),
            teacher_model=make_tiny_model(tok, 1),
            args=run_args(NCAConfig, tmp_path / "nca" / "out", SHARED, **config),
            train_dataset=dataset,
            processing_class=tok,
        )
    max_length = nca.args.max_length
    assert (
        f"2 rows of the train dataset have a prompt plus reference completion longer than max_length={max_length}"
        in (caplog.text)
    )
    row = nca.train_dataset[0]
    assert row["prompt_ids"] == render_prompt_ids(tok, dataset[0]["messages"][:1])  # never truncated
    assert len(row["prompt_ids"]) + len(row["completion_ids"]) > max_length
    assert tok.decode(row["completion_ids"]).startswith(dataset[0]["messages"][1]["content"])
    nca.train()
    assert nca.state.global_step == 1


def test_sampling_is_not_limited_by_max_length(tok, tmp_path):
    """GKD never limits sampling by max_length: neither does NCA (prompt + max_new_tokens > max_length is fine)."""
    data = Dataset.from_dict({"prompt": ["Which answer? (A) yes (B) no"] * 2, "context": [CONTEXT] * 2})
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=make_tiny_model(tok, 1),
        args=run_args(NCAConfig, tmp_path / "out", SHARED, lmbda=1.0, max_length=16, max_new_tokens=24),
        train_dataset=data,
        processing_class=tok,
    )
    batches = record_batches(trainer)
    trainer.train()
    (batch,) = batches
    prompt_length = len(render_prompt_ids(tok, [{"role": "user", "content": data[0]["prompt"]}]))
    assert prompt_length > 16  # max_length leaves no room for a completion at all
    assert batch.prompt_attention_mask.sum(1).tolist() == [prompt_length] * 2
    lengths = batch.completion_mask.sum(1).tolist()
    ended = batch.completion_ids.gather(1, (batch.completion_mask.sum(1, keepdim=True) - 1).clamp(min=0))
    for length, last in zip(lengths, ended[:, 0].tolist()):
        assert length == 24 or last == tok.eos_token_id, "a completion stopped before max_new_tokens without an EOS"
    assert max(lengths) == 24  # sampled up to max_new_tokens, past max_length


@pytest.mark.parametrize("name", ["compute_metrics", "preprocess_logits_for_metrics"])
def test_metrics_hooks_that_would_never_be_called_are_refused(tok, tmp_path, name):
    with pytest.raises(ValueError, match=rf"does not take `{name}`.*never materialises logits.*PairedEvalCallback"):
        NCATrainer(
            model=make_tiny_model(tok, 0),
            teacher_model=make_tiny_model(tok, 1),
            args=run_args(NCAConfig, tmp_path / "out", SHARED),
            train_dataset=conversations(),
            processing_class=tok,
            **{name: lambda *a: {}},
        )


def test_incompatible_data_collator_is_refused_at_init(tok, tmp_path):
    kwargs = dict(
        args=run_args(NCAConfig, tmp_path / "out", SHARED), train_dataset=conversations(), processing_class=tok
    )
    with pytest.raises(ValueError, match=r"batch lacks \['context_prompts', .*'has_reference'\].*NCACollator"):
        NCATrainer(
            model=make_tiny_model(tok, 0),
            teacher_model=make_tiny_model(tok, 1),
            data_collator=DataCollatorForChatML(tokenizer=tok),
            **kwargs,
        )

    def broken(examples):
        raise KeyError("question")

    with pytest.raises(ValueError, match=r"data_collator failed on the first train example \(KeyError.*'prompts'"):
        NCATrainer(model=make_tiny_model(tok, 0), teacher_model=make_tiny_model(tok, 1), data_collator=broken, **kwargs)

    class Extended(NCACollator):  # a collator that produces NCA's keys and more is fine
        def __call__(self, examples):
            return {**super().__call__(examples), "row_ids": torch.arange(len(examples))}

    trainer = NCATrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=make_tiny_model(tok, 1),
        data_collator=Extended(pad_token_id=tok.pad_token_id),
        **kwargs,
    )
    trainer.train()


def reference_means(student, teacher, batch):
    """Token means of OPD (reverse KL), NCA and the view KL from full logits."""
    completions = (batch["completion_ids"], batch["completion_mask"])
    with torch.no_grad():
        lx = full_logprobs(student, batch["prompts"], batch["prompt_attention_mask"], *completions)
        lc = full_logprobs(student, batch["context_prompts"], batch["context_prompt_attention_mask"], *completions)
        lt = full_logprobs(teacher, batch["context_prompts"], batch["context_prompt_attention_mask"], *completions)
    return {"opd": token_kl(lx, lt).mean().item(), "nca": token_kl(lx, lc).mean().item()}


def ragged_eval_set(n=3):
    rows = [
        [
            {"role": "user", "content": f"Question {i}?"},
            {"role": "assistant", "content": "<answer>A</answer>" + " ok" * 3 * i},
        ]
        for i in range(n)
    ]
    return Dataset.from_dict({"messages": rows, "context": [CONTEXT] * n})


@pytest.mark.parametrize("mode", ["dataset", "on_policy"])
def test_eval_completions_choose_what_evaluation_scores(tok, tmp_path, mode):
    """'dataset' scores the eval set's references, as GKD does (equal to a full-logit reference over the whole set);
    'on_policy' samples; `eval_completions/on_policy` logs which one was evaluated."""
    student, teacher = make_tiny_model(tok, 0), make_tiny_model(tok, 1)
    eval_set = ragged_eval_set()
    trainer = NCATrainer(
        model=student,
        teacher_model=teacher,
        processing_class=tok,
        train_dataset=conversations(),
        eval_dataset=eval_set,
        args=run_args(
            NCAConfig,
            tmp_path / "out",
            SHARED,
            per_device_eval_batch_size=2,
            eval_completions=mode,
            beta=1.0,
            nca_beta_schedule="constant",
        ),
    )
    metrics = trainer.evaluate()
    assert metrics["eval_completions/on_policy"] == (1.0 if mode == "on_policy" else 0.0)
    batch = trainer.data_collator([trainer.eval_dataset[i] for i in range(3)])
    reference_length = batch["completion_mask"].sum().item() / 3
    if mode == "dataset":
        ref = reference_means(student, teacher, batch)
        assert metrics["eval_loss"] == KL32.approx(ref["opd"] + 0.5 * ref["nca"])  # float32 model, float64 reference
        assert metrics["eval_opd_loss"] == KL32.approx(ref["opd"])
        assert metrics["eval_completions/mean_length"] == pytest.approx(reference_length)
        again = trainer.evaluate()  # deterministic: the same computation twice, bit for bit
        assert {k: again[k] for k in metrics if "_loss" in k} == {k: metrics[k] for k in metrics if "_loss" in k}
    else:
        assert metrics["eval_completions/mean_length"] != pytest.approx(reference_length)


def test_eval_completions_dataset_needs_references(tok, tmp_path):
    prompts = Dataset.from_dict({"prompt": ["q1", "q2"], "context": [CONTEXT] * 2})
    with pytest.raises(ValueError, match=r"eval_completions='dataset'.*eval dataset 2 rows \(first: \[0, 1\]\)"):
        NCATrainer(
            model=make_tiny_model(tok, 0),
            teacher_model=make_tiny_model(tok, 1),
            processing_class=tok,
            train_dataset=conversations(),
            eval_dataset=prompts,
            args=run_args(NCAConfig, tmp_path / "out", SHARED, eval_completions="dataset"),
        )
