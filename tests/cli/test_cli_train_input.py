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


def _unfinished(out: Path, comparison: Path) -> None:
    """The run as an interrupted one leaves it: its checkpoints, no final model."""
    for name in ("model.safetensors", "config.json"):
        (out / name).unlink()


def _compare_folder(out: Path, comparison: Path) -> None:
    """A finished `trl-nca compare` run's folder in place of the run."""
    shutil.rmtree(out)
    shutil.copytree(comparison, out)


COMPARE_CONFIG = """
model_name_or_path: {model}
task: reply_in_french
seeds: [0]
methods: ["opd:nca_beta=0"]
num_train: 2
eval_items: 2
max_new_tokens: 3
max_steps: 1
use_peft: true
lora_r: 2
lora_target_modules: [q_proj, v_proj]
report_to: none
"""

# (case, how the finished run's folder is changed first, the options changed, the expected line): what a run would
# overwrite or mix, refused before any model loads; the folder is left as it was
FOLDER_CASES = [
    (
        "an unfinished run trained again without --resume_from_checkpoint",
        _unfinished,
        [],
        "holds the checkpoints of an unfinished run (1; its last complete one is checkpoint-2): a new run would train "
        "from step 1 and overwrite them. Run the same command with --resume_from_checkpoint true to continue it",
    ),
    (
        "a finished run trained anew with another learning rate",
        None,
        ["--learning_rate", "1e-2"],
        "holds a trained model (model.safetensors): a new run would replace it without a trace. Give a new output_dir",
    ),
    (
        "a finished comparison's folder",
        _compare_folder,
        [],
        "holds a `trl-nca compare` run (settings.json, task.json): `trl-nca train` would write its model among the "
        "comparison's files and replace its README.md. Give another output_dir.",
    ),
    (
        "a resume from another run's checkpoint with another learning rate",
        None,
        ["--resume_from_checkpoint", "CHECKPOINT", "--output_dir", "NEW", "--learning_rate", "1e-2"],
        "/run/out/train_settings.json holds a training run made with other settings: `training.learning_rate` was "
        "0.001, now 0.01.",
    ),
    (
        "max_steps below the checkpoint's step",
        None,
        ["--resume_from_checkpoint", "true", "--max_steps", "1"],
        "max_steps=1 is below the step of the checkpoint to resume (checkpoint-2, step 2): the run would train nothing.",
    ),
]


@pytest.fixture(scope="module")
def finished_comparison(tiny_dir, tmp_path_factory):
    """The output folder of a finished `trl-nca compare` run (one student, one step)."""
    from trl_nca.cli import compare

    root = tmp_path_factory.mktemp("comparison")
    (root / "compare.yaml").write_text(COMPARE_CONFIG.format(model=tiny_dir))
    compare(["--config", str(root / "compare.yaml"), "--output_dir", str(root / "out")])
    assert (root / "out" / "comparison.json").is_file()
    return root / "out"


@pytest.mark.parametrize("case, prepare, change, expected", FOLDER_CASES, ids=[c[0] for c in FOLDER_CASES])
def test_what_a_run_would_overwrite_or_mix_is_refused_before_any_model_loads(
    finished_run, finished_comparison, run_copy, tiny_dir, capsys, no_model_loads, case, prepare, change, expected
):
    _, out = run_copy
    data = finished_run / "data.jsonl"  # the run's own data file: the copy's would be another dataset
    if prepare is not None:
        prepare(out, finished_comparison)
    before = {p.relative_to(out.parent): p.stat().st_mtime_ns for p in out.parent.rglob("*") if p.is_file()}
    places = {"CHECKPOINT": str(out / "checkpoint-2"), "NEW": str(out.parent / "new")}
    argv = train_argv(tiny_dir, data, out)
    for option, value in zip(change[::2], change[1::2]):
        value = places.get(value, value)
        if option in argv:
            argv[argv.index(option) + 1] = value
        else:
            argv += [option, value]
    capsys.readouterr()
    line = one_line(argv, capsys)
    assert line.startswith("trl-nca train: error: ") and expected in line, line
    assert {p.relative_to(out.parent): p.stat().st_mtime_ns for p in out.parent.rglob("*") if p.is_file()} == before


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
    (
        "a key set twice in the config",
        ["--config", "TWICE"],
        "The config '{tmp}/twice.yaml' sets `max_steps` twice (lines 1 and 2); YAML would keep the last one without a "
        "word. Keep one of them.",
    ),
    (
        "a word where the config takes a number",
        ["--config", "WORD"],
        "In the config '{tmp}/word.yaml', `max_steps: 'ten'` is refused: argument --max_steps/--max-steps: invalid "
        "int value: 'ten'. Fix that line.",
    ),
    (
        "one module name where the config takes a list",
        ["--config", "ONE_MODULE"],
        "In the config '{tmp}/module.yaml', `lora_target_modules: q_proj` is one value, but `lora_target_modules` "
        "takes a list (PEFT reads a lone string as a pattern that must match a module's whole name",
    ),
    (
        "the output folder's lock file is a folder",
        ["--output_dir", "LOCK_FOLDER"],
        "{tmp}/locked/.trl-nca.lock is a folder, but trl-nca keeps the lock of {tmp}/locked in a file of that name.",
    ),
]
CONFIGS = {  # the config files of CASES, by name: (file, text); the options they set are left off the command line
    "BAD_YAML": ("bad.yaml", "max_steps: 1\nlora_target_modules: [q_proj, v_proj\n"),
    "TWICE": ("twice.yaml", "max_steps: 4\nmax_steps: 2\n"),
    "WORD": ("word.yaml", 'max_steps: "ten"\n'),
    "ONE_MODULE": ("module.yaml", "use_peft: true\nlora_target_modules: q_proj\n"),
}


