"""`trl-nca train` on bad input (issue 35): each probe is one case of the table, with the one line it must print,
and no model is loaded before it. A resume is refused when a setting that shapes the result changed since the run
started (`train_settings.json`), and a checkpoint is judged by its files."""

import json
import logging
import shutil
from pathlib import Path

import pytest

from trl_nca.cli import main as cli_main
from trl_nca.testing import one_error_line


READ_ONLY = Path("/sys/trl-nca-test")  # a place nobody can create a folder in, root included
ROWS = [{"prompt": f"Question {i}: which answer? (A) yes (B) no", "answer": "A"} for i in range(4)]


def one_line(argv, capsys) -> str:
    return one_error_line(cli_main, argv, capsys)


def train_argv(model, data, out, *extra):
    return [
        "train",
        "--model_name_or_path",
        str(model),
        "--dataset_name",
        str(data),
        "--context_text",
        "Answer A.",
        "--per_device_train_batch_size",
        "2",
        "--max_steps",
        "2",
        "--max_new_tokens",
        "3",
        "--learning_rate",
        "1e-3",
        "--save_strategy",
        "steps",
        "--save_steps",
        "2",
        "--output_dir",
        str(out),
        "--bf16",
        "false",
        "--use_cpu",
        "true",
        "--report_to",
        "none",
        "--gradient_checkpointing",
        "false",
        "--disable_tqdm",
        "true",
        *extra,
    ]


@pytest.fixture(scope="module")
def finished_run(tiny_dir, tmp_path_factory):
    """A 2-step run of `trl-nca train` with its checkpoint-2 (its data file next to it)."""
    root = tmp_path_factory.mktemp("run")
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    assert cli_main(train_argv(tiny_dir, data, root / "out")) == 0
    assert (root / "out" / "checkpoint-2" / "optimizer.pt").is_file() and (
        root / "out" / "train_settings.json"
    ).is_file()
    return root


@pytest.fixture
def run_copy(finished_run, tmp_path):
    """A copy of the finished run to change: (data file, output_dir)."""
    shutil.copytree(finished_run, tmp_path / "run")
    return tmp_path / "run" / "data.jsonl", tmp_path / "run" / "out"


def _edit_data(data: Path) -> None:
    data.write_text("".join(json.dumps({**row, "prompt": row["prompt"] + " (new)"}) + "\n" for row in ROWS))


# (case, how the run is changed: options replaced, or a function of the data file; the expected line's text)
RESUME_CASES = [
    ("changed data", _edit_data, "`data.identity` was 'sha256:"),
    ("changed context", ["--context_text", "Answer B."], "`training.context_text` was 'Answer A.', now 'Answer B.'"),
    ("changed nca_beta", ["--nca_beta", "0"], "`training.nca_beta` was 0.5, now 0.0"),
    ("changed learning rate", ["--learning_rate", "1e-2"], "`training.learning_rate` was 0.001, now 0.01"),
    (
        "changed schedule",
        ["--lr_scheduler_type", "constant"],
        "`training.lr_scheduler_type` was 'linear', now 'constant'",
    ),
    ("changed model", ["--model_name_or_path", "TEACHER"], "`model` was"),
]


@pytest.mark.parametrize("case, change, expected", RESUME_CASES, ids=[c[0] for c in RESUME_CASES])
def test_a_resume_with_changed_settings_is_refused_before_any_model_loads(
    run_copy, tiny_dir, tiny_teacher_dir, capsys, no_model_loads, case, change, expected
):
    data, out = run_copy
    argv = train_argv(tiny_dir, data, out, "--resume_from_checkpoint", "true")
    if callable(change):
        change(data)
    else:
        for option, value in zip(change[::2], change[1::2]):
            value = str(tiny_teacher_dir) if value == "TEACHER" else value
            if option in argv:
                argv[argv.index(option) + 1] = value
            else:
                argv += [option, value]
    before = sorted(p.name for p in out.iterdir())
    line = one_line(argv, capsys)
    assert (
        line.startswith("trl-nca train: error: ")
        and "train_settings.json holds a training run made with other settings" in line
        and expected in line
    ), line
    assert "Use a new output_dir, or set them back" in line
    assert sorted(p.name for p in out.iterdir()) == before


