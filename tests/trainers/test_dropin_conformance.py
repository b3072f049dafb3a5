"""NCATrainer and NCADistillationTrainer where their TRL parents' own tests look (issue 35).

TRL 1.16's tests of `GKDTrainer` (tests/experimental/test_gkd_trainer.py) and `DistillationTrainer`
(tests/test_distillation_trainer.py) read as a list of promised behaviours. Each behaviour below is tested here, in
our own words, against both NCA trainers at `nca_beta` 0 (plain OPD) and 0.5, offline on the tiny local models of
`trl_nca.testing`. A behaviour NCA does not share is a documented difference (docs/configuration.md, "Differences
from GKDTrainer and DistillationTrainer"), and its test checks that it fails for the documented reason.
"""

import json
import math
from pathlib import Path

import pytest
import torch
from datasets import Dataset, DatasetDict

from trl_nca import NCAConfig, NCADistillationConfig, NCADistillationTrainer, NCATrainer
from trl_nca.testing import (
    CPU,
    cloned_parameters,
    make_tiny_model,
    make_tiny_tokenizer,
    prompt_dataset,
    ragged_answers,
    record_batches,
    run_args,
    save_tiny_model,
)


BETAS = [0.0, 0.5]
# One or two short optimizer steps on the CPU; the sampling length field differs between the two configs.
COMMON = {
    **CPU,
    "save_strategy": "no",
    "per_device_train_batch_size": 2,
    "per_device_eval_batch_size": 2,
    "gradient_checkpointing": False,
    "logging_steps": 1,
    "seed": 0,
    "disable_tqdm": True,
}
KINDS = {
    "NCATrainer": (NCATrainer, NCAConfig, {"max_new_tokens": 4}),
    "NCADistillationTrainer": (NCADistillationTrainer, NCADistillationConfig, {"max_completion_length": 4}),
}


def config(kind, tmp_path, nca_beta, **fields):
    _, config_class, length = KINDS[kind]
    return run_args(config_class, tmp_path / "out", {**COMMON, **length}, nca_beta=nca_beta, **fields)


def trainer(kind, tmp_path, nca_beta, tok=None, model=None, teacher=None, data=None, **kwargs):
    """A trainer of `kind` on the tiny student and a separate tiny teacher (each can be given), `prompt_dataset()`."""
    fields = kwargs.pop("fields", {})
    tok = tok or make_tiny_tokenizer()
    return KINDS[kind][0](
        model=model if model is not None else make_tiny_model(tok, 0),
        teacher_model=teacher if teacher is not None else make_tiny_model(tok, 1),
        args=config(kind, tmp_path, nca_beta, **fields),
        train_dataset=data if data is not None else prompt_dataset(),
        processing_class=tok if model is None or not isinstance(model, str) else None,
        **kwargs,
    )


both = pytest.mark.parametrize("kind", list(KINDS))
betas = pytest.mark.parametrize("nca_beta", BETAS)


# ---------------------------------------------------------------------------------------------------------------------
# The five drop-in failures of issue 35 (each failed before its fix).


def save_remote_code_model(directory: Path) -> str:
    """A tiny model folder whose config needs custom code (`auto_map` to a module in the folder): loading it by name
    needs `trust_remote_code=True`, and the class it loads is the folder's own `RemoteForCausalLM`."""
    if (directory / "modeling_remote.py").exists():
        return str(directory)
    save_tiny_model(directory, seed=0)
    (directory / "configuration_remote.py").write_text(
        "from transformers import LlamaConfig\n\n\nclass RemoteConfig(LlamaConfig):\n    model_type = 'nca-remote'\n"
    )
    (directory / "modeling_remote.py").write_text(
        "from transformers import LlamaForCausalLM\n\nfrom .configuration_remote import RemoteConfig\n\n\n"
        "class RemoteForCausalLM(LlamaForCausalLM):\n    config_class = RemoteConfig\n"
    )
    config_file = directory / "config.json"
    data = json.loads(config_file.read_text())
    data.update(
        model_type="nca-remote",
        architectures=["RemoteForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_remote.RemoteConfig",
            "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM",
        },
    )
    config_file.write_text(json.dumps(data))
    return str(directory)


