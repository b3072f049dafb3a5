"""The example scripts and the `trl-nca train` CLI run end to end on local data and local models, in this process;
every script a launcher starts (examples/, tests/scripts/) ends its process group."""

import ast
import importlib
import json
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
CPU = ["--bf16", "false", "--use_cpu", "true", "--report_to", "none"]
# bfloat16 weights with eager attention: torch's CPU flash attention for bfloat16 raises ("pack_vnni2 is only supported
# when avx512 is supported") on an AVX-512 CPU whose kernels are forced onto avx2 or default (ATEN_CPU_CAPABILITY)
BF16_EAGER = '{"dtype": "bfloat16", "attn_implementation": "eager"}'


def _example(name: str):
    """`examples/<name>.py` as a module: its `main(argv)` runs the script in this process (tests/project/test_launches.py
    launches them as scripts, under accelerate)."""
    sys.path.insert(0, str(ROOT / "examples"))
    return importlib.import_module(name)


def block_matplotlib(monkeypatch):
    """Make matplotlib unimportable in this process, as on a machine without it (`pip install trl-nca` alone)."""
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)  # `import matplotlib...` now raises ImportError


def check_figures(folder: Path, matplotlib: str, caplog) -> None:
    """The paired report's figures exist with matplotlib; without it they are skipped and one line says so."""
    pngs = sorted(p.name for p in folder.glob("*.png"))
    skipped = [r for r in caplog.records if "Figures skipped" in r.getMessage()]
    if matplotlib == "installed":  # lengths.png unless every model's lengths are equal (the report says so then)
        same = "`lengths.png` is not drawn" in (folder / "report.md").read_text()
        assert pngs == ["accuracy.png", "harm_help.png", *([] if same else ["lengths.png"])] and not skipped
    else:
        assert pngs == [] and len(skipped) == 1
        assert "matplotlib is not installed" in skipped[0].getMessage() and str(folder) in skipped[0].getMessage()


@pytest.mark.parametrize("matplotlib", ["installed", "missing"])
def test_medmcqa_example_trains_and_reports(tiny_dir, tmp_path, monkeypatch, caplog, matplotlib):
    subjects = ["Medicine", "Anatomy", "Pharmacology", "Dental"]
    rows = [
        {
            "id": f"m{i}",
            "question": f"Case {i}?",
            "opa": "a",
            "opb": "b",
            "opc": "c",
            "opd": "d",
            "cop": i % 4,
            "choice_type": "single",
            "exp": "",
            "subject_name": subjects[i % 4],
            "topic_name": "t",
        }
        for i in range(8)
    ]
    data = tmp_path / "medmcqa.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "out"
    args = [
        "--model_name_or_path",
        tiny_dir,
        "--dataset_path",
        str(data),
        "--max_steps",
        "1",
        "--per_device_train_batch_size",
        "2",
        "--max_new_tokens",
        "4",
        "--eval_limit",
        "2",
        "--eval_max_new_tokens",
        "4",
        "--output_dir",
        str(out),
        *CPU,
        "--model_init_kwargs",
        BF16_EAGER,
    ]
    monkeypatch.chdir(tmp_path)
    if matplotlib == "missing":
        block_matplotlib(monkeypatch)
    _example("medmcqa").main(args)
    check_figures(out / "paired_eval", matplotlib, caplog)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"  # the user's init kwargs were kept
    summary = json.loads((out / "paired_eval" / "summary.json").read_text())
    assert {m["name"] for m in summary["models"]} == {"base", "student"}
    for name in ("base", "student"):
        lines = (out / "paired_eval" / name / "records.jsonl").read_text().splitlines()
        assert len(lines) == 2  # the two Anatomy/Dental test items, both views each