@pytest.mark.parametrize(
    "removed, expected",
    [
        (("optimizer.pt", "scheduler.pt", "rng_state.pth"), "lacks optimizer.pt and scheduler.pt and rng_state.pth"),
        (("model.safetensors",), "lacks the weights (model.safetensors or adapter_model.safetensors)"),
    ],
    ids=["no optimizer, scheduler or random state", "no weights"],
)
def test_a_checkpoint_is_judged_by_its_files(run_copy, tiny_dir, capsys, no_model_loads, removed, expected):
    data, out = run_copy
    checkpoint = out / "checkpoint-2"
    for name in removed:
        (checkpoint / name).unlink()
    line = one_line(train_argv(tiny_dir, data, out, "--resume_from_checkpoint", str(checkpoint)), capsys)
    assert f"--resume_from_checkpoint '{checkpoint}' cannot be resumed: it has a trainer_state.json but " in line
    assert expected in line and "Give a complete checkpoint-N folder" in line, line
    line = one_line(train_argv(tiny_dir, data, out, "--resume_from_checkpoint", "true"), capsys)
    assert "holds no checkpoint-N folder to resume from that is complete" in line, line  # the only one is incomplete


CASES = [
    ("config is a folder", ["--config", "FOLDER"], "--config '{tmp}' is a folder; give the YAML file"),
    ("config does not exist", ["--config", "{tmp}/none.yaml"], "--config '{tmp}/none.yaml' does not exist"),
    (
        "config is not YAML",
        ["--config", "BAD_YAML"],
        "is not valid YAML: expected ',' or ']', but got '<stream end>' "
        "(line 3, column 1; while parsing a flow sequence at line 2). Fix that line",
    ),
    (
        "config has a byte that is not UTF-8",
        ["--config", "NOT_UTF8"],
        "Line 2 of the config '{tmp}/latin1.yaml' is not UTF-8 text: byte 0xe9. Save the file as UTF-8.",
    ),
    (
        "mixed prompt types",
        ["--dataset_name", "MIXED"],
        "mixes kinds of values in column 'prompt': row 0 holds a str, row 1 a list",
    ),
    (
        "unknown dtype",
        ["--model_init_kwargs", '{{"dtype": "float64x"}}'],
        "dtype 'float64x' is not a dtype the models load in; give one of auto, bfloat16, float16, float32.",
    ),
    (
        "a LoRA rank of 0",
        ["--use_peft", "true", "--lora_r", "0"],
        "lora_r must be an integer >= 1 (the LoRA rank and its scale), got 0.",
    ),
    (
        "no steps at all",
        ["--max_steps", "-1", "--num_train_epochs", "-1"],
        "num_train_epochs must be a finite "
        "number > 0 (with max_steps=-1 the epochs set the run's length; <= 0 would train 0 steps), got the float -1.0",
    ),
    ("negative learning rate", ["--learning_rate=-0.001"], "learning_rate must be a finite number >= 0"),
    ("output_dir cannot be created", ["--output_dir", str(READ_ONLY / "out")], "Cannot create the output folder"),
    ("prompt past the position limit", ["--dataset_name", "LONG"], "In row 0, the prompt without context has"),
    (
        "context past the position limit",
        ["--context_text", " ".join(["rule"] * 5000)],
        "In row 0, the context view is too long",
    ),
    ("context past max_context_length", ["--max_context_length", "50"], "In row 0, the context view is too long"),
    (
        "an unreachable max_new_tokens",
        ["--max_new_tokens", "1000000000"],
        "max_new_tokens 1000000000 leaves no room for a prompt in the 4096 positions of the model",
    ),
    (
        "a huge prompt, refused untokenised",
        ["--dataset_name", "HUGE"],
        "Row 0 of the train dataset: its prompt without the context holds 200,000 bytes of text, so at least",
    ),
    (
        "a gate target no step can reach",
        ["--nca_adaptive_target", "1e300"],
        "nca_adaptive_target=1e+300 can never be "
        "reached: the anchor grows only at a step whose view_kl exceeds nca_adaptive_target x opd_loss",
    ),
]


@pytest.mark.parametrize("case, extra, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_train_input_is_one_line_before_any_model_loads(
    tiny_dir, tmp_path, capsys, no_model_loads, case, extra, expected
):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    files = {
        "FOLDER": str(tmp_path),
        "BAD_YAML": tmp_path / "bad.yaml",
        "NOT_UTF8": tmp_path / "latin1.yaml",
        "MIXED": tmp_path / "mixed.jsonl",
        "LONG": tmp_path / "long.jsonl",
        "HUGE": tmp_path / "huge.jsonl",
    }
    for name, prompt in (("LONG", " ".join(["rule"] * 5000)), ("HUGE", "word " * 40_000)):  # 4096 positions
        files[name].write_text("".join(json.dumps(row) + "\n" for row in [{"prompt": prompt}, *ROWS]))
    files["BAD_YAML"].write_text("max_steps: 1\nlora_target_modules: [q_proj, v_proj\n")
    files["NOT_UTF8"].write_bytes("max_steps: 1\nrun_name: caf\u00e9\n".encode("latin-1"))
    files["MIXED"].write_text(
        json.dumps({"prompt": "q"}) + "\n" + json.dumps({"prompt": [{"role": "user", "content": "q"}]}) + "\n"
    )
    extra = [str(files.get(value, value)).format(tmp=tmp_path) for value in extra]
    argv = train_argv(tiny_dir, data, tmp_path / "out")
    if "--dataset_name" in extra:
        argv = argv[: argv.index("--dataset_name")] + argv[argv.index("--dataset_name") + 2 :]
    line = one_line([*argv, *extra], capsys)
    assert line.startswith("trl-nca train: error: ") and expected.format(tmp=tmp_path) in line, line
    assert not (tmp_path / "out").exists()


