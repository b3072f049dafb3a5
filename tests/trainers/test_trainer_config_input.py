"""Bad input to the trainers and their configs (issue 8): every mistake in an NCAConfig, a dataset, a tokenizer or a
teacher fails early, with one clear message naming the problem, the row, file or field, and the fix, and nothing is
silently accepted."""

import logging

import pytest
from datasets import Dataset

import trl_nca.trainers.setup
from trl_nca import NCAConfig, NCATrainer
from trl_nca.testing import (
    ONE_STEP,
    cloned_parameters,
    make_tiny_model,
    make_tiny_tokenizer,
    permuted_tokenizer,
    record_batches,
    run_args,
)


def args(tmp_path, **fields):
    return run_args(NCAConfig, tmp_path, ONE_STEP, **fields)


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
        ("learning_rate", float("nan"), r"learning_rate must be a finite number >= 0 .*got the float nan"),
        ("max_grad_norm", float("inf"), r"max_grad_norm must be a finite number, got the float inf"),
        ("top_k", 2.5, r"top_k must be an integer >= 1, got the float 2.5"),
        ("max_context_length", "512", r"max_context_length must be an integer >= 2 .*got the str '512'"),
        ("nca_beta", -0.1, "nca_beta must be a finite number >= 0"),
        ("temperature", 0.0, "temperature must be a finite number > 0"),
    ],
)
def test_config_refuses_non_finite_mistyped_and_out_of_range_numbers(tmp_path, field, value, match):
    with pytest.raises(ValueError, match=match):
        args(tmp_path, **{field: value})


@pytest.mark.parametrize(
    "field,value",
    [
        ("context_placement", "assistant"),  # the choices of these five come from the fields' Literal types
        ("divergence_support", "top_p"),
        ("nca_anchor", "context"),
        ("self_teacher", "frozen"),
        ("eval_completions", "reference"),
        ("nca_divergence", "no_such_divergence"),  # the choices of these two come from the registries
        ("nca_beta_schedule", "cosine"),
    ],
)
def test_config_refuses_unknown_choices(tmp_path, field, value):
    with pytest.raises(ValueError, match=f"{field} must be one of"):
        args(tmp_path, **{field: value})


@pytest.mark.parametrize(
    "template,match",
    [
        ("{context}\n{prompt}\n{answer}", r"unknown placeholder\(s\) \{answer\}.*only \{prompt\} and \{context\}"),
        ("{context} {0} {prompt}", r"unknown placeholder\(s\) \{0\}"),
        ("{context} {prompt} {", r"not a valid format string.*literal braces as '\{\{' and '\}\}'"),
        ("{{prompt}} {context}", r"lacks \{prompt\}"),
        ("{prompt} only", r"lacks \{context\}"),
    ],
)
def test_context_template_is_checked_at_config_time(tmp_path, template, match):
    with pytest.raises(ValueError, match=match):
        args(tmp_path, context_placement="user", context_template=template, context_text="c")


def test_the_config_changes_no_field_it_was_given(tmp_path):
    """A config only describes: `__post_init__` checks and derives, and turns nothing the user set off (with the NCA
    term on, `nca_monitor=True` changes nothing: the context view runs anyway)."""
    config = args(tmp_path, nca_beta=0.5, nca_monitor=True, context_placement="user", context_text="c")
    assert (config.nca_beta, config.nca_monitor, config.context_placement) == (0.5, True, "user")