@both
def test_trust_remote_code_is_passed_on_when_models_load_by_name(tmp_path, kind):
    """TRL: a model with custom code loaded by name is refused without `trust_remote_code`, loaded with it."""
    path = save_remote_code_model(tmp_path / "remote")
    build = KINDS[kind][0]
    with pytest.raises(ValueError, match="custom code"):
        build(model=path, teacher_model=path, args=config(kind, tmp_path, 0.5), train_dataset=prompt_dataset())
    trained = build(
        model=path,
        teacher_model=path,
        args=config(kind, tmp_path, 0.5, trust_remote_code=True),
        train_dataset=prompt_dataset(),
    )
    assert type(trained.model).__name__ == "RemoteForCausalLM"
    assert type(trained.accelerator.unwrap_model(trained.teacher_model)).__name__ == "RemoteForCausalLM"


@both
@pytest.mark.parametrize("shape", ["dataset", "dataset_dict", "dict_of_dataset"])
def test_evaluate_accepts_a_dataset_not_seen_at_init(tmp_path, kind, shape):
    """TRL: `evaluate(eval_dataset=...)` takes a dataset (or a dict of them) given only there; it gets both views."""
    made = trainer(kind, tmp_path, 0.5)
    split = prompt_dataset(3)
    eval_dataset = {
        "dataset": split,
        "dataset_dict": DatasetDict({"data1": split, "data2": split}),
        "dict_of_dataset": {"data1": split, "data2": split},
    }[shape]
    metrics = made.evaluate(eval_dataset=eval_dataset)
    keys = ["eval_loss"] if shape == "dataset" else ["eval_data1_loss", "eval_data2_loss"]
    for key in keys:
        assert math.isfinite(metrics[key]), key
    with pytest.raises(ValueError, match="no context column 'context'"):
        made.evaluate(eval_dataset=Dataset.from_dict({"prompt": ["a question"]}))  # checked as at init


@both
def test_a_tokenizer_without_pad_token_pads_with_eos(tmp_path, kind):
    """TRL: without a pad token the end-of-sequence token pads, and the model's configs follow the tokenizer."""
    tok = make_tiny_tokenizer()
    model = make_tiny_model(tok, 0)
    tok.pad_token = None
    made = trainer(kind, tmp_path, 0.5, tok=tok, model=model, fields={"max_steps": 1})
    assert tok.pad_token == tok.eos_token and made.processing_class.pad_token_id == tok.eos_token_id
    student = made.accelerator.unwrap_model(made.model)
    assert student.config.pad_token_id == tok.eos_token_id
    assert student.generation_config.pad_token_id == tok.eos_token_id
    made.train()
    assert made.state.global_step == 1


@both
@pytest.mark.parametrize("teacher", ["model", "none"])
def test_teacher_init_kwargs_without_a_teacher_to_load_are_refused(tmp_path, kind, teacher):
    """TRL: `teacher_model_init_kwargs` with a teacher that is already a model raise (they would be ignored); so do
    they with no teacher at all (the self-teacher is the student's weights). Refused before any model loads."""
    tok = make_tiny_tokenizer()
    student = save_tiny_model(tmp_path / "student")
    args = config(kind, tmp_path, 0.5, teacher_model_init_kwargs={"dtype": "float32"})
    built = make_tiny_model(tok, 1) if teacher == "model" else None
    with pytest.raises(ValueError, match=r"teacher_model_init_kwargs.*apply only to a teacher loaded by name") as e:
        KINDS[kind][0](model=student, teacher_model=built, args=args, train_dataset=prompt_dataset())
    assert ("already a model" in str(e.value)) == (teacher == "model")


