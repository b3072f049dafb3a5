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
    (
        "a byte that is not UTF-8",
        "{tmp}/latin1.yaml",
        "task: reply_in_french\ntitle: caf\u00e9\n".encode("latin-1"),
        "Line 2 of the config '{tmp}/latin1.yaml' is not UTF-8 text: byte 0xe9. Save the file as UTF-8.",
    ),
    ("not settings", "{tmp}/list.yaml", b"- task\n- seeds\n", "holds a YAML list, not settings"),
    (
        "an unknown dtype",
        "{tmp}/dtype.yaml",
        b"task: reply_in_french\nuse_peft: true\ndtype: float64x\n",
        "dtype 'float64x' is not a dtype the models load in; give one of auto, bfloat16, float16, float32.",
    ),
    (
        "a LoRA rank of 0",
        "{tmp}/lora.yaml",
        b"task: reply_in_french\nuse_peft: true\nlora_r: 0\n",
        "lora_r must be an integer >= 1 (the LoRA rank and its scale), got 0.",
    ),
    (
        "a key set twice",
        "{tmp}/twice.yaml",
        b"task: reply_in_french\nseeds: [0]\nseeds: [0, 1]\n",
        "The config '{tmp}/twice.yaml' sets `seeds` twice (lines 2 and 3); YAML would keep the last one without a word.",
    ),
    (
        "an unquoted no",
        "{tmp}/no.yaml",
        b"task: reply_in_french\nsave_strategy: no\n",
        "`save_strategy` is the "
        "boolean False (YAML reads an unquoted no or off as a boolean), but it takes a word. Quote it: `save_strategy: "
        '"no"`.',
    ),
]


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
    (
        "an unreachable max_new_tokens",
        "max_new_tokens: 1000000000",
        "Method 'opd' on the model {model}: In row 0, the prompt without context has",
    ),
    (
        "an unreachable eval_max_new_tokens",
        "eval_max_new_tokens: 1000000000",
        "with a reply budget of 1000000000 "
        "tokens (eval_max_new_tokens, else max_new_tokens) exceeds the 4096 positions of the model {model}. Lower "
        "eval_max_new_tokens",
    ),
]


@pytest.mark.parametrize("case, budget, expected", BUDGET_CASES, ids=[c[0] for c in BUDGET_CASES])
def test_an_unreachable_token_budget_is_refused_before_any_work(tiny_dir, tmp_path, capsys, case, budget, expected):
    config = tmp_path / "budget.yaml"
    config.write_text(f"task: reply_in_french\nuse_peft: true\nmodel_name_or_path: {tiny_dir}\n{budget}\n")
    line = one_line(["compare", "--config", str(config), "--output_dir", str(tmp_path / "out")], capsys)
    assert line.startswith("trl-nca compare: error: ") and expected.format(model=tiny_dir) in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["budget.yaml"]  # no output folder made


# (case, the config's changes, the warning it prints before any model loads): a schedule field that no run's schedule
# reads, named as `trl-nca train` names it (issue 57)
UNREAD_CASES = [
    (
        "a shared warm-up no method's schedule reads",
        {"nca_warmup_steps": 5},
        "nca_warmup_steps=5 is set but nca_beta_schedule='gated' does not read it. Remove it, or set "
        "nca_beta_schedule='warmup' to use it.",
    ),
    (
        "a method's own warm-up its schedule does not read",
        {"methods": '["opd:nca_beta=0", "nca:nca_beta=0.5,nca_warmup_steps=3"]'},
        "Method 'nca': nca_warmup_steps=3 is set but nca_beta_schedule='gated' does not read it. Remove it, or set "
        "nca_beta_schedule='warmup' to use it.",
    ),
]


@pytest.mark.parametrize("case, changes, expected", UNREAD_CASES, ids=[c[0] for c in UNREAD_CASES])
def test_schedule_fields_no_run_reads_are_named_before_any_model_loads(
    tiny_dir, tmp_path, caplog, no_model_loads, case, changes, expected
):
    import logging

    argv = compare_yaml(tmp_path, model_name_or_path=tiny_dir, **changes)
    with caplog.at_level(logging.WARNING), pytest.raises(AssertionError, match="a model was loaded"):
        cli_main(argv)  # no_model_loads stops the run at its first model: the line came before it
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [line for line in lines if expected in line] == [expected], lines


