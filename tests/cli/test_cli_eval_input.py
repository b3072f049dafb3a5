"""`trl-nca eval` on bad input (issue 35): each probe is one case of the table, with the one line it must print, and
no model is loaded (no work is done) before that line. A second run into a folder in use is refused, never mixed."""

import json
from pathlib import Path

import pytest
import torch

import trl_nca.eval.loading
from trl_nca.cli import main as cli_main
from trl_nca.inputs import output_folder_lock
from trl_nca.testing import one_error_line, save_tiny_model


READ_ONLY = Path("/sys/trl-nca-test")  # a place nobody can create a folder in, root included


def one_line(argv, capsys) -> str:
    return one_error_line(cli_main, argv, capsys)


@pytest.fixture
def no_model_loads(monkeypatch):
    """Loading a model is the first piece of work: any case that reaches it fails the test."""

    def refused(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was reported")

    monkeypatch.setattr(trl_nca.eval.loading, "load_model", refused)


@pytest.fixture(scope="module")
def short_model(tmp_path_factory):
    """The tiny model with 64 positions (its config's max_position_embeddings)."""
    path = Path(save_tiny_model(tmp_path_factory.mktemp("short") / "model"))
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = 64
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def items(tmp_path, prompt="Which answer? (A) yes (B) no"):
    path = tmp_path / "items.jsonl"
    path.write_text(json.dumps({"prompt": prompt, "answer": "A"}) + "\n")
    return str(path)


LONG = " ".join(["rule"] * 120)  # well over 64 tokens
# (case, extra options, the expected line's text); every case also gets --model, --dataset and --output-dir
CASES = [
    ("alpha above 1", ["--alpha", "2"], "--alpha must be a significance level within (0, 1)"),
    ("alpha nan", ["--alpha", "nan"], "--alpha must be a significance level within (0, 1), e.g. 0.05; got nan"),
    ("negative bootstrap", ["--bootstrap", "-5"], "--bootstrap must be 0 (no intervals) or a number"),
    ("greedy with a temperature", ["--greedy", "--temperature", "0.7"], "--greedy decodes without sampling, so "
     "--temperature would be ignored"),
    ("template with system placement", ["--template", "{context}"], "--template joins the context and the prompt in "
     "the user turn, so it applies only with --placement user"),
    ("separator with user placement", ["--placement", "user", "--separator", "/"], "--separator joins the context "
     "and a system message"),
    ("split of a local file", ["--split", "validation"], "is a single file, so it has no split 'validation'"),
    ("prompt past the position limit", ["--prompt", LONG], "its prompt without the context has"),
    ("context past the position limit", ["--context-text", LONG], "its prompt with the context has"),
    ("a huge prompt, refused untokenised", ["--prompt", "word " * 40_000], "its prompt without the context holds "
     "200,000 bytes of text, so at least"),
    ("output-dir is a file", ["--output-dir", "FILE"], "is a file, not a folder"),
    ("output-dir cannot be created", ["--output-dir", str(READ_ONLY / "out")], "Cannot create the output folder"),
    pytest.param("device cuda without CUDA", ["--device", "cuda"], "--device cuda asks for a CUDA GPU, and torch sees "
                 "none", marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
]  # fmt: skip


@pytest.mark.parametrize(
    "case, extra, expected", CASES, ids=[c.values[0] if hasattr(c, "marks") else c[0] for c in CASES]
)
def test_bad_eval_input_is_one_line_before_any_model_loads(
    short_model, tmp_path, capsys, no_model_loads, case, extra, expected
):
    extra = list(extra)
    prompt = extra[extra.index("--prompt") + 1] if "--prompt" in extra else "Which answer? (A) yes (B) no"
    if "--prompt" in extra:
        del extra[extra.index("--prompt") : extra.index("--prompt") + 2]
    out = tmp_path / "out"
    if "FILE" in extra:
        out.write_text("not a folder\n")
        extra[extra.index("FILE")] = str(out)
    argv = ["eval", "--model", short_model, "--dataset", items(tmp_path, prompt), "--max-new-tokens", "8",
            "--no-progress", "--no-plots"]  # fmt: skip
    if "--context-text" not in extra:
        argv += ["--context-text", "Answer with the letter."]
    if "--output-dir" not in extra:
        argv += ["--output-dir", str(out)]
    line = one_line([*argv, *extra], capsys)
    assert line.startswith("trl-nca eval: error: ") and expected in line, line
    if "position limit" in case:
        assert "exceeds the 64 positions of the model" in line and "Lower --max-new-tokens" in line
    assert not (out / "model").exists() and (not out.is_dir() or not any(out.iterdir()))  # nothing written


def test_a_second_eval_into_a_folder_in_use_is_refused(short_model, tmp_path, capsys, no_model_loads):
    """Two runs into one folder at once would interleave their records (two run keys in one records.jsonl)."""
    out = tmp_path / "out"
    argv = ["eval", "--model", short_model, "--dataset", items(tmp_path), "--context-text", "c",
            "--max-new-tokens", "4", "--output-dir", str(out)]  # fmt: skip
    with output_folder_lock(out, "trl-nca eval --seed 1"):
        line = one_line(argv, capsys)
    assert "is in use by another trl-nca run (pid" in line and "trl-nca eval --seed 1" in line, line
    assert not out.exists()  # the holder's folder, created by it, is gone with it; nothing of ours was written


def test_a_scorer_with_the_wrong_signature_is_refused(short_model, tmp_path, capsys, no_model_loads, monkeypatch):
    """A `--scorer module:fn` that cannot be called as fn(text, label) would score every answer wrong and exit 0."""
    (tmp_path / "my_scorers.py").write_text("def score(text):\n    return True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    line = one_line(["eval", "--model", short_model, "--dataset", items(tmp_path), "--context-text", "c",
                     "--scorer", "my_scorers:score", "--output-dir", str(tmp_path / "out")], capsys)  # fmt: skip
    assert (
        "The scorer function 'my_scorers:score' has the signature (text), but a scorer is called as fn(text, "
        "label)" in line
    ), line
    assert not (tmp_path / "out").exists()


def _break_model(model: Path, case: str) -> None:
    """The model folder with the fault of `case`."""
    if case == "a tokenizer without a chat template":
        for name in ("chat_template.jinja", "chat_template.json"):
            (model / name).unlink(missing_ok=True)
        settings = json.loads((model / "tokenizer_config.json").read_text())
        settings.pop("chat_template", None)
        (model / "tokenizer_config.json").write_text(json.dumps(settings))
    elif case == "a tokenizer larger than the embeddings":
        config = json.loads((model / "config.json").read_text())
        config["vocab_size"] = 64  # fewer embedding rows than the tokenizer's ids
        (model / "config.json").write_text(json.dumps(config))
    elif case == "a truncated model.safetensors":
        weights = model / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100_000])  # an interrupted download
    elif case == "a shard index naming a missing shard":
        shards = {"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}
        (model / "model.safetensors.index.json").write_text(json.dumps(shards))


# (case, the expected line's text): a model folder that cannot be evaluated, reported before any model loads
MODEL_CASES = [
    ("a tokenizer without a chat template", "has no chat template, so the prompts with and without the context "
     "cannot be rendered"),
    ("a tokenizer larger than the embeddings", "has 64 embedding rows (vocab_size): the tokenizer (320 tokens) is not "
     "the model's"),
    ("a truncated model.safetensors", "Model 'model': the weights file {model}/model.safetensors is cut short: it "
     "holds 100,000 bytes, but its header describes"),
    ("a shard index naming a missing shard", "names 1 shard(s) that are not in {model} "
     "(model-00002-of-00002.safetensors). Download or copy the model again"),
]  # fmt: skip


@pytest.mark.parametrize("case, expected", MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_a_model_folder_that_cannot_be_evaluated_is_refused(tmp_path, capsys, no_model_loads, case, expected):
    model = Path(save_tiny_model(tmp_path / "model"))
    _break_model(model, case)
    line = one_line(["eval", "--model", str(model), "--dataset", items(tmp_path), "--context-text", "c",
                     "--output-dir", str(tmp_path / "out")], capsys)  # fmt: skip
    assert expected.format(model=model) in line, line
    assert not (tmp_path / "out").exists()