@both
def test_a_batch_without_the_context_view_is_refused_with_the_reason(tmp_path, kind):
    """TRL's loss tests build a batch with the no-context prompt only. NCA's loss scores the completion in both views
    and cannot rebuild the context view from prompt ids: a documented difference, refused with that reason (the
    property those tests check, normalisation by `num_items_in_batch`, is tested below on NCA-shaped batches)."""
    made = trainer(kind, tmp_path, 0.5)
    prompt = torch.randint(0, 100, (2, 4))
    ones = torch.ones(2, 4, dtype=torch.long)
    if kind == "NCADistillationTrainer":
        batch = {
            "prompt_ids": prompt,
            "prompt_mask": ones,
            "completion_ids": prompt[:, :3],
            "completion_mask": ones[:, :3],
        }
    else:  # GKD's collator output
        batch = {
            "input_ids": prompt,
            "attention_mask": ones,
            "labels": prompt,
            "prompts": prompt,
            "prompt_attention_mask": ones,
        }
    with pytest.raises(ValueError, match=r"compute_loss got a batch without \['context_prompts'.*cannot be rebuilt"):
        made.compute_loss(made.model, batch)


# ---------------------------------------------------------------------------------------------------------------------
# The conformance suite: TRL 1.16's behaviours, in the order of its two test files. The DistillationTrainer-only
# behaviours (iterable datasets, sampling kwargs, entropy) are checked on NCADistillationTrainer, GKD's own (its
# generation config, `generate_on_policy_outputs`) on NCATrainer, the shared ones on both.


def trainable_moved(before, model) -> list[str]:
    """The names of the trainable parameters that did not change."""
    return [n for n, p in model.named_parameters() if p.requires_grad and torch.equal(before[n], p.detach())]


@both
@betas
def test_init_with_names_only(tiny_dir, tiny_teacher_dir, tmp_path, kind, nca_beta):
    """TRL: model and teacher given by name, a prompt-only dataset, nothing else: the trainer builds."""
    made = KINDS[kind][0](
        model=tiny_dir,
        teacher_model=tiny_teacher_dir,
        train_dataset=prompt_dataset(),
        args=KINDS[kind][1](output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], nca_beta=nca_beta),
    )
    # `nca_beta` is the anchor's upper bound; the default, gated anchor is off at the first step
    assert made.processing_class is not None and made.args.nca_beta == nca_beta and made.nca_beta == 0.0


@both
@betas
@pytest.mark.parametrize("form", ["standard_prompt_only", "conversational_prompt_only"])
def test_train_moves_every_weight_and_logs_the_loss(tmp_path, kind, nca_beta, form):
    """TRL: training on a prompt-only dataset (a string or chat messages) moves every parameter and logs
    `train_loss`; DistillationTrainer also logs the student's entropy."""
    data = prompt_dataset()
    if form == "conversational_prompt_only":
        data = data.map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"]}]})
    tok = make_tiny_tokenizer()
    made = trainer(kind, tmp_path, nca_beta, tok=tok, data=data, fields={"max_steps": 2, "learning_rate": 0.1})
    before = cloned_parameters(made.model)
    made.train()
    assert made.state.log_history[-1]["train_loss"] is not None
    assert trainable_moved(before, made.model) == []
    assert all(torch.isfinite(p).all() for p in made.model.parameters())
    if kind == "NCADistillationTrainer":
        assert any("entropy" in entry for entry in made.state.log_history)


@both
@betas
def test_gradient_accumulation_trains(tmp_path, kind, nca_beta):
    """TRL: under gradient accumulation the update still moves every parameter (the loss normalisation itself is
    `test_loss_normalises_by_num_items_in_batch`)."""
    made = trainer(
        kind, tmp_path, nca_beta, fields={"max_steps": 1, "learning_rate": 0.1, "gradient_accumulation_steps": 2}
    )
    before = cloned_parameters(made.model)
    made.train()
    assert made.state.log_history[-1]["train_loss"] is not None and trainable_moved(before, made.model) == []