def compare_yaml(tmp_path, **changes):
    fields = {
        "model_name_or_path": "/nonexistent/model",
        "task": "reply_in_french",
        "seeds": "[0]",
        "methods": '["opd:nca_beta=0", "nca:nca_beta=0.5"]',
        "num_train": 2,
        "eval_items": 2,
        "max_steps": 1,
        "use_peft": "true",
        "report_to": "none",
        "output_dir": str(tmp_path / "out"),
        **changes,
    }
    config = tmp_path / "compare.yaml"
    config.write_text("".join(f"{key}: {value}\n" for key, value in fields.items()))
    return ["compare", "--config", str(config)]


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
        (  # an organism not shipped nor cached: the unit name is checked before it would pretrain (issue 50)
            {"model_name_or_path": "organism", "task": "organism_shift", "organism_seeds": "[99]"},
            ["--slice", "opd-seed0", "--slices_dir", "S"],
            "`slice: opd-seed0` is not a unit of this comparison; its units are ['base-org99', 'opd-org99-seed0', ",
        ),
    ],
)
def test_compare_bad_inputs_are_one_line_before_any_work(tmp_path, capsys, monkeypatch, changes, extra, message):
    import trl_nca.models.organism

    def no_pretraining(*args, **kwargs):
        raise AssertionError("an organism was pretrained before the inputs were checked")

    monkeypatch.setattr(trl_nca.models.organism, "pretrain", no_pretraining)
    monkeypatch.setattr(trl_nca.models.organism, "organism_model_path", no_pretraining)
    err = one_error_line(cli_main, [*compare_yaml(tmp_path, **changes), *extra], capsys, command="compare")
    assert message in err, err
    assert not (tmp_path / "out").exists()


def test_an_output_dir_that_is_a_file_is_refused_by_compare_and_train(tmp_path, tiny_dir, capsys):
    taken = tmp_path / "taken"
    taken.write_text("a file\n")
    err = one_error_line(cli_main, compare_yaml(tmp_path, output_dir=str(taken)), capsys, command="compare")
    assert f"output_dir {str(taken)!r} is a file, not a folder" in err
    err = one_error_line(
        cli_main,
        ["train", "--model_name_or_path", tiny_dir, "--output_dir", str(taken), "--use_cpu", "true", "--bf16", "false"],
        capsys,
        command="train",
    )
    assert f"output_dir {str(taken)!r} is a file, not a folder" in err


@pytest.mark.parametrize("command", ["compare", "analyze"])
def test_task_help_lists_every_task_of_the_registry(capsys, command):
    from trl_nca.tasks import task_names

    assert cli_main([command, "--help"]) == 0  # from the help spec (trl_nca.cli.help): no parser is built
    text = " ".join(capsys.readouterr().out.split())
    assert "town_facts" in task_names() and all(name in text for name in task_names()), text


def _read_only_folder(tmp_path):
    """A read-only bind mount of a new folder (root ignores chmod), or None where mount is not permitted."""
    import subprocess

    folder = tmp_path / "ro"
    folder.mkdir()
    try:
        done = subprocess.run(
            ["mount", "--bind", "-o", "ro", str(folder), str(folder)], capture_output=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return folder if done.returncode == 0 else None


# (case, the slices option, the slices folder: a file, a read-only folder or none, the expected line): the slices folder
# is checked before any model loads (the model here does not exist: its error would come later), nothing is written
SLICES_DIR_CASES = [
    ("a file", "--slice", "FILE", "slices_dir '{dir}' is a file, not a folder; give the folder of the slice files."),
    (
        "read-only",
        "--slice",
        "RO",
        "slices_dir '{dir}' cannot be written (Read-only file system); the slice would be "
        "lost after its unit ran. Give a folder you can write to",
    ),
    (
        "below a read-only folder",
        "--slice",
        "RO/slices",
        "slices_dir '{dir}' cannot be written (Read-only file system)",
    ),
    (
        "missing, to build from",
        "--from_slices",
        "NONE",
        "slices_dir '{dir}' does not exist; give the folder the slices were written to",
    ),
]


@pytest.mark.slow  # starts `mount` and `umount`
@pytest.mark.parametrize("case, option, folder, expected", SLICES_DIR_CASES, ids=[c[0] for c in SLICES_DIR_CASES])
def test_a_slices_folder_that_cannot_serve_is_refused_before_any_work(tmp_path, capsys, case, option, folder, expected):
    import subprocess

    read_only = _read_only_folder(tmp_path) if folder.startswith("RO") else None
    if folder.startswith("RO") and read_only is None:
        pytest.skip("cannot bind-mount a read-only folder here (needs root and CAP_SYS_ADMIN)")
    try:
        slices = {"FILE": tmp_path / "slices.json", "NONE": tmp_path / "none"}.get(folder) or tmp_path / folder.lower()
        if folder == "FILE":
            slices.write_text("{}")
        value = ["--slice", "base"] if option == "--slice" else ["--from_slices", "true"]
        err = one_error_line(
            cli_main, [*compare_yaml(tmp_path), *value, "--slices_dir", str(slices)], capsys, command="compare"
        )
        assert expected.format(dir=slices) in err, err
        assert not (tmp_path / "out").exists() and not (tmp_path / "none").exists()
    finally:
        if read_only is not None:
            subprocess.run(["umount", str(read_only)], capture_output=True, timeout=30)