@pytest.mark.parametrize("case, extra, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_train_input_is_one_line_before_any_model_loads(
    tiny_dir, tmp_path, capsys, no_model_loads, case, extra, expected
):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    files = {
        "FOLDER": str(tmp_path),
        "NOT_UTF8": tmp_path / "latin1.yaml",
        "MIXED": tmp_path / "mixed.jsonl",
        "LONG": tmp_path / "long.jsonl",
        "HUGE": tmp_path / "huge.jsonl",
        "LOCK_FOLDER": tmp_path / "locked",
    }
    for name, prompt in (("LONG", " ".join(["rule"] * 5000)), ("HUGE", "word " * 40_000)):  # 4096 positions
        files[name].write_text("".join(json.dumps(row) + "\n" for row in [{"prompt": prompt}, *ROWS]))
    for name, (file, text) in CONFIGS.items():
        files[name] = tmp_path / file
        files[name].write_text(text)
    files["NOT_UTF8"].write_bytes("max_steps: 1\nrun_name: caf\u00e9\n".encode("latin-1"))
    files["MIXED"].write_text(
        json.dumps({"prompt": "q"}) + "\n" + json.dumps({"prompt": [{"role": "user", "content": "q"}]}) + "\n"
    )
    (files["LOCK_FOLDER"] / ".trl-nca.lock").mkdir(parents=True)
    # the options the row sets (itself, or in its config file) are left off the command line, where they would win
    dropped = {option for option in ("--dataset_name", "--output_dir") if option in extra}
    dropped |= {
        f"--{line.split(':')[0]}" for name in extra if name in CONFIGS for line in CONFIGS[name][1].splitlines()
    }
    extra = [str(files.get(value, value)).format(tmp=tmp_path) for value in extra]
    argv = train_argv(tiny_dir, data, tmp_path / "out")
    for option in dropped & set(argv):
        argv = argv[: argv.index(option)] + argv[argv.index(option) + 2 :]
    capsys.readouterr()
    line = one_line([*argv, *extra], capsys)
    assert line.startswith("trl-nca train: error: ") and expected.format(tmp=tmp_path) in line, line
    assert not (tmp_path / "out").exists()


