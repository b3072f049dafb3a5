"""Bad input and faults (issue 8): every mistake fails early, with one clear message naming the problem, the row,
file or field, and the fix, and nothing is silently accepted."""

import json
import logging

import pytest
from datasets import Dataset

import trl_nca.trainers.setup
from trl_nca import NCAConfig, NCATrainer
from trl_nca.cli import main as cli_main
from trl_nca.testing import (
    ONE_STEP,
    cloned_parameters,
    make_tiny_model,
    make_tiny_tokenizer,
    one_error_line,
    record_batches,
    run_args,
)


def args(tmp_path, **fields):
    return run_args(NCAConfig, tmp_path, ONE_STEP, **fields)


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


@pytest.mark.parametrize("field,value", [("context_placement", "assistant"), ("divergence_support", "top_p")])
def test_config_refuses_unknown_choices(tmp_path, field, value):
    with pytest.raises(ValueError, match=f"{field} must be one of"):
        args(tmp_path, **{field: value})


# --- 10: context template --------------------------------------------------------------------------------------------


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


def test_a_template_the_placement_does_not_use_is_reported(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trl_nca.trainers.nca_config"):
        args(tmp_path, context_template="Notes: {context}\n{prompt}", context_text="c")
    assert "context_template is set but context_placement='system' does not use it" in caplog.text


# --- 8, 9, 5: datasets -----------------------------------------------------------------------------------------------


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

    trained = set(zip(rows(batch["prompts"], batch["prompt_attention_mask"]),
                      rows(batch["context_prompts"], batch["context_prompt_attention_mask"])))  # fmt: skip
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
                tok, tmp_path, tokenised(tok, context_prompt_ids=(1, long_context)), max_context_length=64,
                truncate_context=truncate,
            )  # fmt: skip


def test_prompt_beyond_the_position_limit_is_an_error(tok, tmp_path):
    """max_length no longer bounds the no-context view (GKD's meaning); max_context_length bounds both views."""
    ds = Dataset.from_dict({"prompt": ["Push the box onto the target, please. " * 8], "context": ["c"]})
    with pytest.raises(ValueError, match=r"row 0, the prompt without context has \d+ tokens.*max_context_length=40"):
        build(tok, tmp_path, ds, max_context_length=40)


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
        model=student, teacher_model=tiny_teacher_dir, args=args(tmp_path, context_text="c"),
        train_dataset=ds, processing_class=tok,
    )  # fmt: skip
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
        LlamaConfig(vocab_size=len(tok) - 7, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1)
    )  # fmt: skip
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


# --- 1: resume ---------------------------------------------------------------------------------------------------------


def test_resume_true_without_a_checkpoint_is_an_error(tok, tmp_path):
    trainer = build(tok, tmp_path / "fresh", Dataset.from_dict({"prompt": ["q"]}), context_text="c")
    with pytest.raises(ValueError, match=r"resume_from_checkpoint=True, but output_dir .* holds no checkpoint-N"):
        trainer.train(resume_from_checkpoint=True)


# --- evaluation: 2, 9, 12, 13, 15 and the model resolver ---------------------------------------------------------------

from trl_nca.cli.eval import main as eval_main  # noqa: E402
from trl_nca.core.views import ContextSpec  # noqa: E402
from trl_nca.eval import GenerationSettings, PairedEvaluator  # noqa: E402
from trl_nca.eval.errors import EvalInputError  # noqa: E402


def qa_rows(n=3):
    return [{"id": f"q{i}", "prompt": f"Question {i}? (A) yes (B) no", "answer": "AB"[i % 2]} for i in range(n)]