def nca_shaped_batch(made, kind):
    """A ragged batch of both views (prompts of different lengths, reference completions of different lengths) in
    the trainer's own batch keys."""
    tok = made.processing_class
    rows = [NCATrainerBatchRows.row(tok, i) for i in range(3)]
    from trl_nca.trainers.data import NCACollator

    batch = NCACollator(tok.pad_token_id)(rows)
    if kind == "NCADistillationTrainer":
        return {
            "prompt_ids": batch["prompts"],
            "prompt_mask": batch["prompt_attention_mask"],
            "context_prompts": batch["context_prompts"],
            "context_prompt_attention_mask": batch["context_prompt_attention_mask"],
            "completion_ids": batch["completion_ids"],
            "completion_mask": batch["completion_mask"],
        }
    return batch  # NCATrainer's view keys: compute_loss builds its NCABatch


class NCATrainerBatchRows:
    @staticmethod
    def row(tok, i):
        from trl_nca.core.views import ContextSpec
        from trl_nca.trainers.data import Limits, tokenize_example

        example = ragged_answers(3)[i]
        example["messages"][0]["content"] += " more" * (4 * i)  # prompts of different lengths too
        return tokenize_example(example, i, tok, ContextSpec(), Limits(max_new_tokens=4))


@both
@betas
def test_loss_normalises_by_num_items_in_batch(tmp_path, kind, nca_beta):
    """TRL (GKD #4719; DistillationTrainer): the loss is the token sum divided by `num_items_in_batch` when it is
    given (the step's token count under gradient accumulation), else the micro-batch's token mean; every completion
    token of a ragged batch with prompts of different lengths counts. On NCA-shaped batches (both views)."""
    made = trainer(kind, tmp_path, nca_beta)
    batch = nca_shaped_batch(made, kind)
    tokens = batch["completion_mask"].sum()
    assert len(set(batch["completion_mask"].sum(1).tolist())) > 1
    assert len(set(batch[kind == "NCATrainer" and "prompt_attention_mask" or "prompt_mask"].sum(1).tolist())) > 1
    made.model.eval()
    with torch.no_grad():
        mean = made.compute_loss(made.model, batch)
        summed = made.compute_loss(made.model, batch, num_items_in_batch=tokens)
        doubled = made.compute_loss(made.model, batch, num_items_in_batch=tokens * 2)
    assert mean > 0
    torch.testing.assert_close(summed, mean, rtol=1e-6, atol=0)  # the same division, float32 rounding
    torch.testing.assert_close(doubled, mean / 2, rtol=1e-6, atol=0)


@both
@betas
def test_train_with_evaluation_and_checkpoints(tmp_path, kind, nca_beta):
    """TRL: evaluation every 2 steps logs `eval_loss` (also before the first step with `eval_on_start`), and the
    checkpoint of step 2 holds the weights."""
    made = trainer(
        kind,
        tmp_path,
        nca_beta,
        eval_dataset=prompt_dataset(2),
        fields={
            "max_steps": 2,
            "eval_strategy": "steps",
            "eval_steps": 2,
            "eval_on_start": True,
            "save_strategy": "steps",
            "save_steps": 2,
        },
    )
    made.train()
    evals = [h for h in made.state.log_history if "eval_loss" in h]
    assert [h["step"] for h in evals] == [0, 2] and all(math.isfinite(h["eval_loss"]) for h in evals)
    assert (tmp_path / "out" / "checkpoint-2" / "model.safetensors").is_file()


@both
@pytest.mark.parametrize("shape", ["dataset", "dataset_dict", "dict_of_dataset", "none"])
def test_init_with_eval_dataset(tmp_path, kind, shape):
    """TRL: the eval dataset at init may be one dataset, a DatasetDict or a dict of datasets (keys kept), or None."""
    split = prompt_dataset(2)
    given = {
        "dataset": split,
        "dataset_dict": DatasetDict({"data1": split, "data2": split}),
        "dict_of_dataset": {"data1": split, "data2": split},
        "none": None,
    }[shape]
    made = trainer(kind, tmp_path, 0.5, eval_dataset=given)
    if shape == "none":
        assert made.eval_dataset is None
    elif shape == "dataset":
        assert len(made.eval_dataset) == 2
    else:
        assert set(made.eval_dataset) == {"data1", "data2"}


