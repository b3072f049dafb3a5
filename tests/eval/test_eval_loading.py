"""The one model-spec parser, model loader and context builder of `trl-nca eval` and `trl-nca analyze`
(`trl_nca.eval.loading`)."""

import pytest
import torch

from trl_nca.eval import loading
from trl_nca.eval.errors import EvalInputError
from trl_nca.eval.loading import ModelSpec, context_from_options, parse_model_specs, resolve_model_specs
from trl_nca.inputs import read_context


def triples(specs):
    return [(s.name, s.path, s.adapter) for s in specs]


# ----------------------------------------------------------------------------------------------------------------------
# Model specs


def test_separate_adapters_in_order_and_by_name():
    specs = parse_model_specs(["Qwen/Q", "Qwen/Q", "nca=Qwen/Q"], ["none", "runs/opd/", "-"])
    assert triples(specs) == [("Q", "Qwen/Q", None), ("opd", "Qwen/Q", "runs/opd/"), ("nca", "Qwen/Q", None)]
    named = parse_model_specs(["base=m", "m2"], ["m2=runs/a"])
    assert triples(named) == [("base", "m", None), ("m2", "m2", "runs/a")]  # named adapters go by the model's name


def test_inline_adapters_and_the_reference():
    specs = parse_model_specs(
        ["embedded", "nca=:runs/nca", "other:runs/x/ad", "opd=m:runs/opd"], inline_adapters=True, first_name="base"
    )
    assert triples(specs) == [
        ("base", "embedded", None),
        ("nca", "embedded", "runs/nca"),  # an empty PATH takes the first model's weights
        ("ad", "other", "runs/x/ad"),
        ("opd", "m", "runs/opd"),
    ]
    # without inline adapters a colon is part of the path, and the first model is named after its path
    assert triples(parse_model_specs(["a:b"])) == [("a:b", "a:b", None)]


@pytest.mark.parametrize(
    "models, adapters, inline, match",
    [
        ([], [], False, "at least one --model"),
        (["runs/a/final", "runs/b/final"], [], False, r"unique, got \['final'\] more than once; name the models"),
        (["m", "m"], ["a/x", "b/x"], False, r"unique, got \['x'\]"),
        (["a=m", "b=m"], ["a=x", "y"], False, "Either name every --adapter"),
        (["a=m"], ["c=x"], False, "names no model; the models are"),
        (["a=m", "b=m"], ["x"], False, "1 unnamed --adapter values for 2 models"),
        (["a=m"], ["a="], False, "gives no PATH"),
        (["nca="], [], False, "gives no PATH; write NAME=PATH"),
        ([":runs/nca"], [], True, "the first model .* needs weights"),
        (["m", "nca=m: "], [], True, "the adapter after ':' is blank"),
    ],
)
def test_bad_model_specs_name_the_fix(models, adapters, inline, match):
    with pytest.raises(EvalInputError, match=match):
        parse_model_specs(models, adapters, inline_adapters=inline)


def test_both_commands_name_the_same_model_alike():
    """`--model PATH --adapter ADAPTER` (eval) and `--model PATH:ADAPTER` (analyze) give the same spec."""
    from trl_nca.analysis import parse_model_specs as analyze_specs
    from trl_nca.cli.eval import parse_model_specs as eval_specs

    evaluated = eval_specs(["base=Qwen/Q", "Qwen/Q"], ["none", "runs/nca"])
    analysed = analyze_specs(["Qwen/Q", "Qwen/Q:runs/nca"])
    assert triples(evaluated) == triples(analysed) == [("base", "Qwen/Q", None), ("nca", "Qwen/Q", "runs/nca")]


def test_every_command_reads_one_model_spec_syntax(tmp_path):
    """`[NAME=]PATH[:ADAPTER]` in eval as in analyze (`trl_nca.cli.options`); a PATH that exists is never split."""
    from trl_nca.analysis import parse_model_specs as analyze_specs
    from trl_nca.cli.eval import parse_model_specs as eval_specs

    assert triples(eval_specs(["base=Qwen/Q", "Qwen/Q:runs/nca"], [])) == triples(
        analyze_specs(["Qwen/Q", "Qwen/Q:runs/nca"])
    )
    folder = tmp_path / "run:1"
    folder.mkdir()
    assert (
        triples(eval_specs([f"x={folder}"], []))
        == triples(analyze_specs([f"x={folder}"]))
        == [("x", str(folder), None)]
    )