def qa_evaluator(data, **kwargs):
    return PairedEvaluator(
        data, context=ContextSpec(text="Be careful."), id_column="id",
        generation=GenerationSettings(max_new_tokens=4, batch_size=2), **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r[1].update(prompt="Another question? (A) yes (B) no"),
        lambda r: r[1].update(answer="A"),
        lambda r: r[1].update(
            prompt=[{"role": "system", "content": "Short."}, {"role": "user", "content": r[1]["prompt"]}]
        ),
    ],
    ids=["prompt", "label", "messages"],
)
def test_eval_refuses_to_resume_records_of_changed_items(tok, tmp_path, change):
    model = make_tiny_model(tok)
    path = tmp_path / "records.jsonl"
    first = qa_evaluator(qa_rows()).run(model, tok, output_path=path, progress=False)
    changed = qa_rows()
    change(changed)
    with pytest.raises(EvalInputError, match=r"records of 1 item\(s\) whose prompt, label or tokenization differ .*"
                       r"\['q1'\].*Use a new output folder, or delete the file"):  # fmt: skip
        qa_evaluator(changed).run(model, tok, output_path=path, progress=False)
    # unchanged items resume (nothing regenerated), and new ones are added
    more = qa_evaluator(qa_rows(4)).run(model, tok, output_path=path, progress=False)
    assert [r.to_dict() for r in more[:3]] == [r.to_dict() for r in first]
    assert len(path.read_text().splitlines()) == 4


def test_eval_cli_refuses_a_changed_dataset_in_an_existing_output_folder(tiny_dir, tmp_path, capsys):
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in qa_rows(2)))
    argv = ["--model", tiny_dir, "--dataset", str(data), "--id-column", "id", "--context-text", "Be careful.",
            "--max-new-tokens", "3", "--bootstrap", "0", "--no-plots", "--no-progress", "--output-dir", str(tmp_path / "o")]  # fmt: skip
    assert eval_main(argv) == 0
    rows = qa_rows(2)
    rows[0]["answer"] = "B"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit) as exit_info:
        eval_main(argv)
    assert exit_info.value.code == 2
    assert "item(s) whose prompt, label or tokenization differ" in capsys.readouterr().err


@pytest.mark.parametrize(
    "rows,match",
    [
        (
            [{"id": "a", "prompt": "q", "answer": "A"}, {"id": "b", "prompt": "q"}],
            r"Row 1 \(item 'b'\) has no label in column 'answer' \(missing or null\)\. Fill it in, or drop the row",
        ),
        (
            [{"id": "a", "prompt": "q", "answer": "A"}, {"id": "b", "prompt": "q", "answer": None}],
            r"Row 1 \(item 'b'\) has no label",
        ),
        (
            [{"id": "a", "prompt": "q", "answer": "A"}, {"prompt": "q", "answer": "B"}],
            r"Row 1 has no id in column 'id'",
        ),
        (
            [{"id": "a", "prompt": "q", "answer": "A"}, {"id": "b", "prompt": 7, "answer": "B"}],
            r"row 1 \(item 'b'\), `prompt` must be a string or a list of chat messages",
        ),
        (
            [{"id": "a", "messages": [{"content": "q"}], "answer": "A"}],
            r"row 0 \(item 'a'\), message 0 of `messages` has no string 'role'",
        ),
        (
            [{"id": "a", "messages": [{"role": "system", "content": "q"}], "answer": "A"}],
            r"row 0 \(item 'a'\), the prompt has no user turn",
        ),
    ],
)
def test_eval_rows_are_checked_before_any_model_work(rows, match):
    with pytest.raises(EvalInputError, match=match):
        qa_evaluator(rows)