def test_a_template_the_placement_does_not_use_is_reported(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trl_nca.trainers.nca_config"):
        args(tmp_path, context_template="Notes: {context}\n{prompt}", context_text="c")
    assert "context_template is set but context_placement='system' does not use it" in caplog.text


def build(tok, tmp_path, dataset, model=None, teacher=None, **config):
    """A trainer on `dataset`: the tiny student (or `model`) and a separate tiny teacher (or `teacher`)."""
    return NCATrainer(
        model=model if model is not None else make_tiny_model(tok, 0),
        teacher_model=teacher if teacher is not None else make_tiny_model(tok, 1),
        args=args(tmp_path, **config),
        train_dataset=dataset,
        processing_class=tok,
    )


def test_empty_dataset(tok, tmp_path):
    with pytest.raises(ValueError, match=r"The train dataset is empty \(0 rows\)\. Check the file, the split"):
        build(tok, tmp_path, Dataset.from_dict({"prompt": []}), context_text="c")
    with pytest.raises(ValueError, match=r"The eval dataset is empty"):
        NCATrainer(
            model=make_tiny_model(tok, 0),
            args=args(tmp_path, context_text="c"),
            processing_class=tok,
            train_dataset=Dataset.from_dict({"prompt": ["q"]}),
            eval_dataset=Dataset.from_dict({"prompt": []}),
        )


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

    monkeypatch.setattr(trl_nca.trainers.setup, "create_model_from_path", no_model_work)
    with pytest.raises((ValueError, TypeError), match=match):
        build(tok, tmp_path, dataset, model=tiny_dir, context_text="c")


def test_no_user_turn_is_refused_with_either_placement(tok, tmp_path):
    ds = Dataset.from_dict({"messages": [[{"role": "system", "content": "rules"}]]})
    for placement in ("system", "user"):
        with pytest.raises(ValueError, match="row 0 .*no user turn"):
            build(tok, tmp_path, ds, context_text="c", context_placement=placement)


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
    tok.pad_token, tok.eos_token = None, None  # without a pad token the eos token pads (TRL's choice); without both:
    with pytest.raises(ValueError, match="neither a pad token nor an end-of-sequence.*tokenizer.pad_token = "):
        build(tok, tmp_path, ds)


def test_off_policy_without_reference_completions(tok, tmp_path):
    ds = Dataset.from_dict({"prompt": ["q"], "context": ["c"]})
    with pytest.raises(ValueError, match=r"lmbda < 1.*rows \(first: \[0\]\) have none"):
        build(tok, tmp_path, ds, lmbda=0.5)


def tokenised(tok, n=2, **overrides):
    """A dataset that already holds NCA's token columns (e.g. prepared once and saved)."""
    from trl_nca.core.views import ContextSpec
    from trl_nca.trainers.data import Limits, tokenize_example

    rows = [
        tokenize_example({"prompt": f"Question {i}?", "context": "Be brief."}, i, tok, ContextSpec(), Limits(4))
        for i in range(n)
    ]
    columns = {key: [r[key] for r in rows] for key in rows[0]}
    for key, (index, value) in overrides.items():
        columns[key][index] = value
    return Dataset.from_dict(columns)


def test_pretokenised_dataset_trains(tok, tmp_path):
    """A dataset that holds only the token columns trains: one optimizer step, a finite loss, moved weights, and the
    batch it trained on holds exactly the dataset's ids, both views of every row."""
    import math

    import torch

    data = tokenised(tok)
    trainer = build(tok, tmp_path, data, logging_steps=1)
    batches = record_batches(trainer)
    before = cloned_parameters(trainer.model)
    trainer.train()
    assert trainer.state.global_step == 1
    (log,) = [h for h in trainer.state.log_history if "opd_loss" in h]
    assert math.isfinite(log["loss"]) and log["opd_loss"] > 0
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    (batch,) = batches

    def rows(ids, mask):
        return [tuple(row[keep.bool()].tolist()) for row, keep in zip(ids, mask)]

    trained = set(
        zip(
            rows(batch.prompts, batch.prompt_attention_mask),
            rows(batch.context_prompts, batch.context_prompt_attention_mask),
        )
    )
    assert trained == {(tuple(r["prompt_ids"]), tuple(r["context_prompt_ids"])) for r in data}


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
                tok,
                tmp_path,
                tokenised(tok, context_prompt_ids=(1, long_context)),
                max_context_length=64,
                truncate_context=truncate,
            )


def test_prompt_beyond_the_position_limit_is_an_error(tok, tmp_path):
    """max_length no longer bounds the no-context view (GKD's meaning); max_context_length bounds both views."""
    ds = Dataset.from_dict({"prompt": ["Push the box onto the target, please. " * 8], "context": ["c"]})
    with pytest.raises(ValueError, match=r"row 0, the prompt without context has \d+ tokens.*max_context_length=40"):
        build(tok, tmp_path, ds, max_context_length=40)


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
            model=make_tiny_model(tok, 0),
            teacher_model=permuted_teacher_dir,
            args=args(tmp_path, context_text="c"),
            train_dataset=ds,
            processing_class=tok,
        )


def test_teacher_with_another_token_map_given_as_a_model(tok, tmp_path, permuted_teacher_dir):
    from transformers import AutoModelForCausalLM

    teacher = AutoModelForCausalLM.from_pretrained(permuted_teacher_dir)
    ds = Dataset.from_dict({"prompt": ["q"]})
    with pytest.raises(ValueError, match=VOCAB_MESSAGE):
        NCATrainer(
            model=make_tiny_model(tok, 0),
            teacher_model=teacher,
            args=args(tmp_path, context_text="c"),
            train_dataset=ds,
            processing_class=tok,
        )
    # a model built in memory says nothing about its tokenizer: the explicit one is checked
    with pytest.raises(ValueError, match=VOCAB_MESSAGE):
        NCATrainer(
            model=make_tiny_model(tok, 0),
            teacher_model=make_tiny_model(tok, 1),
            args=args(tmp_path, context_text="c"),
            train_dataset=ds,
            processing_class=tok,
            teacher_processing_class=permuted_tokenizer(),
        )