# Settings that can never act but leave a valid run (issue 50 item 6): one warning line each, naming the field and the
# fix, before any model loads; the run then trains as given. (case, options, the expected line)
NEVER_ACTING = [
    (
        "adaptive fields under the constant anchor",
        ["--nca_beta_schedule", "constant", "--nca_adaptive_target", "2"],
        "nca_adaptive_target=2.0 is set but nca_beta_schedule='constant' does not read it. Remove it, or set "
        "nca_beta_schedule='adaptive' to use it.",
    ),
    (
        "warmup fields under the adaptive anchor",
        ["--nca_warmup_steps", "5"],
        "nca_warmup_steps=5 is set but "
        "nca_beta_schedule='adaptive' does not read it. Remove it, or set nca_beta_schedule='warmup' to use it.",
    ),
    (
        "schedule fields under plain OPD",
        ["--nca_beta", "0", "--nca_adaptive_min", "0.1"],
        "nca_adaptive_min=0.1 is "
        "set but nca_beta=0 (plain OPD) schedules no anchor. Remove it, or set nca_beta > 0 and "
        "nca_beta_schedule='adaptive' to use it.",
    ),
    (
        "a warmup longer than the run",
        ["--nca_beta_schedule", "warmup", "--nca_warmup_steps", "1000", "--max_steps", "1"],
        "nca_warmup_steps=1000 is not shorter than the run (max_steps=1): the anchor never reaches nca_beta=0.5, "
        "its last step weighs it at 0. Set nca_warmup_steps below max_steps, or nca_beta_schedule='constant'.",
    ),
]


@pytest.mark.parametrize("case, extra, expected", NEVER_ACTING, ids=[c[0] for c in NEVER_ACTING])
def test_settings_that_can_never_act_are_named_before_any_model_loads(
    tiny_dir, tmp_path, caplog, no_model_loads, case, extra, expected
):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    argv = train_argv(tiny_dir, data, tmp_path / "out")
    for option, value in zip(extra[::2], extra[1::2]):
        if option in argv:
            argv[argv.index(option) + 1] = value
        else:
            argv += [option, value]
    with caplog.at_level(logging.WARNING), pytest.raises(AssertionError, match="a model was loaded"):
        cli_main(argv)  # no_model_loads stops the run at its first model: the line came before it
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [line for line in lines if expected in line] == [expected], lines


# (case, the disk's size, options, the one expected line, the names left in output_dir): a real small tmpfs. The tiny
# model's weights are 115,008 parameters x 4 bytes (449.2 KiB): 200k cannot hold them, 464k holds them as the room
# check counts them but not the files written with them (config, tokenizer), 900k the weights but not the optimizer.
FULL_DISK_CASES = [
    (
        "no room for the final weights",
        "200k",
        ["--save_strategy", "no"],
        "output_dir '{out}' has 196.0 KiB free, but "
        "the final weights need about 449.2 KiB (115,008 parameters x 4 bytes): 253.2 KiB short.",
        None,
    ),
    (
        "the disk fills at the final save",
        "464k",
        ["--save_strategy", "no"],
        "No space left to write the trained model "
        "into {out} (safetensors: Error while serializing: I/O error: No space left on device (os error 28)); nothing of "
        "it was kept as the model and no checkpoint was saved.",
        ["train_settings.json"],
    ),
    (
        "the disk fills at a checkpoint's weights",
        "464k",
        ["--save_steps", "1"],
        "No space left to write a checkpoint "
        "in {out} (safetensors: Error while serializing: I/O error: No space left on device (os error 28)). Free some "
        "space (or choose an output folder on another disk) and run the same command again (no complete checkpoint was "
        "written yet).",
        ["README.md", "train_settings.json"],
    ),
    (
        "the disk fills at a checkpoint's optimizer",
        "900k",
        ["--save_steps", "1"],
        "No space left to write a checkpoint in {out} (torch: ",
        ["README.md", "train_settings.json"],
    ),
]