def run_eval_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        eval_main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_eval_cli_label_missing_in_one_row(tiny_dir, tmp_path, capsys):
    data = tmp_path / "items.jsonl"
    data.write_text('{"prompt": "q1", "answer": "A"}\n{"prompt": "q2"}\n')
    err = run_eval_error(["--model", tiny_dir, "--dataset", str(data), "--context-text", "c", "--output-dir",
                          str(tmp_path / "o")], capsys)  # fmt: skip
    assert "Row 1 (item '1') has no label in column 'answer'" in err


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_non_utf8_file_names_file_and_line(tiny_dir, tmp_path, capsys, suffix):
    data = tmp_path / f"items{suffix}"
    if suffix == ".jsonl":
        data.write_bytes(b'{"prompt": "q1", "answer": "A"}\n{"prompt": "q\xff2", "answer": "B"}\n')
    else:
        data.write_bytes(b'[{"prompt": "q1", "answer": "A"},\n {"prompt": "q\xff2", "answer": "B"}]\n')
    err = run_eval_error(["--model", tiny_dir, "--dataset", str(data), "--context-text", "c", "--output-dir",
                          str(tmp_path / "o")], capsys)  # fmt: skip
    assert f"Line 2 of {data} is not UTF-8 text: byte 0xff" in err
    # the training command reads local files the same way
    assert cli_main(["train", "--model_name_or_path", tiny_dir, "--dataset_name", str(data), "--output_dir",
                     str(tmp_path / "t"), "--use_cpu", "true", "--bf16", "false"]) == 2  # fmt: skip
    assert f"Line 2 of {data} is not UTF-8 text: byte 0xff" in capsys.readouterr().err


def test_train_cli_empty_dataset_file(tiny_dir, tmp_path, capsys):
    data = tmp_path / "empty.jsonl"
    data.write_text("\n")
    common = ["--model_name_or_path", tiny_dir, "--output_dir", str(tmp_path / "t"), "--use_cpu", "true",
              "--bf16", "false"]  # fmt: skip
    assert cli_main(["train", *common, "--dataset_name", str(data)]) == 2
    assert f"The dataset file '{data}' holds no rows" in capsys.readouterr().err
    assert cli_main(["train", *common, "--max_train_samples", "0"]) == 2
    assert "max_train_samples must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name,match",
    [
        ("./no/such/model", r"path './no/such/model' does not exist"),
        ("no/such/model", r"path 'no/such/model' does not exist"),
        ("nobody/no-such-model", r"'nobody/no-such-model' is not a local folder .*the Hugging Face Hub is offline"),
        ("not a model", r"'not a model' is neither an existing local folder nor a valid Hub id"),
    ],
)
def test_missing_models_get_our_message_in_every_command(tiny_dir, tmp_path, capsys, name, match):
    import re

    assert cli_main(["train", "--model_name_or_path", name, "--output_dir", str(tmp_path / "t"), "--use_cpu", "true",
                     "--bf16", "false"]) == 2  # fmt: skip
    assert re.search("trl-nca train: error: Student model " + match, capsys.readouterr().err)
    data = tmp_path / "items.jsonl"
    data.write_text('{"prompt": "q1", "answer": "A"}\n')
    err = run_eval_error(["--model", name, "--dataset", str(data), "--context-text", "c", "--output-dir",
                          str(tmp_path / "o")], capsys)  # fmt: skip
    assert re.search(match, err)
    teacher = cli_main(["train", "--model_name_or_path", tiny_dir, "--teacher_model_name_or_path", name,
                        "--output_dir", str(tmp_path / "t"), "--use_cpu", "true", "--bf16", "false"])  # fmt: skip
    assert teacher == 2 and re.search("Teacher model " + match, capsys.readouterr().err)


def test_eval_cli_accepts_embedded_like_train(tiny_dir, tmp_path, monkeypatch):
    """One resolver for every command: `trl-nca eval --model embedded` loads the embedded model's folder."""
    import trl_nca.models.names

    monkeypatch.setattr(
        trl_nca.models.names, "embedded_model_path", lambda: tiny_dir
    )  # stands in for the converted cache
    data = tmp_path / "items.jsonl"
    data.write_text('{"prompt": "q1", "answer": "A"}\n')
    argv = ["--model", "embedded", "--dataset", str(data), "--context-text", "c", "--max-new-tokens", "3",
            "--bootstrap", "0", "--no-plots", "--no-progress", "--output-dir", str(tmp_path / "o")]  # fmt: skip
    assert eval_main(argv) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["models"][0]["name"] == "embedded"
    assert summary["models"][0]["provenance"]["model"]["resolved_path"] == str(tiny_dir)


