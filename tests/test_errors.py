"""Bad input fails early with an error that names the problem and the fix."""

import pytest
from datasets import Dataset

from trl_nca import NCAConfig, NCATrainer
from trl_nca.testing import make_tiny_model, make_tiny_tokenizer


def args(tmp_path, **kwargs):
    base = dict(output_dir=str(tmp_path), bf16=False, use_cpu=True, report_to=[], max_new_tokens=4, max_steps=1)
    base.update(kwargs)
    return NCAConfig(**base)


@pytest.fixture(scope="module")
def tok():
    return make_tiny_tokenizer()


def build(tok, tmp_path, dataset, teacher="same", **config):
    teacher_model = make_tiny_model(tok, 1) if teacher == "same" else teacher
    return NCATrainer(
        model=make_tiny_model(tok, 0),
        teacher_model=teacher_model,
        args=args(tmp_path, **config),
        train_dataset=dataset,
        processing_class=tok,
    )


def test_missing_context_column_lists_columns(tok, tmp_path):
    ds = Dataset.from_dict({"prompt": ["q"], "hint": ["c"]})
    with pytest.raises(ValueError, match=r"no context column 'context'.*\['hint', 'prompt'\].*context_column"):
        build(tok, tmp_path, ds)


def test_missing_prompt_column(tok, tmp_path):
    ds = Dataset.from_dict({"question": ["q"], "context": ["c"]})
    with pytest.raises(ValueError, match=r"neither a `messages` nor a `prompt` column.*question"):
        build(tok, tmp_path, ds)


@pytest.mark.parametrize("bad,match", [("   ", "row 1 .* is empty"), (None, "row 1 .* is a NoneType")])
def test_empty_or_non_string_context_names_the_row(tok, tmp_path, bad, match):
    ds = Dataset.from_dict({"prompt": ["q1", "q2"], "context": ["fine", bad]})
    with pytest.raises((ValueError, TypeError), match=match):
        build(tok, tmp_path, ds)


def test_tokenizer_without_chat_template_or_pad(tmp_path):
    ds = Dataset.from_dict({"prompt": ["q"], "context": ["c"]})
    tok = make_tiny_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template.*chat_template"):
        build(tok, tmp_path, ds)
    tok = make_tiny_tokenizer()
    tok.pad_token = None
    with pytest.raises(ValueError, match="no pad token.*tokenizer.pad_token = tokenizer.eos_token"):
        build(tok, tmp_path, ds)


def test_teacher_vocabulary_mismatch(tok, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(
        LlamaConfig(vocab_size=len(tok) + 7, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1)
    )  # fmt: skip
    ds = Dataset.from_dict({"prompt": ["q"], "context": ["c"]})
    with pytest.raises(ValueError, match="vocab_size"):
        build(tok, tmp_path, ds, teacher=other)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("nca_beta", -0.1, "nca_beta must be a finite number >= 0"),
        ("context_template", "{prompt} only", r"lacks \{context\}"),
        ("context_placement", "assistant", "must be one of"),
        ("divergence_support", "top_p", "must be one of"),
        ("temperature", 0.0, "temperature must be a finite number > 0"),
    ],
)
def test_config_validation(tmp_path, field, value, match):
    kwargs = {field: value}
    if field == "context_template":
        kwargs["context_placement"] = "user"
    with pytest.raises(ValueError, match=match):
        args(tmp_path, **kwargs)


def test_peft_config_that_cannot_give_a_self_teacher(tok, tmp_path):
    from peft import PromptTuningConfig, TaskType

    ds = Dataset.from_dict({"prompt": ["q"], "context": ["c"]})
    with pytest.raises(ValueError, match="cannot recover the student's initial model.*teacher_model"):
        NCATrainer(
            model=make_tiny_model(tok, 0),
            args=args(tmp_path),
            train_dataset=ds,
            processing_class=tok,
            peft_config=PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=4),
        )


def test_off_policy_without_reference_completions(tok, tmp_path):
    ds = Dataset.from_dict({"prompt": ["q"], "context": ["c"]})
    with pytest.raises(ValueError, match=r"lmbda < 1.*rows \(first: \[0\]\) have none"):
        build(tok, tmp_path, ds, lmbda=0.5)