@pytest.mark.slow  # starts `mount` and `umount`
@pytest.mark.parametrize("case, size, extra, expected, left", FULL_DISK_CASES, ids=[c[0] for c in FULL_DISK_CASES])
def test_a_full_disk_is_one_line_and_no_half_written_model(
    tiny_dir, tmp_path, capsys, case, size, extra, expected, left
):
    """A disk too small for the final weights is refused before training; one that fills at a save (safetensors'
    SafetensorError, torch's writer error) is one line, and no cut model or checkpoint is left as if it were one."""
    import subprocess

    from tests.cli.test_safe_outputs import _mount_tmpfs

    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, size):
        pytest.skip("cannot mount a small tmpfs here (needs root and CAP_SYS_ADMIN): the full-disk case is not run")
    try:
        data = tmp_path / "data.jsonl"
        data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
        out = disk / "out"
        line = one_line(train_argv(tiny_dir, data, out, *extra), capsys)
        assert line.startswith(f"trl-nca train: error: {expected.format(out=out)}"), line
        if left is None:  # refused before training: nothing written
            assert not out.exists()
        else:
            assert sorted(p.name for p in out.iterdir()) == left
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True, timeout=30)


# (case, the options changed on resume, the line it prints, the step the resumed run ends at): the run's length may
# change, as in Trainer; every other change is refused (RESUME_CASES)
LENGTH_CASES = [
    (
        "a longer max_steps",
        ["--max_steps", "4"],
        "Resuming with a new length (max_steps 2 -> 4): the 'linear' "
        "learning-rate schedule is laid out again over the new length; the first resumed step keeps the rate the "
        "checkpoint's optimizer holds (where the old schedule ended), the steps after it follow the new schedule.",
        4,
    ),
    (
        "epochs instead of max_steps",
        ["--max_steps", "-1", "--num_train_epochs", "3"],
        "Resuming with a new length "
        "(max_steps 2 -> -1): the 'linear' learning-rate schedule is laid out again over the new length;",
        6,
    ),
]


@pytest.mark.parametrize("case, change, expected, end", LENGTH_CASES, ids=[c[0] for c in LENGTH_CASES])
def test_a_resume_may_change_the_runs_length(finished_run, run_copy, tiny_dir, caplog, case, change, expected, end):
    _, out = run_copy  # the run's own data file: the copy's would be another dataset
    argv = train_argv(tiny_dir, finished_run / "data.jsonl", out, "--resume_from_checkpoint", "true", *change)
    assert cli_main(argv) == 0
    assert sum(expected in record.getMessage() for record in caplog.records) == 1, caplog.text
    state = json.loads((out / f"checkpoint-{end}" / "trainer_state.json").read_text())
    assert state["global_step"] == end and (out / "checkpoint-2" / "optimizer.pt").is_file()  # trained on from step 2


def test_train_cli_empty_dataset_file(tiny_dir, tmp_path, capsys):
    data = tmp_path / "empty.jsonl"
    data.write_text("\n")
    common = [
        "--model_name_or_path",
        tiny_dir,
        "--output_dir",
        str(tmp_path / "t"),
        "--use_cpu",
        "true",
        "--bf16",
        "false",
    ]
    assert cli_main(["train", *common, "--dataset_name", str(data)]) == 2
    assert f"The dataset file '{data}' holds no rows" in capsys.readouterr().err
    assert cli_main(["train", *common, "--max_train_samples", "0"]) == 2
    assert "max_train_samples must be at least 1, got 0" in capsys.readouterr().err


def test_train_cli_config_and_data_mistakes_are_one_line(tiny_dir, tmp_path, capsys):
    common = [
        "--model_name_or_path",
        tiny_dir,
        "--output_dir",
        str(tmp_path / "t"),
        "--use_cpu",
        "true",
        "--bf16",
        "false",
    ]
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


def test_train_data_with_a_missing_prompt_is_one_line(tiny_dir, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": null}\n{"prompt": "q"}\n')
    err = one_error_line(
        cli_main,
        [
            "train",
            "--model_name_or_path",
            tiny_dir,
            "--dataset_name",
            str(data),
            "--context_text",
            "c",
            "--output_dir",
            str(tmp_path / "t"),
            "--use_cpu",
            "true",
            "--bf16",
            "false",
        ],
        capsys,
        command="train",
    )
    assert "Row 0 of the train dataset has neither a `messages` nor a `prompt`" in err


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_train_seed_out_of_range_is_one_line_before_loading(tiny_dir, tmp_path, capsys, seed):
    err = one_error_line(
        cli_main,
        [
            "train",
            "--model_name_or_path",
            tiny_dir,
            "--seed",
            str(seed),
            "--output_dir",
            str(tmp_path / "t"),
            "--use_cpu",
            "true",
            "--bf16",
            "false",
        ],
        capsys,
        command="train",
    )
    assert "seed must be an integer >= 0" in err and not (tmp_path / "t").exists()