def test_custom_scorer_help_says_it_runs_code(capsys):
    from trl_nca.cli.eval import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    assert "runs its code" in " ".join(capsys.readouterr().out.split())


# --- 6, 14: game options, one parser, checked before any model is loaded ------------------------------------------------


@pytest.mark.parametrize(
    "options,match",
    [
        (["num_seeds=0"], r"--game-option num_seeds must be a positive integer .*got the int 0"),
        (["num_seeds=abc"], r"--game-option num_seeds must be a positive integer .*got the str 'abc'"),
        (["num_seeds=2.5"], r"num_seeds must be a positive integer .*got the float 2.5"),
        (
            ["seeds=5"],
            r"--game-option seeds must be a non-empty JSON list of non-negative integers, e.g\. seeds=\[3,7,11\].*"
            r"got the int 5",
        ),
        (["seeds=[]"], r"seeds must be a non-empty JSON list .*got the list \[\]"),
        (["seeds=[1,1,2]"], r"seeds lists \[1\] more than once"),
        (["seeds=[1]", "num_seeds=2"], r"either --game-option num_seeds=N or seeds=\[...\], not both"),
        (["num_seeds=2", "num_seeds=3"], r"--game-option num_seeds is given twice"),
        (["max_calls=0"], r"max_calls must be a positive integer .*got the int 0"),
        (["seed=3"], r"'seed' is not a game setting"),
        (["chat_template_kwargs=x"], r"chat_template_kwargs must be a JSON object"),
        (["experience_file=/no/such/file.txt"], r"Cannot read the experience file '/no/such/file.txt'"),
        (["num_seeds"], r"--game-option 'num_seeds' is not KEY=VALUE"),
        (["sise=3"], r"Unknown --game-option sise for frozenlake: its settings are \[.size., .num_holes.\]"),
        (["size=abc"], r"Bad --game-option for frozenlake: size must be an integer, got the str .abc."),
    ],
)
def test_game_options_are_checked_before_any_model_is_loaded(tiny_dir, tmp_path, capsys, monkeypatch, options, match):
    import re

    import trl_nca.eval.loading

    def no_model_work(*a, **k):
        raise AssertionError("a model was loaded before the game options were checked")

    monkeypatch.setattr(trl_nca.eval.loading, "load_model", no_model_work)
    argv = ["--model", tiny_dir, "--game", "frozenlake", "--output-dir", str(tmp_path / "o")]
    for option in options:
        argv += ["--game-option", option]
    assert re.search(match, run_eval_error(argv, capsys))


def test_game_records_of_another_model_are_refused(tok, tmp_path):
    from trl_nca.eval.games import run_game_eval

    settings = GenerationSettings(max_new_tokens=3, temperature=0.7, top_p=0.8, top_k=20, batch_size=4)
    path = tmp_path / "records.jsonl"
    common = dict(tokenizer=tok, game="frozenlake", generation=settings, context=None, options={"num_seeds": 1})
    run_game_eval(model=make_tiny_model(tok, 0), output_path=path, **common)
    with pytest.raises(EvalInputError, match="holds records of another run"):
        run_game_eval(model=make_tiny_model(tok, 1), output_path=path, **common)
    with pytest.raises(EvalInputError, match="holds records of another run"):  # other prompts: chat template options
        run_game_eval(model=make_tiny_model(tok, 0), output_path=path,
                      **{**common, "options": {"num_seeds": 1, "chat_template_kwargs": {"enable_thinking": False}}})  # fmt: skip


# --- found by probing as a careless user -------------------------------------------------------------------------------


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


