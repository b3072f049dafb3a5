"""Issue 8: bad input and faults. Every mistake gets one clear message naming the problem, the row or file, and the
fix, and nothing is silently accepted."""

import json
import logging

import pytest
from datasets import Dataset

import trl_nca.trainer
from trl_nca import NCAConfig, NCATrainer
from trl_nca.testing import make_tiny_model, make_tiny_tokenizer


def args(tmp_path, **kwargs):
    base = dict(output_dir=str(tmp_path), bf16=False, use_cpu=True, report_to=[], max_new_tokens=4, max_steps=1)
    base.update(kwargs)
    return NCAConfig(**base)


@pytest.fixture(scope="module")
def tok():
    return make_tiny_tokenizer()


def permuted_tokenizer(swap=(100, 101)):
    """The tiny tokenizer with two ordinary tokens' ids swapped: same size, different token -> id map."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    base = make_tiny_tokenizer()
    data = json.loads(base.backend_tokenizer.to_str())
    vocab = data["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    a, b = by_id[swap[0]], by_id[swap[1]]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)), pad_token="<|pad|>", eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
    )  # fmt: skip
    fast.chat_template = base.chat_template
    assert len(fast) == len(base) and fast.get_vocab() != base.get_vocab()
    return fast


# --- 3, 16: numbers in the config ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("nca_beta", float("nan"), r"nca_beta must be a finite number >= 0 .*got the float nan"),
        ("nca_beta", float("inf"), r"nca_beta must be a finite number >= 0 .*got the float inf"),
        ("nca_beta", "0.5", r"nca_beta must be a finite number .*got the str '0.5'\. Pass a number, not a string"),
        ("nca_beta", True, r"nca_beta must be a finite number .*got the bool True"),
        ("temperature", float("inf"), r"temperature must be a finite number > 0 .*got the float inf"),
        ("temperature", float("nan"), r"temperature must be a finite number > 0 .*got the float nan"),
        ("temperature", "0.7", r"temperature must be .*got the str '0.7'"),
        ("beta", float("nan"), r"beta must be a finite number >= 0 and <= 1 .*got the float nan"),
        ("lmbda", float("nan"), r"lmbda must be a finite number >= 0 and <= 1 .*got the float nan"),
        ("lmbda", "1", r"lmbda must be .*got the str '1'"),
        ("learning_rate", float("nan"), r"learning_rate must be a finite number, got the float nan"),
        ("max_grad_norm", float("inf"), r"max_grad_norm must be a finite number, got the float inf"),
        ("top_k", 2.5, r"top_k must be an integer >= 1, got the float 2.5"),
        ("max_context_length", "512", r"max_context_length must be an integer >= 2 .*got the str '512'"),
    ],
)
def test_config_refuses_non_finite_and_mistyped_numbers(tmp_path, field, value, match):
    with pytest.raises(ValueError, match=match):
        args(tmp_path, **{field: value})


# --- 10: context template --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "template,match",
    [
        ("{context}\n{prompt}\n{answer}", r"unknown placeholder\(s\) \{answer\}.*only \{prompt\} and \{context\}"),
        ("{context} {0} {prompt}", r"unknown placeholder\(s\) \{0\}"),
        ("{context} {prompt} {", r"not a valid format string.*literal braces as '\{\{' and '\}\}'"),
        ("{{prompt}} {context}", r"lacks \{prompt\}"),
    ],
)
def test_context_template_is_checked_at_config_time(tmp_path, template, match):
    with pytest.raises(ValueError, match=match):
        args(tmp_path, context_placement="user", context_template=template, context_text="c")


def test_a_template_the_placement_does_not_use_is_reported(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trl_nca.config"):
        args(tmp_path, context_template="Notes: {context}\n{prompt}", context_text="c")
    assert "context_template is set but context_placement='system' does not use it" in caplog.text


# --- 8, 9, 5: datasets -----------------------------------------------------------------------------------------------


def build(tok, tmp_path, dataset, model=None, **config):
    return NCATrainer(
        model=model if model is not None else make_tiny_model(tok, 0),
        teacher_model=make_tiny_model(tok, 1),
        args=args(tmp_path, **config),
        train_dataset=dataset,
        processing_class=tok,
    )


def test_empty_dataset(tok, tmp_path):
    with pytest.raises(ValueError, match=r"The train dataset is empty \(0 rows\)\. Check the file, the split"):
        build(tok, tmp_path, Dataset.from_dict({"prompt": []}), context_text="c")
    with pytest.raises(ValueError, match=r"The eval dataset is empty"):
        NCATrainer(
            model=make_tiny_model(tok, 0), args=args(tmp_path, context_text="c"), processing_class=tok,
            train_dataset=Dataset.from_dict({"prompt": ["q"]}), eval_dataset=Dataset.from_dict({"prompt": []}),
        )  # fmt: skip


@pytest.mark.parametrize(
    "rows,match",
    [
        (
            {"prompt": [1, 2]},
            r"In row 0 of the train dataset, `prompt` must be a string or a list of chat messages.*"
            r"got the int 1",
        ),
        ({"prompt": [["a"], ["b"]]}, r"In row 0 .*message 0 of `prompt` is the str 'a', expected a dict"),
        ({"prompt": ["fine", "  "]}, r"In row 1 .*the prompt is an empty string"),
        (
            [{"messages": [{"role": "user", "content": "a"}]}, {"messages": [{"content": "b"}]}],
            r"In row 1 of the train dataset, message 0 of `messages` has no string 'role' \(missing or null\)",
        ),
        (
            [{"messages": [{"role": "user", "content": "a"}]}, {"messages": [{"role": "user", "content": None}]}],
            r"In row 1 .*no string 'content'",
        ),
        (
            {"messages": [[{"role": "user", "content": "a"}], [{"role": "system", "content": "b"}]]},
            r"In row 1 of the train dataset, the prompt has no user turn \(its roles are \['system'\]\).*'user'",
        ),
        (
            {"messages": [[{"role": "human", "content": "a"}, {"role": "gpt", "content": "b"}]]},
            r"In row 0 .*no user turn \(its roles are \['human', 'gpt'\]\).*rename roles such as 'human' to 'user'",
        ),
    ],
)
def test_malformed_rows_name_the_row_before_the_model_is_loaded(tok, tmp_path, tiny_dir, monkeypatch, rows, match):
    dataset = Dataset.from_list(rows) if isinstance(rows, list) else Dataset.from_dict(rows)

    def no_model_work(*a, **k):
        raise AssertionError("the model was loaded before the dataset was checked")

    monkeypatch.setattr(trl_nca.trainer, "create_model_from_path", no_model_work)
    with pytest.raises((ValueError, TypeError), match=match):
        build(tok, tmp_path, dataset, model=tiny_dir, context_text="c")


def test_no_user_turn_is_refused_with_either_placement(tok, tmp_path):
    ds = Dataset.from_dict({"messages": [[{"role": "system", "content": "rules"}]]})
    for placement in ("system", "user"):
        with pytest.raises(ValueError, match="row 0 .*no user turn"):
            build(tok, tmp_path, ds, context_text="c", context_placement=placement)


# --- 4: teacher vocabulary -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def permuted_teacher_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("permuted") / "teacher"
    tokenizer = permuted_tokenizer()
    tokenizer.save_pretrained(folder)
    make_tiny_model(tokenizer, seed=1).save_pretrained(folder)
    return str(folder)


VOCAB_MESSAGE = (
    r"The teacher's tokenizer maps 2 of the student's \d+ tokens to other ids.*is 100 for the student and 101"
)


def test_teacher_with_another_token_map_given_as_a_path(tok, tmp_path, permuted_teacher_dir):
    ds = Dataset.from_dict({"prompt": ["q"]})
    with pytest.raises(ValueError, match=VOCAB_MESSAGE):
        NCATrainer(
            model=make_tiny_model(tok, 0), teacher_model=permuted_teacher_dir, args=args(tmp_path, context_text="c"),
            train_dataset=ds, processing_class=tok,
        )  # fmt: skip


def test_teacher_with_another_token_map_given_as_a_model(tok, tmp_path, permuted_teacher_dir):
    from transformers import AutoModelForCausalLM

    teacher = AutoModelForCausalLM.from_pretrained(permuted_teacher_dir)
    ds = Dataset.from_dict({"prompt": ["q"]})
    with pytest.raises(ValueError, match=VOCAB_MESSAGE):
        NCATrainer(
            model=make_tiny_model(tok, 0), teacher_model=teacher, args=args(tmp_path, context_text="c"),
            train_dataset=ds, processing_class=tok,
        )  # fmt: skip
    # a model built in memory says nothing about its tokenizer: the explicit one is checked
    with pytest.raises(ValueError, match=VOCAB_MESSAGE):
        NCATrainer(
            model=make_tiny_model(tok, 0), teacher_model=make_tiny_model(tok, 1), args=args(tmp_path, context_text="c"),
            train_dataset=ds, processing_class=tok, teacher_processing_class=permuted_tokenizer(),
        )  # fmt: skip


def test_teacher_with_the_same_tokenizer_is_accepted(tok, tmp_path, tiny_teacher_dir):
    ds = Dataset.from_dict({"prompt": ["q"]})
    trainer = NCATrainer(
        model=make_tiny_model(tok, 0), teacher_model=tiny_teacher_dir, args=args(tmp_path, context_text="c"),
        train_dataset=ds, processing_class=tok,
    )  # fmt: skip
    assert trainer.teacher_model is not None


# --- 1: resume ---------------------------------------------------------------------------------------------------------


def test_resume_true_without_a_checkpoint_is_an_error(tok, tmp_path):
    trainer = build(tok, tmp_path / "fresh", Dataset.from_dict({"prompt": ["q"]}), context_text="c")
    with pytest.raises(ValueError, match=r"resume_from_checkpoint=True, but output_dir .* holds no checkpoint-N"):
        trainer.train(resume_from_checkpoint=True)