@both
def test_train_dataset_is_the_tokenised_two_view_copy(tmp_path, kind):
    """TRL keeps `trainer.train_dataset is train_dataset`. Documented difference: NCA holds a tokenised copy with both
    views' token columns (rendered and checked once at init), row for row."""
    data = prompt_dataset()
    made = trainer(kind, tmp_path, 0.5, data=data)
    assert made.train_dataset is not data and len(made.train_dataset) == len(data)
    assert {"prompt_ids", "context_prompt_ids"} <= set(made.train_dataset.column_names)
    assert made.train_dataset[0]["context_prompt_ids"] != made.train_dataset[0]["prompt_ids"]


@both
@pytest.mark.parametrize(
    "case", ["adapter initialisation is seeded", "LoRA config", "PEFT model", "LoRA with gradient checkpointing"]
)
def test_peft(tmp_path, kind, case):
    """TRL: a LoRA adapter (given as a config or as a PEFT model, also with gradient checkpointing) trains its own
    weights only, and the same seed gives the same initial adapter whatever the global random state."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    fields = {"max_steps": 2, "learning_rate": 0.1, "gradient_checkpointing": case.endswith("checkpointing")}
    if case == "adapter initialisation is seeded":
        adapters = []
        for global_seed in range(2):
            torch.manual_seed(global_seed)
            made = trainer(kind, tmp_path, 0.5, peft_config=lora)
            adapters.append({n: p.clone() for n, p in made.model.named_parameters() if "lora_A" in n})
        assert adapters[0] and all(torch.equal(p, adapters[1][n]) for n, p in adapters[0].items())
        return
    tok = make_tiny_tokenizer()
    model = make_tiny_model(tok, 0)
    base = {f"base_model.model.{n}": p.detach().clone() for n, p in model.named_parameters()}
    if case == "PEFT model":
        made = trainer(kind, tmp_path, 0.5, tok=tok, model=get_peft_model(model, lora), fields=fields)
    else:
        made = trainer(kind, tmp_path, 0.5, tok=tok, model=model, peft_config=lora, fields=fields)
    before = cloned_parameters(made.model)
    made.train()
    for name, param in made.model.named_parameters():
        if name in base:
            assert torch.equal(before[name], param.detach()), f"{name} (base) changed"
        elif "lora_" in name:
            assert not torch.equal(before[name], param.detach()), f"{name} (adapter) did not change"


@both
@pytest.mark.parametrize(
    "config, error",
    [
        (dict(target_modules=["q_proj", "v_proj"]), None),
        (dict(target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"]), None),
        (dict(target_modules=["q_proj", "lm_head"]), "lm_head"),
    ],
    ids=["non-head targets", "head saved whole", "adapter on the head"],
)
def test_peft_on_the_output_layer(tmp_path, kind, config, error):
    """TRL: an adapter elsewhere, or the head trained whole (`modules_to_save`), is fine; an adapter on the head is
    refused (the chunked loss reads the head's weight directly)."""
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, **config)
    if error is None:
        trainer(kind, tmp_path, 0.5, peft_config=lora)
    else:
        with pytest.raises(ValueError, match=error):
            trainer(kind, tmp_path, 0.5, peft_config=lora)


@both
def test_prompt_learning_is_refused(tmp_path, kind):
    """TRL refuses prompt-learning adapters (virtual tokens that a loss running the backbone directly would bypass);
    so do both NCA trainers (NCATrainer accepted them before issue 35 and never trained them)."""
    from peft import PrefixTuningConfig

    with pytest.raises(
        ValueError, match=r"Prompt-learning PEFT methods \(prompt tuning, prefix tuning|Prompt-learning"
    ):
        trainer(kind, tmp_path, 0.5, peft_config=PrefixTuningConfig(num_virtual_tokens=4, task_type="CAUSAL_LM"))