def test_a_config_value_of_the_wrong_type_is_one_line_without_the_usage(tiny_dir, tmp_path, capsys):
    """argparse prints its usage (some 190 lines of options) before its error; the command prints the one line."""
    data, config = tmp_path / "data.jsonl", tmp_path / "word.yaml"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    config.write_text('max_steps: "ten"\n')
    argv = train_argv(tiny_dir, data, tmp_path / "out")
    argv = argv[: argv.index("--max_steps")] + argv[argv.index("--max_steps") + 2 :]
    assert cli_main([*argv, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "invalid int value: 'ten'" in err, err


# Settings that can never act but leave a valid run (issue 50 item 6): one warning line each, naming the field and the
# fix, before any model loads; the run then trains as given. (case, options, the expected line)
NEVER_ACTING = [
    (
        "adaptive fields under the constant anchor",
        ["--nca_beta_schedule", "constant", "--nca_adaptive_target", "2"],
        "nca_adaptive_target=2.0 is set but nca_beta_schedule='constant' does not read it. Remove it, or set "
        "nca_beta_schedule='adaptive' or nca_beta_schedule='gated' to use it.",
    ),
    (
        "warmup fields under the default (gated) anchor",
        ["--nca_warmup_steps", "5"],
        "nca_warmup_steps=5 is set but "
        "nca_beta_schedule='gated' does not read it. Remove it, or set nca_beta_schedule='warmup' to use it.",
    ),
    (
        "schedule fields under plain OPD",
        ["--nca_beta", "0", "--nca_adaptive_min", "0.1"],
        "nca_adaptive_min=0.1 is "
        "set but nca_beta=0 (plain OPD) schedules no anchor. Remove it, or set nca_beta > 0 and "
        "nca_beta_schedule='adaptive' or nca_beta_schedule='gated' to use it.",
    ),
    (
        "a warmup longer than the run",
        ["--nca_beta_schedule", "warmup", "--nca_warmup_steps", "1000", "--max_steps", "1"],
        "nca_warmup_steps=1000 is not shorter than the run (max_steps=1): the anchor never reaches nca_beta=0.5, "
        "its last step weighs it at 0. Set nca_warmup_steps below max_steps, or nca_beta_schedule='constant'.",
    ),
    (
        "a gate target out of reach in practice",
        ["--nca_adaptive_target", "1e50"],
        "nca_adaptive_target=1e+50 is out of reach in practice: the anchor grows only at a step whose view_kl exceeds "
        "nca_adaptive_target x opd_loss, which even at the smallest positive float32 opd_loss (1.4e-45) is 1.4e+05 "
        "nats per token, and a view_kl is at most the spread of the logits plus log(vocabulary size), some hundreds "
        "for a trained model; so the gate most likely never opens (it can only at a step whose opd_loss is exactly "
        "0). Set a target near 1 (default 1.1), or nca_beta=0 for plain OPD (with nca_monitor=True to still log "
        "view_kl).",
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


# (case, the options changed on resume, the line it prints, the step the resumed run ends at): the run's length may
# change, as in Trainer; every other change is refused (RESUME_CASES). The run's 'linear' schedule ended at a rate of 0
# at step 2: the resumed steps follow the schedule laid out over the new length, the first one included.
LENGTH_CASES = [
    (
        "a longer max_steps",
        ["--max_steps", "4"],
        "Resuming with a new length (max_steps 2 -> 4): the 'linear' learning-rate schedule is laid out again over the "
        "new length, and the resumed steps follow it from the checkpoint's step on (the rate the checkpoint's "
        "optimizer held, where the old schedule ended, is not used).",
        4,
    ),
    (
        "epochs instead of max_steps",
        ["--max_steps", "-1", "--num_train_epochs", "3"],
        "Resuming with a new length "
        "(max_steps 2 -> -1): the 'linear' learning-rate schedule is laid out again over the new length,",
        6,
    ),
]


@pytest.mark.parametrize("case, change, expected, end", LENGTH_CASES, ids=[c[0] for c in LENGTH_CASES])
def test_a_resume_may_change_the_runs_length(finished_run, run_copy, tiny_dir, caplog, case, change, expected, end):
    from safetensors.torch import load_file

    _, out = run_copy  # the run's own data file: the copy's would be another dataset
    argv = train_argv(tiny_dir, finished_run / "data.jsonl", out, "--resume_from_checkpoint", "true", *change)
    argv[argv.index("--save_steps") + 1] = "1"
    assert cli_main(argv) == 0
    assert sum(expected in record.getMessage() for record in caplog.records) == 1, caplog.text
    state = json.loads((out / f"checkpoint-{end}" / "trainer_state.json").read_text())
    assert state["global_step"] == end and (out / "checkpoint-2" / "optimizer.pt").is_file()  # trained on from step 2
    before, after = (load_file(out / f"checkpoint-{step}" / "model.safetensors") for step in (2, 3))
    assert any(not before[name].equal(after[name]) for name in before)  # the first resumed step trained (lr > 0)


# (case, options, the warning line the run prints, or None): settings that train as written, with the line only the
# start of training can give (an epoch-set run's length is known then)
TRAINS_AS_WRITTEN = [
    (
        "one target module (TRL makes a list of one its string, a pattern to PEFT)",
        ["--use_peft", "true", "--lora_r", "2", "--lora_target_modules", "q_proj"],
        None,
    ),
    (
        "an anchor warm-up longer than an epoch-set run",
        ["--max_steps", "-1", "--num_train_epochs", "1", "--nca_beta_schedule", "warmup", "--nca_warmup_steps", "100"],
        "nca_warmup_steps=100 is not shorter than the run (2 optimizer steps: num_train_epochs=1): the anchor never "
        "reaches nca_beta=0.5, its last step weighs it at 0.005. Set nca_warmup_steps below the run's 2 steps, or "
        "nca_beta_schedule='constant'.",
    ),
]


@pytest.mark.parametrize("case, extra, expected", TRAINS_AS_WRITTEN, ids=[c[0] for c in TRAINS_AS_WRITTEN])
def test_settings_train_as_written_and_say_what_only_the_run_knows(tiny_dir, tmp_path, caplog, case, extra, expected):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    argv = train_argv(tiny_dir, data, tmp_path / "out", "--save_strategy", "no")
    for option, value in zip(extra[::2], extra[1::2]):
        if option in argv:
            argv[argv.index(option) + 1] = value
        else:
            argv += [option, value]
    with caplog.at_level(logging.WARNING):
        assert cli_main(argv) == 0
    assert (
        tmp_path / "out" / ("adapter_model.safetensors" if "--use_peft" in extra else "model.safetensors")
    ).is_file()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert expected is None or [line for line in lines if expected in line] == [expected], lines


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
