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
    """A teacher whose output layer is narrower than the tokenizer cannot score every token (a wider one, padded like
    Qwen2.5-7B, is fine: see test_vocab_sizes.py)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(
        LlamaConfig(vocab_size=len(tok) - 7, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1)
    )  # fmt: skip
    ds = Dataset.from_dict({"prompt": ["q"], "context": ["c"]})
    with pytest.raises(ValueError, match=rf"teacher's {len(tok) - 7}.*do not cover the tokenizer's {len(tok)} tokens"):
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


def tokenised(tok, n=2, **overrides):
    """A dataset that already holds NCA's token columns (e.g. prepared once and saved)."""
    from trl_nca.data import Limits, tokenize_example
    from trl_nca.views import ContextSpec

    rows = [
        tokenize_example({"prompt": f"Question {i}?", "context": "Be brief."}, i, tok, ContextSpec(), Limits(4))
        for i in range(n)
    ]
    columns = {key: [r[key] for r in rows] for key in rows[0]}
    for key, (index, value) in overrides.items():
        columns[key][index] = value
    return Dataset.from_dict(columns)


def test_pretokenised_dataset_trains(tok, tmp_path):
    build(tok, tmp_path, tokenised(tok)).train()


@pytest.mark.parametrize(
    "column,value,match",
    [
        ("prompt_ids", [], "row 1 of the train dataset, `prompt_ids` is empty"),
        ("context_prompt_ids", [3, -1], r"row 1 .*`context_prompt_ids` holds ids outside the tokenizer's range.*-1"),
        ("completion_ids", [5, 10**6], r"row 1 .*`completion_ids` holds ids outside the tokenizer's range.*1000000"),
        ("context_prompt_ids", None, r"row 1 .*`context_prompt_ids` must be a list of token ids, got NoneType"),
    ],
)
def test_pretokenised_rows_are_validated(tok, tmp_path, column, value, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build(tok, tmp_path, tokenised(tok, **{column: (1, value)}))


def test_pretokenised_row_without_context_is_refused(tok, tmp_path):
    plain = tokenised(tok)[1]["prompt_ids"]
    with pytest.raises(ValueError, match=r"row 1 .*`context_prompt_ids` equals `prompt_ids`.*x -> x"):
        build(tok, tmp_path, tokenised(tok, context_prompt_ids=(1, plain)))


def test_pretokenised_lengths_are_checked(tok, tmp_path):
    long_context = tokenised(tok)[1]["context_prompt_ids"] * 20
    for truncate in (False, True):  # a tokenised row cannot be re-rendered, so it is never cut
        with pytest.raises(ValueError, match=r"row 1 .*context view is too long.*max_context_length=64.*cannot be re"):
            build(
                tok, tmp_path, tokenised(tok, context_prompt_ids=(1, long_context)), max_context_length=64,
                truncate_context=truncate,
            )  # fmt: skip


def test_prompt_beyond_the_position_limit_is_an_error(tok, tmp_path):
    """max_length no longer bounds the no-context view (GKD's meaning); max_context_length bounds both views."""
    ds = Dataset.from_dict({"prompt": ["Push the box onto the target, please. " * 8], "context": ["c"]})
    with pytest.raises(ValueError, match=r"row 0, the prompt without context has \d+ tokens.*max_context_length=40"):
        build(tok, tmp_path, ds, max_context_length=40)