@both
def test_teacher_with_another_vocabulary(tmp_path, kind):
    """TRL refuses a teacher whose `vocab_size` differs. Documented difference (configuration.md, Teachers): NCA
    refuses a teacher that maps tokens to other ids, and accepts one whose output layer is only padded wider."""
    from trl_nca.testing import permuted_tokenizer

    tok = make_tiny_tokenizer()
    with pytest.raises(ValueError, match="maps 2 of the student's"):
        trainer(kind, tmp_path, 0.5, tok=tok, teacher_processing_class=permuted_tokenizer())
    padded = make_tiny_model(tok, 1, vocab_size=len(tok) + 16)
    made = trainer(kind, tmp_path, 0.5, tok=tok, teacher=padded, fields={"max_steps": 1})
    made.train()
    assert made.state.global_step == 1


@pytest.mark.parametrize("nca_beta", BETAS)
def test_sampling_stops_at_every_eos_id_of_the_generation_config(tmp_path, nca_beta):
    """TRL (DistillationTrainer): every end-of-sequence id the model's generation config declares ends a completion
    (counted as terminated, not clipped); a completion holds nothing after it."""
    tok = make_tiny_tokenizer()
    model = make_tiny_model(tok, 0)
    ends = [tok.eos_token_id, *range(40, 120)]
    model.generation_config.eos_token_id = ends
    made = trainer(
        "NCADistillationTrainer",
        tmp_path,
        nca_beta,
        tok=tok,
        model=model,
        fields={"max_steps": 1, "max_completion_length": 8},
    )
    batches = record_batches(made)
    made.train()
    (batch,) = batches
    stopped = 0
    for ids, mask in zip(batch.completion_ids, batch.completion_mask):
        kept = ids[mask.bool()].tolist()
        assert not any(t in ends for t in kept[:-1]), kept  # nothing after the first end
        stopped += kept[-1] in ends
    assert stopped > 0
    (log,) = [h for h in made.state.log_history if "completions/clipped_ratio" in h]
    assert log["completions/clipped_ratio"] == pytest.approx(1 - stopped / len(batch.completion_ids))


@pytest.mark.parametrize("nca_beta", BETAS)
@pytest.mark.parametrize(
    "fields",
    [
        {"top_p": 0.9, "top_k": 10, "min_p": 0.01, "repetition_penalty": 1.1},
        {"generation_kwargs": {"do_sample": True, "top_k": 50, "num_beams": 2, "length_penalty": -0.1}},
        {"pad_to_multiple_of": 8},
        {"beta": 0.5},
    ],
    ids=["sampling fields", "generation_kwargs", "pad_to_multiple_of", "beta 0.5"],
)
def test_distillation_fields_train(tmp_path, nca_beta, fields):
    """TRL (DistillationTrainer): its sampling fields, `generation_kwargs`, `pad_to_multiple_of` and an intermediate
    JSD `beta` train end to end."""
    made = trainer("NCADistillationTrainer", tmp_path, nca_beta, fields={"max_steps": 1, **fields})
    made.train()
    assert made.state.log_history[-1]["train_loss"] is not None


@pytest.mark.parametrize("nca_beta", BETAS)
def test_iterable_datasets(tmp_path, nca_beta):
    """TRL (DistillationTrainer): a streamed train set trains with `max_steps` (dispatch_batches forced off, one
    loader worker), `dispatch_batches=True` is refused, a streamed eval set leaves the train loader's workers."""
    stream = prompt_dataset(8).to_iterable_dataset()
    made = trainer(
        "NCADistillationTrainer", tmp_path, nca_beta, data=stream, fields={"max_steps": 2, "dataloader_num_workers": 2}
    )
    assert made.args.accelerator_config.dispatch_batches is False and made.args.dataloader_num_workers == 0
    made.train()
    assert made.state.global_step == 2
    with pytest.raises(ValueError, match="dispatch_batches=False"):
        trainer(
            "NCADistillationTrainer",
            tmp_path,
            nca_beta,
            data=prompt_dataset(8).to_iterable_dataset(),
            fields={"max_steps": 1, "accelerator_config": {"dispatch_batches": True}},
        )
    mixed = trainer(
        "NCADistillationTrainer",
        tmp_path,
        nca_beta,
        eval_dataset=prompt_dataset(2).to_iterable_dataset(),
        fields={"dataloader_num_workers": 2},
    )
    assert mixed.get_eval_dataloader().num_workers == 0 and mixed.args.dataloader_num_workers == 2


