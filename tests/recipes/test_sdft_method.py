"""`trl-nca compare` with TRL's own SDFTTrainer as a method (`sdft:trainer=sdft`): trained and evaluated beside OPD,
with the comparison's shared settings and a teacher prompt that is the task's context view; bad input is one line."""

import dataclasses
import json

import pytest
import torch

from trl_nca.recipes.compare import check_methods, parse_method, run_config


def test_sdft_beside_opd_end_to_end_on_a_tiny_organism(tmp_path, monkeypatch):
    """An OPD and an SDFT student of the same (3-step, 23-token) organism are trained, saved as adapters in their run
    folders and evaluated paired; SDFT's top-100 support is clipped to the organism's vocabulary."""
    from safetensors.torch import load_file

    from trl_nca.cli import compare
    from trl_nca.models import organism

    monkeypatch.setenv("TRL_NCA_CACHE", str(tmp_path / "cache"))
    tiny = organism.OrganismSpec(steps=3, hidden_size=32, num_layers=1, num_heads=2, batch_size=4)
    monkeypatch.setattr(organism, "spec_for_alias", lambda alias: tiny)
    config = tmp_path / "compare.yaml"
    config.write_text(
        f"""
model_name_or_path: organism-quick
task: organism_shift
organism_seeds: [0]
seeds: [0]
methods: ["opd:nca_beta=0", "sdft:trainer=sdft,distillation_alpha=0.25"]
num_train: 4
eval_items: 3
track_every: 1
track_items: 2
output_dir: {tmp_path / "out"}
max_new_tokens: 4
max_steps: 2
logging_steps: 1
per_device_train_batch_size: 2
learning_rate: 5.0e-2
use_peft: true
lora_r: 2
lora_alpha: 4
lora_target_modules: [q_proj, v_proj]
report_to: none
disable_tqdm: true
"""
    )
    summary = compare(["--config", str(config)])
    out = tmp_path / "out" / "org0" / "sdft" / "seed0"
    assert list(summary["per_seed"]) == ["base", "opd", "sdft"]
    assert summary["methods"]["sdft"] == {"trainer": "sdft", "distillation_alpha": 0.25}
    assert summary["statistics"]["baseline"] == "opd" and set(summary["statistics"]["paired"]) == {"sdft"}
    done = json.loads((out / "done.json").read_text())
    training = done["settings"]["training"]
    assert training["teacher_prompt_template"] == "{privileged_context}\n\n{prompt}"  # the rule before the query
    assert training["distillation_alpha"] == 0.25 and training["teacher_model_kind"] == "base"
    assert training["distillation_mode"] == "topk_logits" and training["distillation_topk"] == 100
    assert training["num_generations"] == 1 and training["generation_batch_size"] == 2
    assert training["max_completion_length"] == 4 and training["learning_rate"] == 5e-2 and training["max_steps"] == 2
    logged = [h for h in done["log_history"] if "sdft/distillation_loss" in h]
    assert [h["step"] for h in logged] == [1, 2] and all(h["loss"] > 0 for h in logged)
    assert [row["step"] for row in done["tracking"]] == [0, 1, 2]
    args = torch.load(out / "training_args.bin", weights_only=False)
    assert args.distillation_topk == len(organism.make_tokenizer()) == 22  # not 100: torch.topk would fail
    adapter = load_file(str(out / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.abs().max() > 0 for k, v in adapter.items())  # trained (B starts at zero)
    records = (out / "eval" / "records.jsonl").read_text().splitlines()
    assert len(records) == 3 and json.loads(records[0])["meta"]["adapter"] == str(out)
    assert "| sdft | 0 | 0 |" in summary["table"]
    # a rerun loads the finished SDFT student back from its folder and trains nothing
    again = compare(["--config", str(config)])
    assert again["per_seed"]["sdft"] == summary["per_seed"]["sdft"]


@pytest.mark.parametrize("task_name", ["reply_in_french", "island_facts"])
def test_sdft_config_shares_the_settings_and_its_teacher_prompt_is_the_context_view(tiny_dir, tmp_path, task_name):
    """The SDFTConfig gets the comparison's training settings and one completion per prompt; the teacher's prompt of
    a row is, token for token, the context view NCA and the evaluation render (SDFT's default template is not)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_nca import NCAConfig
    from trl_nca.core.views import add_context, render_prompt_ids
    from trl_nca.recipes import sdft
    from trl_nca.tasks import get_task

    shared = NCAConfig(
        output_dir=str(tmp_path / "shared"),
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        max_steps=7,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_new_tokens=9,
        temperature=0.7,
        logging_steps=3,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        warmup_steps=2,
    )
    task = get_task(task_name)
    (method,) = check_methods([parse_method("sdft:trainer=sdft")], shared)
    config = run_config(shared, task, method, seed=5, output_dir=tmp_path / "run", monitor_opd=True)
    assert type(config).__name__ == "SDFTConfig"
    assert (config.learning_rate, config.max_steps, config.per_device_train_batch_size) == (3e-3, 7, 4)
    assert (config.gradient_accumulation_steps, config.logging_steps, config.warmup_steps) == (2, 3, 2)
    assert config.lr_scheduler_type == "constant" and config.seed == 5 and config.output_dir == str(tmp_path / "run")
    assert (config.max_completion_length, config.temperature, config.top_p, config.top_k) == (9, 0.7, 1.0, 0)
    assert config.bf16 is False and config.gradient_checkpointing is False
    # one completion per prompt: a step samples per_device_train_batch_size x gradient_accumulation_steps completions
    # of as many distinct prompts, as an OPD or NCA step does
    assert config.num_generations == 1 and config.generation_batch_size == 8
    assert (config.teacher_model_kind, config.distillation_alpha, config.distillation_is_clip) == ("base", 0.5, 2.0)

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    rows = task.train[:3]
    dataset = sdft.sdft_rows(task, rows)
    from peft import LoraConfig

    trainer = sdft.sdft_trainer(
        model=model,
        args=config,
        train_dataset=_dataset(dataset),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    builder = trainer.teacher_context_builder
    for row, example in zip(rows, dataset):
        context = task.context.context_of(row)
        messages = [{"role": "user", "content": row["prompt"]}]
        assert example == {"prompt": messages, "privileged_context": context}
        teacher = builder._compose_teacher_prompt(example["prompt"], example["privileged_context"])
        expected = render_prompt_ids(tokenizer, add_context(messages, context, task.context))
        assert trainer._tokenize_prompts([teacher])[0] == expected
        assert trainer._tokenize_prompts([example["prompt"]])[0] == render_prompt_ids(tokenizer, messages)
        default = config.__class__.teacher_prompt_template  # SDFT's own template: the context after the query
        default_prompt = [{"role": "user", "content": default.format(prompt=row["prompt"], privileged_context=context)}]
        assert trainer._tokenize_prompts([default_prompt])[0] != expected


def _dataset(rows):
    from datasets import Dataset

    return Dataset.from_list(rows)


BASE_CONFIG = """
model_name_or_path: /nonexistent/model
task: island_facts
seeds: [0]
num_train: 4
eval_items: 3
max_steps: 2
use_peft: true
report_to: none
"""


@pytest.mark.parametrize(
    "methods, message",
    [
        ('["sdft:trainer=sdft,distillation_alfa=0.5"]', "sets ['distillation_alfa'], which are not SDFTConfig fields"),
        ('["sdft:trainer=sdft,nca_beta=0.5"]', "sets ['nca_beta'], which are not SDFTConfig fields"),
        ('["opd:nca_beta=0", "sdft:trainer=sft"]', "trainer='sft' is not one of ['nca', 'sdft']"),
        ('["sdft:trainer=sdft,num_generations=8"]', "sets ['num_generations'], which the comparison sets"),
        ('["sdft:trainer=sdft,teacher_prompt_template=x"]', "sets ['teacher_prompt_template'], which the comparison"),
        ('["sdft:trainer=sdft,distillation_alpha=abc"]', "distillation_alpha='abc' is not a valid float"),
        ('["sdft:trainer=sdft,distillation_mode=rare"]', "distillation_mode='rare' is not one of"),
        (
            '["sdft:trainer=sdft,distillation_mode=sampled_token"]',
            "requires `distillation_alpha=1.0`",
        ),  # SDFTConfig's own
    ],
)
def test_sdft_bad_methods_are_one_line_before_any_model_or_file(tmp_path, capsys, methods, message):
    from trl_nca.cli import main

    config = tmp_path / "compare.yaml"
    config.write_text(BASE_CONFIG + f"methods: {methods}\noutput_dir: {tmp_path / 'out'}\n")
    assert main(["compare", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    first, *rest = err.splitlines()  # the message, then at most the hint on how to see the traceback
    assert first.startswith("trl-nca compare: error: ") and message in first and "Traceback" not in err, err
    assert all("TRL_NCA_TRACEBACK" in line for line in rest), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "strip, message",
    [
        ("column", "task 'island_facts' has none (its row 0 has no 'context' column"),
        ("spec", "A method with trainer=sdft distils from a privileged context, and task 'island_facts' has none."),
        ("system", "puts its context into the system message"),
    ],
)
def test_sdft_on_a_task_without_a_context_is_one_line(tmp_path, capsys, monkeypatch, strip, message):
    """A method sdft on a task whose rows have no context column (or no context at all, or one SDFT cannot place):
    a one-line error before any model or file; an NCA method alone on the same task is not refused here."""
    from trl_nca.cli import main
    from trl_nca.recipes import compare
    from trl_nca.tasks import get_task

    def task_without_context(name, seed=0):
        task = get_task(name, seed=seed)
        if strip == "column":
            return dataclasses.replace(task, train=[{k: v for k, v in r.items() if k != "context"} for r in task.train])
        if strip == "spec":
            return dataclasses.replace(task, context=None)
        return dataclasses.replace(task, context=dataclasses.replace(task.context, placement="system"))

    monkeypatch.setattr(compare, "get_task", task_without_context)
    config = tmp_path / "compare.yaml"
    config.write_text(
        BASE_CONFIG + f'methods: ["opd:nca_beta=0", "sdft:trainer=sdft"]\noutput_dir: {tmp_path / "out"}\n'
    )
    assert main(["compare", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    first, *rest = err.splitlines()
    assert first.startswith("trl-nca compare: error: ") and message in first, err
    assert all("TRL_NCA_TRACEBACK" in line for line in rest), err
    assert not (tmp_path / "out").exists()