@pytest.mark.parametrize("option,value", [("--temperature", "nan"), ("--temperature", "inf"), ("--top-p", "nan")])
def test_eval_refuses_non_finite_sampling(tiny_dir, tmp_path, capsys, option, value):
    data = tmp_path / "items.jsonl"
    data.write_text('{"prompt": "q1", "answer": "A"}\n')
    err = run_eval_error(["--model", tiny_dir, "--dataset", str(data), "--context-text", "c", option, value,
                          "--output-dir", str(tmp_path / "o")], capsys)  # fmt: skip
    assert f"{option[2:].replace('-', '_')} must be a finite number, got the float {value}" in err


def test_eval_limit_zero_says_so(tiny_dir, tmp_path, capsys):
    data = tmp_path / "items.jsonl"
    data.write_text('{"prompt": "q1", "answer": "A"}\n')
    err = run_eval_error(["--model", tiny_dir, "--dataset", str(data), "--context-text", "c", "--limit", "0",
                          "--output-dir", str(tmp_path / "o")], capsys)  # fmt: skip
    assert "The evaluation dataset is empty after limit=0" in err


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--rounds", "0"], "--rounds must be at least 1, got 0"),
        (["--episodes", "0"], "--episodes must be at least 1, got 0"),
        (["--game-option", "size=abc"], "size must be an integer, got the str 'abc'"),
        (["--game-option", "sise=3"], "unexpected keyword argument 'sise'"),
        (["--game-option", "size=3", "--game-option", "size=4"], "--game-option size is given twice"),
    ],
)
def test_experience_cli_checks_settings_before_loading_the_model(tiny_dir, tmp_path, capsys, monkeypatch, extra, match):
    import trl_nca.eval.loading

    def no_model_work(*a, **k):
        raise AssertionError("a model was loaded before the settings were checked")

    monkeypatch.setattr(trl_nca.eval.loading, "load_model", no_model_work)
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["experience", "--model", tiny_dir, "--game", "frozenlake", "--output", str(tmp_path / "x.txt"),
                  *extra])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "trl-nca experience: error:" in err and match in err


def test_experience_cli_missing_model_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["experience", "--model", "./no/model", "--game", "frozenlake", "--output", str(tmp_path / "x.txt")])
    assert exit_info.value.code == 2
    assert "trl-nca experience: error: Model path './no/model' does not exist" in capsys.readouterr().err


def test_train_cli_config_and_data_mistakes_are_one_line(tiny_dir, tmp_path, capsys):
    common = ["--model_name_or_path", tiny_dir, "--output_dir", str(tmp_path / "t"), "--use_cpu", "true",
              "--bf16", "false"]  # fmt: skip
    config = tmp_path / "run.yaml"
    config.write_text("nca_beta: .nan\n")
    assert cli_main(["train", *common, "--config", str(config)]) == 2
    assert "trl-nca train: error: nca_beta must be a finite number >= 0" in capsys.readouterr().err
    text = tmp_path / "data.txt"
    text.write_text("hello\n")
    assert cli_main(["train", *common, "--dataset_name", str(text)]) == 2
    assert "unsupported file type .txt" in capsys.readouterr().err
    # a single file has one split: a test split would silently be the training rows
    assert cli_main(["train", *common, "--dataset_test_split", "test"]) == 2
    assert "'quickstart' is a single file, so it has one split ('train'); the split 'test'" in capsys.readouterr().err


def test_eval_accepts_the_builtin_contexts_of_train(tiny_dir, tmp_path):
    data = tmp_path / "items.jsonl"
    data.write_text('{"prompt": "q1", "answer": "A"}\n')
    argv = ["--model", tiny_dir, "--dataset", str(data), "--context-file", "medical", "--max-new-tokens", "2",
            "--bootstrap", "0", "--no-plots", "--no-progress", "--output-dir", str(tmp_path / "o")]  # fmt: skip
    assert eval_main(argv) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["models"][0]["provenance"]["context"]["source"] == "builtin:medical"


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--game", "frozenlake", "--dataset", "d.jsonl"], r"--dataset do\(es\) not apply to --game"),
        (["--game", "frozenlake", "--limit", "3"], r"--limit do\(es\) not apply to --game.*num_seeds=N"),
        (["--game", "frozenlake", "--scorer", "yesno"], r"--scorer do\(es\) not apply to --game"),
        (["--dataset", "d.jsonl", "--game-option", "num_seeds=2"], r"--game-option only applies with --game"),
    ],
)
def test_eval_options_that_would_be_ignored_are_errors(tiny_dir, tmp_path, capsys, extra, match):
    import re

    argv = ["--model", tiny_dir, "--output-dir", str(tmp_path / "o"), *extra]
    assert re.search(match, run_eval_error(argv, capsys))