@pytest.mark.parametrize("what", ["tools", "chat_template_kwargs"])
def test_distillation_inputs_nca_does_not_take(tmp_path, what):
    """Documented differences: `tools` are refused at init, `chat_template_kwargs` at the first batch, each with the
    reason (a tool result would interleave with the scored completion; the two renderings of the prompt differ)."""
    if what == "tools":
        with pytest.raises(ValueError, match="does not take `tools`.*interleave"):
            trainer("NCADistillationTrainer", tmp_path, 0.5, tools=[len])
        return
    tok = make_tiny_tokenizer()
    tok.chat_template = tok.chat_template.replace("{% for", "{% if extra %}extra{% endif %}{% for", 1)
    made = trainer(
        "NCADistillationTrainer",
        tmp_path,
        0.5,
        tok=tok,
        fields={"max_steps": 1, "chat_template_kwargs": {"extra": True}},
    )
    with pytest.raises(ValueError, match="rendered a prompt into .*chat_template_kwargs"):
        made.train()


@pytest.mark.parametrize("nca_beta", BETAS)
def test_gkd_generation_config(tmp_path, nca_beta):
    """TRL (GKD): the generation config pads with the tokenizer's pad token, ends at the model's eos, samples
    `max_new_tokens` at `temperature`, top-k off."""
    tok = make_tiny_tokenizer()
    made = trainer("NCATrainer", tmp_path, nca_beta, tok=tok, fields={"temperature": 0.7})
    config = made.generation_config
    assert config.pad_token_id == tok.pad_token_id and config.eos_token_id == tok.eos_token_id
    assert config.max_new_tokens == made.args.max_new_tokens and config.temperature == 0.7 and config.top_k == 0


@pytest.mark.parametrize("nca_beta", BETAS)
def test_gkd_on_policy_samples(tmp_path, nca_beta):
    """TRL (GKD's `generate_on_policy_outputs`): greedy sampling is deterministic, and the completion block holds no
    prompt token. NCA samples with `_generate` (GKD's helper is not called: see its docstring), which returns the
    completions alone, masked through the first end-of-sequence token."""
    from transformers import GenerationConfig

    made = trainer("NCATrainer", tmp_path, nca_beta)
    tok = made.processing_class
    batch = made.data_collator([made.train_dataset[i] for i in range(2)])
    made.generation_config = GenerationConfig(
        max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
    )
    first = made._generate(made.model, batch["prompts"], batch["prompt_attention_mask"])
    second = made._generate(made.model, batch["prompts"], batch["prompt_attention_mask"])
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    ids, mask = first
    assert ids.shape[1] <= 8 and mask.sum() > 0
    for row, row_mask in zip(ids, mask):
        kept = row[row_mask.bool()].tolist()
        assert tok.eos_token_id not in kept[:-1]


def test_gkd_divergence_is_gkds():
    """TRL (GKD's `generalized_jsd_loss` tests): NCATrainer keeps GKD's static loss unchanged (its own loss is the
    shared objective, tested against full-logit references in tests/trainers/test_distillation_trainer.py)."""
    from trl.experimental.gkd import GKDTrainer

    assert NCATrainer.generalized_jsd_loss is GKDTrainer.generalized_jsd_loss
    logits = torch.randn(2, 3, 5)
    assert NCATrainer.generalized_jsd_loss(logits, logits).abs() < 1e-6