def test_resolution_checks_every_model_and_adapter_before_loading(tiny_dir, tmp_path, monkeypatch):
    import trl_nca.models.names

    monkeypatch.setattr(trl_nca.models.names, "embedded_model_path", lambda: tiny_dir)
    (tmp_path / "ad").mkdir()
    specs = [ModelSpec("base", "embedded"), ModelSpec("nca", "embedded", str(tmp_path / "ad"))]
    assert triples(resolve_model_specs(specs)) == [("base", tiny_dir, None), ("nca", tiny_dir, str(tmp_path / "ad"))]
    assert specs[0].path == "embedded"  # the given specs are left as they were
    with pytest.raises(EvalInputError, match=r"Model 'x': path './no/model' does not exist"):
        resolve_model_specs([ModelSpec("x", "./no/model")])
    with pytest.raises(EvalInputError, match="Adapter './no/adapter' not found: no such folder"):
        resolve_model_specs([ModelSpec("x", tiny_dir, "./no/adapter")])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EvalInputError, match="no such folder, and the Hub is offline"):
        resolve_model_specs([ModelSpec("x", tiny_dir, "someone/adapter")])


# ----------------------------------------------------------------------------------------------------------------------
# Models and tokenizers


@pytest.fixture(scope="module")
def adapter_dir(tiny_dir, tmp_path_factory):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("adapter") / "lora"
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False)).save_pretrained(path)
    return str(path)


def test_load_model_dtype_device_and_eval_mode(tiny_dir):
    model = loading.load_model(tiny_dir, dtype="float16", device="cpu")
    assert not model.training and next(model.parameters()).dtype == torch.float16
    assert next(model.parameters()).device.type == "cpu"
    with pytest.raises(EvalInputError, match=r"--dtype must be one of \['auto', 'float32', 'bfloat16', 'float16'\]"):
        loading.load_model(tiny_dir, dtype="float64")


def test_load_model_adapter_frozen_or_trainable_and_on_a_copy_of_a_base(tiny_dir, adapter_dir):
    frozen = loading.load_model(tiny_dir, adapter_dir, dtype="float32")
    assert not any(p.requires_grad for n, p in frozen.named_parameters() if "lora_" in n)
    base = loading.load_model(tiny_dir, dtype="float32")
    trainable = loading.load_model(tiny_dir, adapter_dir, trainable_adapter=True, base=base)
    lora = [p for n, p in trainable.named_parameters() if "lora_" in n]
    assert lora and all(p.requires_grad for p in lora)
    assert not any("lora_" in n for n, _ in base.named_parameters())  # the base itself is left unchanged
    assert trainable.get_base_model() is not base
    with pytest.raises(EvalInputError, match="Adapter './missing' not found"):
        loading.load_model(tiny_dir, "./missing")


def test_load_errors_name_what_could_not_load(tiny_dir, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    with pytest.raises(EvalInputError, match=r"Model .*broken' could not be loaded .* config.json and the weights"):
        loading.load_model(str(broken))
    with pytest.raises(EvalInputError, match=r"Tokenizer .*broken' could not be loaded"):
        loading.load_tokenizer(str(broken))
    assert loading.load_tokenizer(tiny_dir).pad_token_id is not None


# ----------------------------------------------------------------------------------------------------------------------
# Context


def test_context_from_options_sources_and_defaults(tmp_path):
    default = context_from_options()
    assert (default.spec.column, default.spec.text, default.spec.placement, default.source) == (
        "context",
        None,
        "system",
        "column:context",
    )
    builtin = context_from_options(file="medical", column="ignored")
    assert (builtin.spec.text, builtin.source) == (read_context("medical"), "builtin:medical")
    path = tmp_path / "c.txt"
    path.write_text("Be brief.\n")
    given = context_from_options(file=str(path), placement="user", template="{prompt}\n---\n{context}")
    assert (given.spec.text, given.spec.placement, given.spec.template) == (
        "Be brief.",
        "user",
        "{prompt}\n---\n{context}",
    )
    assert given.source == f"file:{path}"
    text = context_from_options(text="Hi.", separator=" | ")
    assert (text.spec.text, text.spec.separator, text.source) == ("Hi.", " | ", "text")
    assert context_from_options(column="hint").source == "column:hint"


@pytest.mark.parametrize(
    "options, match",
    [
        ({"file": "/no/such/context.txt"}, "Context file '/no/such/context.txt' not found"),
        ({"text": "c", "placement": "user", "template": "{prompt}"}, r"lacks \{context\}"),
        ({"placement": "middle"}, "placement must be one of"),
        ({"column": ""}, "either as a dataset column name or as one fixed string"),
    ],
)
def test_bad_context_options_are_one_input_error(options, match):
    with pytest.raises(EvalInputError, match=match):
        context_from_options(**options)


def test_eval_and_analyze_build_the_same_context_from_the_same_options(tmp_path):
    """Both commands read their context options with the one builder, so the same options give the same context."""
    from trl_nca.cli.analyze import build_parser as analyze_parser
    from trl_nca.cli.eval import build_parser as eval_parser

    path = tmp_path / "c.txt"
    path.write_text("Answer in French.")
    for options in (
        [],
        ["--context-file", str(path), "--placement", "user"],
        ["--context-text", "x", "--separator", "/"],
    ):
        evaluated = loading.context_from_args(eval_parser().parse_args(["--model", "m", *options]))
        analysed = loading.context_from_args(analyze_parser().parse_args(["--model", "m", *options]))
        assert evaluated == analysed, options
