"""`trl-nca compare` on a bad `--config` (issue 35): each probe is one case of the table, with the one line it must
print; nothing is written (the check runs before the output folder is locked or any model loads)."""

import pytest

from trl_nca.cli import main as cli_main
from trl_nca.testing import one_error_line


def one_line(argv, capsys) -> str:
    return one_error_line(cli_main, argv, capsys)


CASES = [
    ("a folder", "{tmp}", None, "--config '{tmp}' is a folder; give the YAML file of the settings"),
    ("a missing file", "{tmp}/none.yaml", None, "--config '{tmp}/none.yaml' does not exist"),
    ("bad YAML", "{tmp}/bad.yaml", b"task: reply_in_french\nseeds: [0, 1\n", "is not valid YAML: "),
    ("a byte that is not UTF-8", "{tmp}/latin1.yaml", "task: reply_in_french\ntitle: caf\u00e9\n".encode("latin-1"),
     "Line 2 of the config '{tmp}/latin1.yaml' is not UTF-8 text: byte 0xe9. Save the file as UTF-8."),
    ("not settings", "{tmp}/list.yaml", b"- task\n- seeds\n", "holds a YAML list, not settings"),
    ("an unknown dtype", "{tmp}/dtype.yaml", b"task: reply_in_french\nuse_peft: true\ndtype: float64x\n", "dtype 'float64x' is not "
     "a dtype the models load in; give one of auto, bfloat16, float16, float32."),
    ("a LoRA rank of 0", "{tmp}/lora.yaml", b"task: reply_in_french\nuse_peft: true\nlora_r: 0\n", "lora_r must be "
     "an integer >= 1 (the LoRA rank and its scale), got 0."),
    ("an unquoted no", "{tmp}/no.yaml", b"task: reply_in_french\nsave_strategy: no\n", "`save_strategy` is the "
     "boolean False (YAML reads an unquoted no or off as a boolean), but it takes a word. Quote it: `save_strategy: "
     '"no"`.'),
]  # fmt: skip


@pytest.mark.parametrize("case, config, content, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_compare_config_is_one_line(tmp_path, capsys, case, config, content, expected):
    path = config.format(tmp=tmp_path)
    if content is not None:
        with open(path, "wb") as handle:
            handle.write(content)
    before = sorted(p.name for p in tmp_path.iterdir())
    line = one_line(["compare", "--config", path, "--output_dir", str(tmp_path / "out")], capsys)
    assert line.startswith("trl-nca compare: error: ") and expected.format(tmp=tmp_path) in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no output folder made


# (case, the config's budget line, the expected line's text): a token budget no model can hold, refused before the
# base models are evaluated (nothing is written)
BUDGET_CASES = [
    ("an unreachable max_new_tokens", "max_new_tokens: 1000000000", "Method 'opd' on the model {model}: In row 0, the "
     "prompt without context has"),
    ("an unreachable eval_max_new_tokens", "eval_max_new_tokens: 1000000000", "with a reply budget of 1000000000 "
     "tokens (eval_max_new_tokens, else max_new_tokens) exceeds the 4096 positions of the model {model}. Lower "
     "eval_max_new_tokens"),
]  # fmt: skip


@pytest.mark.parametrize("case, budget, expected", BUDGET_CASES, ids=[c[0] for c in BUDGET_CASES])
def test_an_unreachable_token_budget_is_refused_before_any_work(tiny_dir, tmp_path, capsys, case, budget, expected):
    config = tmp_path / "budget.yaml"
    config.write_text(f"task: reply_in_french\nuse_peft: true\nmodel_name_or_path: {tiny_dir}\n{budget}\n")
    line = one_line(["compare", "--config", str(config), "--output_dir", str(tmp_path / "out")], capsys)
    assert line.startswith("trl-nca compare: error: ") and expected.format(model=tiny_dir) in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["budget.yaml"]  # no output folder made