@pytest.mark.parametrize("matplotlib", ["installed", "missing"])
def test_cli_train_with_yaml_config(tiny_dir, tmp_path, monkeypatch, caplog, matplotlib):
    from trl_nca.cli import main

    config = tmp_path / "run.yaml"
    config.write_text(
        f"model_name_or_path: {tiny_dir}\ndataset_name: quickstart\nmax_train_samples: 4\nmax_steps: 1\n"
        f"per_device_train_batch_size: 2\nmax_new_tokens: 4\nnca_beta: 0.5\noutput_dir: {tmp_path / 'out'}\n"
        "save_strategy: 'no'\nuse_peft: true\nlora_target_modules: [q_proj, v_proj]\npaired_eval: true\n"
        "paired_eval_limit: 2\npaired_eval_max_new_tokens: 4\n"
    )
    monkeypatch.chdir(tmp_path)
    if matplotlib == "missing":
        block_matplotlib(monkeypatch)
    assert main(["train", "--config", str(config), *CPU]) == 0
    check_figures(tmp_path / "out" / "paired_eval", matplotlib, caplog)
    assert (tmp_path / "out" / "adapter_model.safetensors").exists()
    card = (tmp_path / "out" / "README.md").read_text()
    assert "trl-nca" in card
    assert "When Context Returns: Toward Robust Internalization in On-Policy Distillation" in card  # the paper
    assert "2606.11627" in card and "@article{wang2026when" in card
    summary = json.loads((tmp_path / "out" / "paired_eval" / "summary.json").read_text())
    assert [m["name"] for m in summary["models"]] == ["base", "student"]