def test_teacher_with_the_same_tokenizer_is_accepted(tok, tmp_path, tiny_teacher_dir, monkeypatch):
    """The teacher's own tokenizer (found next to it) is compared with the student's, the check passes, and the
    teacher the trainer scores with is the model saved at that path (not the student, not a copy of it)."""
    import torch
    from transformers import AutoModelForCausalLM

    import trl_nca.trainers.teacher

    compared, check = [], trl_nca.trainers.teacher.check_same_vocabulary
    monkeypatch.setattr(
        trl_nca.trainers.teacher,
        "check_same_vocabulary",
        lambda student, teacher: compared.append(teacher) or check(student, teacher),
    )
    ds = Dataset.from_dict({"prompt": ["q"]})
    student = make_tiny_model(tok, 0)
    trainer = NCATrainer(
        model=student,
        teacher_model=tiny_teacher_dir,
        args=args(tmp_path, context_text="c"),
        train_dataset=ds,
        processing_class=tok,
    )
    (teacher_tokenizer,) = compared
    assert teacher_tokenizer.name_or_path == tiny_teacher_dir and teacher_tokenizer.get_vocab() == tok.get_vocab()
    saved = AutoModelForCausalLM.from_pretrained(tiny_teacher_dir).state_dict()
    used = trainer.teacher_model.state_dict()
    assert used.keys() == saved.keys() and all(torch.equal(used[k], saved[k]) for k in saved)
    assert any(not torch.equal(used[k], v) for k, v in student.state_dict().items())


def test_teacher_vocabulary_mismatch(tok, tmp_path):
    """A teacher whose output layer is narrower than the tokenizer cannot score every token (a wider one, padded like
    Qwen2.5-7B, is fine: see test_vocab_sizes.py)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok) - 7,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    ds = Dataset.from_dict({"prompt": ["q"], "context": ["c"]})
    with pytest.raises(ValueError, match=rf"teacher's {len(tok) - 7}.*do not cover the tokenizer's {len(tok)} tokens"):
        build(tok, tmp_path, ds, teacher=other)


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


def test_resume_true_without_a_checkpoint_is_an_error(tok, tmp_path):
    trainer = build(tok, tmp_path / "fresh", Dataset.from_dict({"prompt": ["q"]}), context_text="c")
    with pytest.raises(ValueError, match=r"resume_from_checkpoint=True, but output_dir .* holds no checkpoint-N"):
        trainer.train(resume_from_checkpoint=True)


def test_datasets_of_the_wrong_kind(tok, tmp_path):
    from datasets import DatasetDict

    with pytest.raises(TypeError, match=r"The train dataset is a Python list; pass a datasets\.Dataset.*from_list"):
        build(tok, tmp_path, [{"prompt": "q"}], context_text="c")
    splits = DatasetDict({"train": Dataset.from_dict({"prompt": ["q"]})})
    with pytest.raises(
        TypeError, match=r"DatasetDict with splits \['train'\]; pass one split, e\.g\. dataset\['train'\]"
    ):
        build(tok, tmp_path, splits, context_text="c")


@pytest.mark.parametrize("field", ["per_device_train_batch_size", "gradient_accumulation_steps"])
def test_zero_batch_sizes_are_refused(tmp_path, field):
    with pytest.raises(ValueError, match=f"{field} must be an integer >= 1, got the int 0"):
        args(tmp_path, **{field: 0})


def test_empty_fixed_context_says_to_give_the_text(tmp_path):
    with pytest.raises(ValueError, match="The context in the fixed context string is empty. Give the context text"):
        args(tmp_path, context_text="  ")


def test_context_file_not_utf8_names_the_line(tmp_path):
    from trl_nca.inputs import InputError, read_context

    path = tmp_path / "context.txt"
    path.write_bytes(b"Be brief.\nNo \xff here.\n")
    with pytest.raises(InputError, match=r"Line 2 of the context file .* is not UTF-8 text: byte 0xff"):
        read_context(str(path))


def test_analyze_speaks_of_the_reference_model_not_a_teacher():
    from trl_nca.trainers.teacher import check_same_vocabulary

    with pytest.raises(ValueError) as error:
        check_same_vocabulary(make_tiny_tokenizer(), permuted_tokenizer(), names=("reference model", "model 'nca'"))
    assert "teacher" not in str(error.value) and "The tokenizer of the model 'nca' maps 2" in str(error.value)


def test_a_teacher_object_without_a_tokenizer_is_said_to_be_unchecked(tok, tmp_path, caplog):
    teacher = make_tiny_model(tok, seed=1)
    teacher.config._name_or_path = ""  # built in memory: no folder to find its tokenizer in
    with caplog.at_level(logging.WARNING):
        build(tok, tmp_path, Dataset.from_dict({"prompt": ["q"]}), teacher=teacher, context_text="c")
    assert "the vocabulary check was skipped" in caplog.text and "teacher_processing_class" in caplog.text