def test_eval_records_without_item_fingerprints_are_refused(tok, tmp_path):
    path = tmp_path / "records.jsonl"
    qa_evaluator(qa_rows(2)).run(make_tiny_model(tok), tok, output_path=path, progress=False)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        del line["meta"]["item_sha256"]  # as written before records carried fingerprints
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(EvalInputError, match="records without item fingerprints .* Use a new output folder"):
        qa_evaluator(qa_rows(2)).run(make_tiny_model(tok), tok, output_path=path, progress=False)


def test_context_file_not_utf8_names_the_line(tmp_path):
    from trl_nca.inputs import InputError, read_context

    path = tmp_path / "context.txt"
    path.write_bytes(b"Be brief.\nNo \xff here.\n")
    with pytest.raises(InputError, match=r"Line 2 of the context file .* is not UTF-8 text: byte 0xff"):
        read_context(str(path))


# --- issue 27: every documented bad input through every command is one line, before any work -------------------------


def compare_yaml(tmp_path, **changes):
    fields = {"model_name_or_path": "/nonexistent/model", "task": "reply_in_french", "seeds": "[0]",
              "methods": '["opd:nca_beta=0", "nca:nca_beta=0.5"]', "num_train": 2, "eval_items": 2, "max_steps": 1,
              "use_peft": "true", "report_to": "none", "output_dir": str(tmp_path / "out"), **changes}  # fmt: skip
    config = tmp_path / "compare.yaml"
    config.write_text("".join(f"{key}: {value}\n" for key, value in fields.items()))
    return ["compare", "--config", str(config)]


def one_line_error(argv, capsys, command):
    line = one_error_line(cli_main, argv, capsys)
    assert line.startswith(f"trl-nca {command}: error: "), line
    return line


@pytest.mark.parametrize(
    "changes,extra,message",
    [
        ({}, ["--nca_beta", "-0.5"], "nca_beta must be a finite number >= 0"),
        ({}, ["--max_new_tokens", "0"], "max_new_tokens"),
        ({}, ["--seeds", "-1"], "`seeds` holds -1 (int); every seed must be a whole number from 0 to 4294967295"),
        ({"organism_seeds": "[1.5]", "model_name_or_path": "organism"}, [], "`organism_seeds` must be a list of whole"),
        ({"organism_seeds": '["a"]', "model_name_or_path": "organism"}, [], "`organism_seeds` must be a list of whole"),
        (
            {"organism_seeds": f"[{10**23}]", "model_name_or_path": "organism"},
            [],
            "`organism_seeds` holds " + str(10**23),
        ),
        ({"seeds": '["a"]'}, [], "`seeds` must be a list of whole numbers, got ['a']"),
        ({"methods": '["opd:nca_beta=[0]"]'}, [], "Method 'opd': nca_beta=[0] is not a float"),
        (
            {"methods": '["opd:nca_beta=null"]'},
            [],
            "Method 'opd': nca_beta=null is not allowed; nca_beta takes a float",
        ),
        ({"methods": '["opd:temperature=-1"]'}, [], "Method 'opd': temperature must be a finite number > 0"),
        ({}, ["--eval_samples_per_view", "1000000000000"], "samples_per_view 1000000000000 is more than 256"),
        ({"task": "no_such_task"}, [], "`task: no_such_task` is not a built-in task; choose one of"),
        (
            {"model_name_or_path": "organism-quick"},
            [],
            "Task 'reply_in_french' does not fit model 'organism-quick': 99% of its prompt and context tokens are unknown",
        ),
        (
            {"model_name_or_path": "organism", "task": "organism_facts"},
            [],
            "Task 'organism_facts' does not fit model 'organism': 11% of its prompt and context tokens",
        ),
    ],
)
def test_compare_bad_inputs_are_one_line_before_any_work(tmp_path, capsys, monkeypatch, changes, extra, message):
    import trl_nca.models.organism

    def no_pretraining(*args, **kwargs):
        raise AssertionError("an organism was pretrained before the inputs were checked")

    monkeypatch.setattr(trl_nca.models.organism, "pretrain", no_pretraining)
    monkeypatch.setattr(trl_nca.models.organism, "organism_model_path", no_pretraining)
    err = one_line_error([*compare_yaml(tmp_path, **changes), *extra], capsys, "compare")
    assert message in err, err
    assert not (tmp_path / "out").exists()