@pytest.mark.slow
def test_two_steps_on_the_embedded_model(tmp_path):
    """The real SmolLM2-135M-Instruct: LoRA self-distillation, 2 steps, finite losses, adapter moved."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig

    from trl_nca import NCAConfig, NCATrainer
    from trl_nca.cli import read_context
    from trl_nca.models.names import embedded_model_path

    path = embedded_model_path()
    ds = Dataset.from_dict({"prompt": ["Which organ produces insulin? (A) Liver (B) Pancreas"] * 4})
    args = NCAConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=2,
        max_new_tokens=8,
        bf16=False,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        learning_rate=1e-3,
        context_text=read_context("medical"),
        gradient_checkpointing=True,
    )
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    trainer = NCATrainer(model=path, args=args, train_dataset=ds, peft_config=lora)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    trainer.train()
    logs = [h for h in trainer.state.log_history if "opd_loss" in h]
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters() if "lora_B" in n)


def test_frozenlake_example_trains_and_reports(tiny_dir, tmp_path, monkeypatch):
    out = tmp_path / "out"
    args = [
        "--model_name_or_path",
        tiny_dir,
        "--max_steps",
        "1",
        "--per_device_train_batch_size",
        "2",
        "--max_new_tokens",
        "6",
        "--max_length",
        "4096",
        "--eval_seeds",
        "2",
        "--eval_max_new_tokens",
        "6",
        "--output_dir",
        str(out),
        *CPU,
        "--model_init_kwargs",
        BF16_EAGER,
    ]
    monkeypatch.chdir(tmp_path)
    _example("frozenlake").main(args)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"  # the user's init kwargs were kept
    summary = json.loads((out / "paired_eval" / "summary.json").read_text())
    assert {m["name"] for m in summary["models"]} == {"base", "student"}
    for model in summary["models"]:  # the evaluation runner's provenance record and resumable records
        assert model["provenance"]["game"] == "frozenlake" and model["provenance"]["model"]["fingerprint"]
        assert len((out / "paired_eval" / model["name"] / "records.jsonl").read_text().splitlines()) == 2


EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.py"))


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_help_opens_with_what_it_does(name, capsys):
    """`--help` starts with a one-line usage and the script's docstring (what it does and the options that matter),
    before the ~400 options inherited from NCAConfig and ModelConfig."""
    module = _example(name)
    with pytest.raises(SystemExit):
        module.main(["--help"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("usage: ") and lines[0].endswith(" [--config FILE.yaml] [--OPTION VALUE ...]")
    opening = "\n".join(lines[: lines.index("options:")])
    assert module.__doc__.splitlines()[0] in opening and "The options that matter: `--config`" in opening
    assert "--nca_beta" in opening and "--max_steps" in opening and "--output_dir" in opening


@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_read_on_their_own(name):
    """Like TRL's examples/scripts: an example imports no other example and nothing from the command line's module;
    task and dataset builders come from the library (trl_nca.tasks, trl_nca.inputs, ...)."""
    tree = ast.parse((ROOT / "examples" / f"{name}.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not imported & set(EXAMPLES), f"{name}.py imports another example: {sorted(imported & set(EXAMPLES))}"
    assert not any(m == "trl_nca.cli" or m.startswith("trl_nca.cli.") for m in imported), f"{name}.py uses the CLI"
    assert EXAMPLES == ["frozenlake", "medmcqa", "safety", "sokoban"]  # no shared helper module next to them


# Scripts started under a launcher (accelerate launch, torchrun) that are meant to succeed; rank_failure.py is not: one
# of its processes raises on purpose, and the others must be stopped by the launcher, not meet at a barrier.
LAUNCHED = sorted([*(ROOT / "examples").glob("*.py"), *(ROOT / "tests" / "scripts").glob("*.py")])
FAILS_ON_PURPOSE = {"rank_failure.py"}


@pytest.mark.parametrize("path", [p for p in LAUNCHED if p.name not in FAILS_ON_PURPOSE], ids=lambda p: p.name)
def test_launched_scripts_end_their_process_group(path):
    """A process that exits with its gloo group still up can abort in teardown (`terminate called without an active
    exception`, SIGABRT) after a good run, and the launch fails (CI, tests/trainers/test_distributed.py): every script
    a launcher starts calls `end_process_group()` last, in its `__main__` block (trl_nca.core.launch)."""
    tree = ast.parse(path.read_text())
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    last = block.body[-1]
    assert isinstance(last, ast.Expr) and ast.unparse(last.value) == "end_process_group()", (
        f"{path.name}: its `if __name__ == '__main__':` block must end with `end_process_group()`"
    )


@pytest.mark.parametrize("name", ["quickstart", "medmcqa", "safety", "sokoban", "frozenlake"])
def test_example_configs_parse(name):
    """Every shipped YAML parses into the dataclasses of the script that uses it (catches renamed fields)."""
    from trl import ModelConfig, TrlParser

    from trl_nca import NCAConfig

    if name == "quickstart":
        from trl_nca.cli import TrainScriptArguments as Script
    else:
        Script = _example(name).ScriptArguments
    parser = TrlParser((Script, NCAConfig, ModelConfig))
    config = str(ROOT / "examples" / "configs" / f"{name}.yaml")
    _, args, _ = parser.parse_args_and_config(args=["--config", config, "--bf16", "false", "--use_cpu", "true"])
    assert args.nca_beta == 0.5


def test_examples_merge_model_init_kwargs_with_model_config():
    """The examples keep the user's `model_init_kwargs` and add ModelConfig's fields; a real conflict is an error."""
    from trl import ModelConfig, TrlParser

    from trl_nca import NCAConfig
    from trl_nca.trainers.script_options import student_init_kwargs

    parser = TrlParser((_example("medmcqa").ScriptArguments, NCAConfig, ModelConfig))
    base = ["--output_dir", "x", "--bf16", "false", "--use_cpu", "true"]
    user = ["--model_init_kwargs", '{"attn_implementation": "eager", "low_cpu_mem_usage": true, "dtype": "float16"}']
    _, args, model = parser.parse_args_and_config(args=base + user + ["--model_revision", "v2"])
    assert student_init_kwargs(args, model) == {
        "attn_implementation": "eager",
        "low_cpu_mem_usage": True,
        "dtype": "float16",
        "revision": "v2",
    }
    _, args, model = parser.parse_args_and_config(args=base + ["--dtype", "bfloat16"])
    assert student_init_kwargs(args, model) == {"dtype": "bfloat16", "revision": "main", "attn_implementation": None}
    _, args, model = parser.parse_args_and_config(args=base + user + ["--dtype", "bfloat16"])
    with pytest.raises(ValueError, match=r"`dtype: bfloat16` and `model_init_kwargs: \{dtype: float16\}` disagree"):
        student_init_kwargs(args, model)


# The paper's 12 settings (../shared/REFERENCE.md section 1), written out here independently of the shipped files.
QA_SETTINGS = {
    "llama3.1-8b": ("meta-llama/Llama-3.1-8B-Instruct", None),
    "llama3.2-3b": ("meta-llama/Llama-3.2-3B-Instruct", None),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", None),
    "qwen2.5-7b-to-3b": ("Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-7B-Instruct"),
}
GAME_SETTINGS = {
    "sokoban-qwen3-4b": ("Qwen/Qwen3-4B-Instruct-2507", None),
    "sokoban-qwen3-4b-to-1.7b": ("Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B-Instruct-2507"),
    "frozenlake-qwen3-1.7b": ("Qwen/Qwen3-1.7B", None),
    "frozenlake-qwen3-4b-to-1.7b": ("Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B"),
}
REFERENCE_SETTINGS = {
    **{f"{task}-{name}": (task, *models) for task in ("medmcqa", "safety") for name, models in QA_SETTINGS.items()},
    **{name: (name.split("-")[0], *models) for name, models in GAME_SETTINGS.items()},
}
REFERENCE_CONFIGS = [f"{setting}-{variant}" for setting in REFERENCE_SETTINGS for variant in ("opd", "nca")]


def test_reference_configs_are_exactly_the_24_runs():
    shipped = sorted(p.stem for p in (ROOT / "examples" / "configs" / "reference").glob("*.yaml"))
    assert shipped == sorted(REFERENCE_CONFIGS)


@pytest.mark.parametrize("name", REFERENCE_CONFIGS)
def test_reference_config_carries_the_reference_hyperparameters(name):
    """OPD and NCA variants of each setting, parsed by the example script's own parser."""
    from trl import ModelConfig, TrlParser

    from trl_nca import NCAConfig

    setting, variant = name.rsplit("-", 1)
    task, student, teacher = REFERENCE_SETTINGS[setting]
    game = task in ("sokoban", "frozenlake")
    parser = TrlParser((_example(task).ScriptArguments, NCAConfig, ModelConfig))
    config = str(ROOT / "examples" / "configs" / "reference" / f"{name}.yaml")
    script, args, model = parser.parse_args_and_config(
        args=["--config", config, "--bf16", "false", "--use_cpu", "true"]
    )
    assert (ROOT / "examples" / f"{task}.py").exists()
    assert model.model_name_or_path == student and args.teacher_model_name_or_path == teacher
    assert not model.use_peft
    assert args.nca_beta == (0.5 if variant == "nca" else 0.0)
    assert (args.beta, args.lmbda, args.seq_kd) == (1.0, 1.0, False)  # on-policy reverse KL
    assert args.max_steps == 50
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == (64 if game else 128)
    assert args.learning_rate == 5e-6 and args.lr_scheduler_type == "constant" and args.warmup_steps == 0
    assert args.optim == "adamw_torch" and (args.adam_beta1, args.adam_beta2) == (0.9, 0.999)
    assert args.weight_decay == 0.01 and args.max_grad_norm == 1.0
    assert args.max_new_tokens == (1024 if game else 512)
    assert args.temperature == (0.7 if game else 1.0)
    assert args.divergence_support == "top_k" and args.top_k == 256
    assert args.top_k_renormalize == (setting == "safety-llama3.1-8b")
    if game:
        assert script.eval_seeds == 128 and script.eval_max_new_tokens == 1024
    else:
        assert args.context_placement == "system"
        assert args.save_strategy == "steps" and args.save_steps == 2
        assert script.eval_limit == 500 and script.eval_max_new_tokens == 512
    if teacher is not None:
        assert args.teacher_model_init_kwargs == {"dtype": "bfloat16"}