def test_an_output_dir_that_is_a_file_is_refused_by_compare_and_train(tmp_path, tiny_dir, capsys):
    taken = tmp_path / "taken"
    taken.write_text("a file\n")
    err = one_line_error(compare_yaml(tmp_path, output_dir=str(taken)), capsys, "compare")
    assert f"output_dir {str(taken)!r} is a file, not a folder" in err
    err = one_line_error(["train", "--model_name_or_path", tiny_dir, "--output_dir", str(taken), "--use_cpu", "true",
                          "--bf16", "false"], capsys, "train")  # fmt: skip
    assert f"output_dir {str(taken)!r} is a file, not a folder" in err


def test_train_data_with_a_missing_prompt_is_one_line(tiny_dir, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": null}\n{"prompt": "q"}\n')
    err = one_line_error(["train", "--model_name_or_path", tiny_dir, "--dataset_name", str(data), "--context_text",
                          "c", "--output_dir", str(tmp_path / "t"), "--use_cpu", "true", "--bf16", "false"], capsys,
                         "train")  # fmt: skip
    assert "Row 0 of the train dataset has neither a `messages` nor a `prompt`" in err


def test_eval_and_analyze_bad_inputs_are_one_line(tiny_dir, tmp_path, capsys):
    data = tmp_path / "items.jsonl"
    data.write_text('{"prompt": "q1", "answer": "A"}\n')
    err = run_eval_error(["--model", tiny_dir, "--dataset", str(data), "--context-text", "c", "--samples-per-view",
                          "1000000000000", "--output-dir", str(tmp_path / "o")], capsys)  # fmt: skip
    assert "samples_per_view 1000000000000 is more than 256" in err
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["analyze", "--model", f"base={tiny_dir}", "--task", "no_such_task", "--output-dir",
                  str(tmp_path / "a")])  # fmt: skip
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err and "no_such_task" in err, err


@pytest.mark.parametrize("command", ["compare", "analyze"])
def test_task_help_lists_every_task_of_the_registry(capsys, command):
    from trl_nca.tasks import task_names

    with pytest.raises(SystemExit):
        cli_main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert len(task_names()) == 5 and all(name in text for name in task_names()), text


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


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_train_seed_out_of_range_is_one_line_before_loading(tiny_dir, tmp_path, capsys, seed):
    err = one_line_error(["train", "--model_name_or_path", tiny_dir, "--seed", str(seed), "--output_dir",
                          str(tmp_path / "t"), "--use_cpu", "true", "--bf16", "false"], capsys, "train")  # fmt: skip
    assert "seed must be an integer >= 0" in err and not (tmp_path / "t").exists()


def test_experience_bad_input_is_one_line(tmp_path, capsys):
    err = one_line_error(["experience", "--model", "./no/model", "--game", "frozenlake", "--episodes", "0",
                          "--output", str(tmp_path / "x.txt")], capsys, "experience")  # fmt: skip
    assert "--episodes must be at least 1, got 0" in err
