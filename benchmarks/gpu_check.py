"""The GPU check: one call on a bare GPU machine (`bash benchmarks/gpu_check.sh`), in parts, each its own process
with its own timeout (`PARTS`; killed at it, and the next part runs). The JSON (`--out`) is rewritten as each part
ends, and a step part rewrites its own file after every step, so a run killed at any point keeps what finished.

1. `environment`: every import trl-nca needs, every requirement of the installed distributions that is not met, the
   device, and the accelerator DeepSpeed detects (it travels as a pure-Python wheel).
2. `opd`, `nca`, `nca-zero3`: one NCATrainer step at the shape of Qwen3-8B (random weights from the published
   config.json, bf16) at real lengths: batch 4, each row a prompt of at least 1536 tokens, a system context of at
   least 1024 and a completion of 1024 fixed random tokens (the trainer's sampling replaced, so OPD and NCA train on
   the same tokens and the time is the training step's alone); `nca_beta` 0 (OPD) and 0.5 (constant anchor), and NCA
   under ZeRO-3 at world size 1 (`accelerate launch --config_file examples/accelerate/zero3.yaml --num_processes 1`).
   LoRA r 16 on q/k/v/o, the teacher is the student with its adapter disabled, gradient checkpointing on (TRL's
   default; the trainer settles the reentrant choice and records it). A fresh process and model per part, one
   untimed step, then 2 timed (median wall time, CUDA-synchronised); peak memory is the CUDA allocator's maximum over
   the timed steps above what was allocated before the model was built.
3. `nca-sampled`: one sampled NCA step of 256 tokens per row (`min_new_tokens = max_new_tokens`), the sampling timed
   inside the step (the trainer's own `generate` call), after one untimed sampled step.
4. `launch`: `examples/medmcqa.py` launched as users launch it (zero3.yaml, one process, LoRA) on the tiny model of
   `trl_nca.testing`: 2 steps saving a checkpoint after each, a resume to step 3, the paired evaluation.

Every figure in the JSON sits under a `measured` key beside the `measured_on` it was measured on (device name,
dtype, versions); settings sit under `settings`, timeouts under `budget` and `timeout_s`; nothing is estimated.

`--dry-run` runs the same parts on the CPU with tiny models (the sizes of `trl_nca.testing`'s tiny model, in the same
architecture), fp32, a few tokens: it checks that the script works before a GPU is lent and claims nothing about
GPU time or memory. Without a GPU the script refuses to run anything but `--dry-run`.

`--plan-wheels DIR` (used by `benchmarks/download_wheels.sh`) checks the wheels in DIR against what the GPU machine
is known to have installed (`GPU_MACHINE`): every requirement of every wheel must be met by another wheel or by the
machine.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path


os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parents[1]

# The published architecture (Qwen/Qwen3-8B, config.json), random weights.
SHAPES = {
    "qwen3-8b": dict(
        model_type="qwen3",
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
}

# The lent GPU machine, as reported for it (CPython 3.12.3, x86-64 Linux, no network). None: present, version not
# reported. MACHINE_DEPENDENCIES: installed there because the packages above require them (transformers: pyyaml,
# regex, typer, tqdm, packaging; huggingface-hub: filelock, httpx, click, hf-xet, typing-extensions; accelerate: psutil;
# torch: jinja2, sympy, networkx, setuptools; pandas: python-dateutil, tzdata); their versions are not checked here.
GPU_MACHINE = {
    "torch": "2.11.0",
    "transformers": "5.17.0",
    "accelerate": "1.15.0",
    "peft": None,
    "pyarrow": None,
    "pandas": None,
    "xxhash": None,
    "fsspec": None,
    "huggingface-hub": "1.33.0",
    "tokenizers": "0.23.0",
    "safetensors": "0.8.0",
    "numpy": "2.5.0",
}
MACHINE_DEPENDENCIES = (
    "pyyaml",
    "regex",
    "typer",
    "tqdm",
    "packaging",
    "filelock",
    "httpx",
    "click",
    "hf-xet",
    "typing-extensions",
    "psutil",
    "jinja2",
    "sympy",
    "networkx",
    "setuptools",
    "python-dateutil",
    "tzdata",
)
MACHINE_PYTHON = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "platform_machine": "x86_64",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}
# Imports the check needs; deepspeed is optional (ZeRO launches), reported either way.
REQUIRED_IMPORTS = (
    "torch",
    "transformers",
    "accelerate",
    "peft",
    "datasets",
    "trl",
    "trl.experimental.gkd",
    "trl_nca",
    "trl_nca.trainers.nca_trainer",
    "trl_nca.eval.compare",
)
DEEPSPEED_ABSENT = (
    "deepspeed is not installed: benchmarks/download_wheels.sh builds it as a pure-Python wheel "
    "(`DS_BUILD_OPS=0 pip wheel --no-deps deepspeed==0.19.8`: no op compiled; ZeRO-2/3 with the Trainer's torch "
    "optimizer compiles none) and carries it with its dependencies; without it the launch falls back to "
    "examples/accelerate/ddp.yaml and ZeRO is not checked."
)

TARGETS = {"fits_gib": 80.0, "memory_ratio": 1.15, "time_ratio": 1.3}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
QUESTION_WORDS = (
    "A patient presents with fatigue, weight loss and increased thirst over several weeks. Laboratory results show "
    "raised fasting glucose and ketones in the urine. Which organ produces the hormone whose lack explains this? "
)
CONTEXT_WORDS = (
    "Read the question and every option before you decide. Recall the relevant facts, rule out the options that "
    "contradict them and prefer the most specific correct option. Keep your reasoning short and factual. "
)
LAUNCH_CONFIG = "examples/accelerate/zero3.yaml"  # the README's launch; ddp.yaml where deepspeed is missing
FALLBACK_LAUNCH_CONFIG = "examples/accelerate/ddp.yaml"


# ---------------------------------------------------------------------------------------------------------------------
# Environment: the wheels' plan (where PyPI is reachable) and the imports (on the GPU machine)


def _requirement(text: str):
    from packaging.requirements import Requirement

    return Requirement(text)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_metadata(path: Path) -> dict:
    """Name, version, Requires-Python and the unconditional-or-true-on-the-machine requirements of one wheel."""
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        text = archive.read(name).decode("utf-8")
    headers = text.split("\n\n", 1)[0].splitlines()
    fields = {"Requires-Dist": []}
    for line in headers:
        key, _, value = line.partition(": ")
        if key == "Requires-Dist":
            fields[key].append(value.strip())
        elif key in ("Name", "Version", "Requires-Python"):
            fields[key] = value.strip()
    return {
        "name": _canonical(fields["Name"]),
        "version": fields["Version"],
        "file": path.name,
        "requires_python": fields.get("Requires-Python"),
        "requires": fields["Requires-Dist"],
    }


def plan_wheels(wheel_dir: Path, machine: dict = GPU_MACHINE, dependencies=MACHINE_DEPENDENCIES) -> list[str]:
    """Check the wheels in `wheel_dir` against the GPU machine: each must install on CPython 3.12 x86-64 Linux, and
    every requirement of each must be met by another wheel or by the machine. Prints one line per wheel and returns
    the problems (an empty list when the plan holds)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    wheels = {}
    for path in sorted(Path(wheel_dir).glob("*.whl")):
        meta = wheel_metadata(path)
        wheels[meta["name"]] = meta
    problems = []
    if not wheels:
        return [f"no wheels in {wheel_dir}"]
    machine = {_canonical(k): v for k, v in machine.items()}
    dependencies = {_canonical(d) for d in dependencies}
    for meta in wheels.values():
        tags = meta["file"][: -len(".whl")].split("-")[-3:]  # python tag, abi tag, platform tag
        python_ok = any(t in ("py3", "py312", "cp312") for t in tags[0].split("."))
        platform_ok = tags[2] == "any" or ("x86_64" in tags[2] and "linux" in tags[2])
        if not (python_ok and platform_ok):
            problems.append(f"{meta['file']}: not installable on CPython 3.12 x86-64 Linux (tags {'-'.join(tags)})")
        if meta["requires_python"] and Version(MACHINE_PYTHON["python_full_version"]) not in SpecifierSet(
            meta["requires_python"]
        ):
            problems.append(f"{meta['file']}: requires Python {meta['requires_python']}, the machine has 3.12.3")
        notes = []
        for text in meta["requires"]:
            req = _requirement(text)
            if req.marker is not None and not req.marker.evaluate(MACHINE_PYTHON):
                continue  # an extra, or another platform
            name = _canonical(req.name)
            if name in wheels:
                if not req.specifier.contains(wheels[name]["version"], prereleases=True):
                    problems.append(f"{meta['file']} requires {req}, the wheel is {wheels[name]['version']}")
            elif name in machine:
                have = machine[name]
                if have is None:
                    if str(req.specifier):
                        notes.append(f"{req} (present there, version not reported)")
                elif not req.specifier.contains(have, prereleases=True):
                    problems.append(f"{meta['file']} requires {req}, the machine has {have}: fetch a wheel of it")
            elif name not in dependencies:
                problems.append(f"{meta['file']} requires {req}, which neither the machine nor a wheel provides")
        if meta["name"] in machine:
            notes.append(f"replaces the machine's {meta['name']} {machine[meta['name']] or ''}".rstrip())
        print(f"  {meta['file']}: ok" + (f"; unchecked: {'; '.join(notes)}" if notes else ""))
    # trl-nca itself, from its pyproject, against the machine and the wheels
    for text in _project_dependencies():
        req = _requirement(text)
        name = _canonical(req.name)
        have = wheels[name]["version"] if name in wheels else machine.get(name, "absent")
        if have == "absent" and name not in dependencies:
            problems.append(f"trl-nca requires {req}, which neither the machine nor a wheel provides")
        elif have is None and str(req.specifier):
            print(f"  trl-nca: unchecked: {req} (present there, version not reported)")
        elif have not in (None, "absent") and not req.specifier.contains(have, prereleases=True):
            problems.append(f"trl-nca requires {req}, the machine has {have}: fetch a wheel of it")
    return problems


def carried_packages(script: Path = ROOT / "benchmarks" / "download_wheels.sh") -> list[str]:
    """The packages download_wheels.sh fetches or builds (its PACKAGES and DEEPSPEED), as canonical names."""
    text = script.read_text()
    listed = re.search(r"^PACKAGES=\((.*?)\)", text, re.S | re.M).group(1).split()
    listed += re.findall(r"^DEEPSPEED=(\S+)", text, re.M)
    return [_canonical(re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0]) for spec in listed]


def missing_wheels(wheel_dir: Path) -> list[str]:
    """Packages download_wheels.sh carries that have no wheel in `wheel_dir` (none when the folder holds no wheel at
    all: then nothing was carried and the installed packages are used)."""
    files = list(Path(wheel_dir).glob("*.whl"))
    if not files:
        return []
    present = {_canonical(f.name.split("-")[0]) for f in files}
    return [name for name in carried_packages() if name not in present]


def _project_dependencies() -> list[str]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def unmet_requirements(roots: list[str]) -> list[str]:
    """Walk the installed distributions from `roots` (requirement strings) through their Requires-Dist (markers
    evaluated here, extras left out) and list every requirement that is missing or at the wrong version."""
    problems, seen, queue = [], set(), [(text, "trl-nca") for text in roots]
    while queue:
        text, parent = queue.pop()
        req = _requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = _canonical(req.name)
        try:
            dist = importlib.metadata.distribution(req.name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{req.name}: not installed ({parent} requires {req})")
            continue
        if not req.specifier.contains(dist.version, prereleases=True):
            problems.append(f"{req.name} {dist.version} installed, {parent} requires {req}")
        if name not in seen:
            seen.add(name)
            queue += [(t, f"{req.name} {dist.version}") for t in dist.requires or []]
    return sorted(set(problems))


def environment(wheel_dir: Path | None) -> dict:
    """Imports, versions and unmet requirements here; and why deepspeed is missing, if it is."""
    imports = {}
    for module in REQUIRED_IMPORTS:
        try:
            importlib.import_module(module)
            imports[module] = "ok"
        except Exception as error:  # any import error is reported, none is fatal here
            imports[module] = f"{type(error).__name__}: {error}"
    not_fetched = None
    if wheel_dir is not None and (Path(wheel_dir) / "NOT_FETCHED.txt").exists():
        not_fetched = (Path(wheel_dir) / "NOT_FETCHED.txt").read_text().strip()
    accelerator = None
    if importlib.util.find_spec("deepspeed") is None:
        deepspeed = DEEPSPEED_ABSENT + (f" (download_wheels.sh: {not_fetched})" if not_fetched else "")
    else:
        try:
            importlib.import_module("deepspeed")
            from deepspeed.accelerator import get_accelerator

            accelerator = get_accelerator().device_name()  # detected at run time: "cuda" on the GPU, "cpu" here
            deepspeed = f"installed: {importlib.metadata.version('deepspeed')}, accelerator {accelerator}"
        except Exception as error:
            deepspeed = f"installed but not importable: {type(error).__name__}: {error}"
    return {
        "imports": imports,
        "missing": [m for m, v in imports.items() if v != "ok"],
        "deepspeed": deepspeed,
        "deepspeed_accelerator": accelerator,
        "unmet_requirements": unmet_requirements(_project_dependencies()),
        "versions": versions(),
        "vllm": "installed, not used (NCATrainer samples with generate)"
        if importlib.util.find_spec("vllm")
        else "not installed",
    }


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "deepspeed", "vllm"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def print_environment(env: dict) -> None:
    print("gpu_check: versions " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()), flush=True)
    for module, status in env["imports"].items():
        print(f"gpu_check: import {module}: {status}", flush=True)
    for problem in env["unmet_requirements"]:
        print(f"gpu_check: requirement not met: {problem}", flush=True)
    print(f"gpu_check: deepspeed: {env['deepspeed']}", flush=True)
    if env["missing"]:
        print(f"gpu_check: MISSING: {', '.join(env['missing'])}: nothing else can run", flush=True)


# ---------------------------------------------------------------------------------------------------------------------
# The DDP launch of examples/medmcqa.py


def medmcqa_rows(n: int) -> list[dict]:
    """MedMCQA-format rows, alternating between the example's training and test subjects."""
    from trl_nca.tasks import MEDMCQA_TEST_SUBJECTS, MEDMCQA_TRAIN_SUBJECTS

    subjects = [s for pair in zip(MEDMCQA_TRAIN_SUBJECTS, MEDMCQA_TEST_SUBJECTS) for s in pair]
    return [
        {
            "id": f"m{i}",
            "question": f"Case {i}: which organ produces insulin?",
            "opa": "Liver",
            "opb": "Spleen",
            "opc": "Pancreas",
            "opd": "Kidney",
            "cop": 2,
            "choice_type": "single",
            "exp": "",
            "subject_name": subjects[i % len(subjects)],
            "topic_name": "t",
        }
        for i in range(n)
    ]


def launch_model(work: Path) -> str:
    """The launched student: the tiny model of `trl_nca.testing`, on the GPU too. The launch checks that the user's
    command runs to the end there (ZeRO-3, save, resume, paired evaluation); the 8B-shaped parts measure scale, and
    a larger model here would spend the call's minutes on loading it twice."""
    from trl_nca.testing import save_tiny_model

    return save_tiny_model(work / "tiny", seed=0)


def _launch(command: list[str], timeout_s: float) -> tuple[object, str, float]:
    started = time.perf_counter()
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        rc, log = result.returncode, result.stdout + result.stderr
    except subprocess.TimeoutExpired as error:
        rc, log = "timeout", f"timed out after {timeout_s:.0f} s\n" + str(error.stdout or "") + str(error.stderr or "")
    return rc, log, time.perf_counter() - started


def launch_medmcqa(work: Path, dry_run: bool, timeout_s: float, config: str = LAUNCH_CONFIG) -> dict:
    """`accelerate launch --config_file examples/accelerate/zero3.yaml --num_processes 1 examples/medmcqa.py` (the
    README's launch; `ddp.yaml` where deepspeed is missing) with LoRA on 64 local rows, twice: 2 steps that save a
    checkpoint after each, then `--resume_from_checkpoint true` to step 3, each ending with the paired evaluation of
    base and student. The launcher's torchrun sets LOCAL_RANK; on a CPU (dry run) DeepSpeed gets `ddp_backend gloo`."""
    model = launch_model(work)
    data = work / "medmcqa.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in medmcqa_rows(64)) + "\n")
    out = work / "medmcqa-out"
    eval_limit = 8
    launcher = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        config,
        "--num_processes",
        "1",
        "--main_process_port",
        str(_free_port()),
    ]
    script = [
        "examples/medmcqa.py",
        "--model_name_or_path",
        model,
        "--dataset_path",
        str(data),
        "--per_device_train_batch_size",
        "2",
        "--max_new_tokens",
        "8",
        "--train_limit",
        "16",
        "--eval_limit",
        str(eval_limit),
        "--eval_max_new_tokens",
        "8",
        "--eval_batch_size",
        "8",
        "--output_dir",
        str(out),
        "--report_to",
        "none",
        "--save_strategy",
        "steps",
        "--save_steps",
        "1",
        "--use_peft",
        "true",
        "--lora_r",
        "16",
        "--lora_alpha",
        "32",
        "--lora_target_modules",
        *LORA_TARGETS,
    ]
    if dry_run:
        launcher += ["--mixed_precision", "no"]
        script += ["--use_cpu", "true", "--bf16", "false"]
        if "zero" in config:
            script += ["--ddp_backend", "gloo"]
    stages = [("train", ["--max_steps", "2"]), ("resume", ["--max_steps", "3", "--resume_from_checkpoint", "true"])]
    problems, records, seconds, logs, commands = [], {}, 0.0, [], []
    for stage, extra in stages:
        command = launcher + script + extra
        commands.append(" ".join(c if c != sys.executable else "python" for c in command))
        rc, log, spent = _launch(command, timeout_s)
        seconds += spent
        logs.append(f"--- {stage} ---\n{log[-3000:]}")
        if rc != 0:
            problems.append(f"{stage}: exit code {rc}")
            break
        if stage == "train" and not (out / "checkpoint-2").is_dir():
            problems.append(f"train: {out / 'checkpoint-2'} was not written")
            break
    else:
        state = out / "checkpoint-3" / "trainer_state.json"
        if not state.exists() or json.loads(state.read_text()).get("global_step") != 3:
            problems.append(f"resume: {state} does not record step 3")
        summary = out / "paired_eval" / "summary.json"
        if not summary.exists():
            problems.append(f"{summary} was not written")
        else:
            names = {m["name"] for m in json.loads(summary.read_text())["models"]}
            if names != {"base", "student"}:
                problems.append(f"summary.json names the models {sorted(names)}, expected base and student")
        for name in ("base", "student"):
            path = out / "paired_eval" / name / "records.jsonl"
            records[name] = len(path.read_text().splitlines()) if path.exists() else 0
            if records[name] != eval_limit:
                problems.append(f"{path}: {records[name]} records, expected {eval_limit}")
    return {
        "command": commands[0],
        "commands": commands,
        "config": config,
        "rc": 0 if not problems else 1,
        "seconds": seconds,
        "records": records,
        "ok": not problems,
        "problems": problems,
        "log_tail": "\n".join(logs)[-6000:],
    }


# ---------------------------------------------------------------------------------------------------------------------
# The step benchmark: one 8B-shaped NCATrainer step per part


@dataclass(frozen=True)
class Workload:
    """What a step part trains on: `batch` rows per step, each a prompt of at least `prompt_tokens` tokens (rendered
    by the chat template) and a system context of at least `context_tokens`; fixed completions of `completion_tokens`
    random tokens, or `sampled_tokens` sampled on-policy (`min_new_tokens = max_new_tokens`, so exactly that many)."""

    batch: int
    prompt_tokens: int
    context_tokens: int
    completion_tokens: int
    sampled_tokens: int
    warmup: int
    steps: int
    sampled_steps: int


# The real lengths (prompt 1.5k, context 1k, completion 1k tokens), and the dry run's few tokens.
GPU_WORKLOAD = Workload(
    batch=4,
    prompt_tokens=1536,
    context_tokens=1024,
    completion_tokens=1024,
    sampled_tokens=256,
    warmup=1,
    steps=2,
    sampled_steps=1,
)
DRY_RUN_WORKLOAD = Workload(
    batch=2,
    prompt_tokens=24,
    context_tokens=16,
    completion_tokens=8,
    sampled_tokens=8,
    warmup=1,
    steps=1,
    sampled_steps=1,
)
STEP_PARTS = {  # part: (nca_beta, ZeRO-3 at world size 1, completions sampled)
    "opd": (0.0, False, False),
    "nca": (0.5, False, False),
    "nca-zero3": (0.5, True, False),
    "nca-sampled": (0.5, False, True),
}


def dry_run_shape(shape: dict, tok) -> dict:
    """`shape`'s architecture at the sizes of trl_nca.testing's tiny model. Its output layer has more rows than the
    tiny tokenizer has tokens, as on the GPU (151936 rows for the same tokenizer), so samples hold ids past it there
    too."""
    from trl_nca.testing import make_tiny_model

    tiny = make_tiny_model(tok, vocab_size=512).config
    sizes = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
    return dict(
        shape,
        **{k: getattr(tiny, k) for k in sizes},
        head_dim=tiny.hidden_size // tiny.num_attention_heads,
        vocab_size=tiny.vocab_size,
    )


def build_config(shape: dict, tok=None):
    from transformers import AutoConfig

    shape = dict(shape)
    if tok is not None:  # the special tokens of the benchmark's tokenizer
        shape.update(pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return AutoConfig.for_model(shape.pop("model_type"), **shape)


def build_model(shape: dict, tok, device: str | None, dtype, seed: int = 0):
    """Random weights. `device=None` under ZeRO-3: transformers builds the model inside DeepSpeed's `zero.Init`,
    which places each partition itself."""
    import torch
    from transformers import AutoModelForCausalLM

    config = build_config(shape, tok)
    torch.manual_seed(seed)
    with torch.device(device) if device is not None else nullcontext():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


def _text_of(tok, words: str, tokens: int, render=lambda text: text) -> str:
    """`words` repeated until `render(text)` is at least `tokens` tokens long."""
    words, text, i = words.split(), "", 0
    while len(tok(render(text))["input_ids"]) < tokens:
        text += " ".join(words[i % len(words)] for i in range(i, i + 8)) + " "
        i += 8
    return text


def build_dataset(tok, rows: int, workload: Workload):
    """Text rows: a question of at least `prompt_tokens` tokens once rendered, and a system context of at least
    `context_tokens`; and the rendered lengths of the first row without and with the context."""
    from datasets import Dataset

    from trl_nca.core.views import ContextSpec
    from trl_nca.trainers.data import Limits, prepare_dataset

    def rendered(text):
        return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)

    context = _text_of(tok, CONTEXT_WORDS, workload.context_tokens)
    body = _text_of(tok, QUESTION_WORDS, workload.prompt_tokens, lambda text: rendered("Question 0: " + text))
    prompts = [f"Question {k}: {body}" for k in range(rows)]
    text = Dataset.from_dict({"prompt": prompts, "context": [context] * rows})
    first = prepare_dataset(text.select([0]), tok, ContextSpec(column="context"), Limits(max_new_tokens=1), "probe")
    return text, (len(first[0]["prompt_ids"]), len(first[0]["context_prompt_ids"]))


class Meter:
    """Step wall times (step end to step end, CUDA-synchronised), the sampling time and tokens inside each step, and
    the allocator's peaks over the timed steps. `report` is called after every step (the part's file is rewritten)."""

    def __init__(self, device: str, warmup: int, report=lambda: None):
        self.device, self.warmup, self.report, self.times, self.last, self.step = device, warmup, report, [], None, 0
        self.sampling, self.new_tokens, self.sampled_tokens = [], [], []
        self.resident = self.peak_allocated = self.peak_reserved = None

    def sync(self):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()

    def peaks(self):
        import torch

        if self.device == "cuda" and self.step > self.warmup:
            self.peak_allocated = torch.cuda.max_memory_allocated() / 2**30
            self.peak_reserved = torch.cuda.max_memory_reserved() / 2**30

    def time_sampling(self, trainer):
        """Wrap the trainer's own sampling call (`NCATrainer._generate`) to time it inside the step."""
        generate, meter = trainer._generate, self

        def timed(*args, **kwargs):
            meter.sync()
            start = time.perf_counter()
            ids, mask = generate(*args, **kwargs)
            meter.sync()
            if meter.step >= meter.warmup:
                meter.sampling.append(time.perf_counter() - start)
                meter.new_tokens.append(int(ids.shape[1]))
                meter.sampled_tokens.append(int(mask.sum()))
            return ids, mask

        trainer._generate = timed

    def callback(self):
        import torch
        from transformers import TrainerCallback

        meter = self

        class _Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                meter.sync()
                meter.last = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                meter.sync()
                now = time.perf_counter()
                meter.step = state.global_step
                if state.global_step > meter.warmup:
                    meter.times.append(now - meter.last)
                if state.global_step == meter.warmup and meter.device == "cuda":
                    meter.resident = torch.cuda.memory_allocated() / 2**30
                    torch.cuda.reset_peak_memory_stats()
                meter.peaks()
                meter.report()
                meter.last = time.perf_counter()

        return _Callback()


def fix_completions(trainer, tokens: int, tok, seed: int = 0):
    """Replace the trainer's sampling by `tokens` fixed random tokens per row (no special token), drawn from one
    seeded generator: every part trains on the same completions, and the step time leaves sampling out."""
    import torch

    from trl_nca.testing import SPECIAL_TOKENS

    generator = torch.Generator().manual_seed(seed)

    def fixed(model, prompts, prompt_mask, teacher=None):
        ids = torch.randint(len(SPECIAL_TOKENS), len(tok), (prompts.shape[0], tokens), generator=generator)
        return ids.to(prompts.device), torch.ones_like(ids, device=prompts.device)

    trainer._generate = fixed


def measured_on(device: str, dtype, dry_run: bool) -> dict:
    """What every figure of a part was measured on."""
    import torch

    if device == "cuda":
        name = torch.cuda.get_device_name()
        memory = torch.cuda.get_device_properties(0).total_memory / 2**30
        device_text = f"{name} ({memory:.0f} GiB, CUDA {torch.version.cuda})"
    else:
        device_text = f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    return {
        "device": device_text,
        "dtype": str(dtype).replace("torch.", ""),
        "versions": versions(),
        "dry_run": dry_run,
        "host": platform.node(),
    }


def run_step_part(part: str, cli, write) -> None:
    """One 8B-shaped part (`STEP_PARTS`): a fresh process, a fresh model, `warmup + steps` NCATrainer steps with LoRA
    r 16 on q/k/v/o, the self-teacher, gradient checkpointing on; `write(document)` after every step."""
    import torch
    from peft import LoraConfig

    from trl_nca import NCAConfig, NCATrainer
    from trl_nca.testing import make_tiny_tokenizer

    beta, zero3, sampled = STEP_PARTS[part]
    device = "cpu" if cli.dry_run else "cuda"
    dtype = torch.float32 if cli.dry_run else torch.bfloat16
    workload = workload_of(cli)
    steps = workload.sampled_steps if sampled else workload.steps
    tok = make_tiny_tokenizer()
    shape = dry_run_shape(SHAPES[MODEL], tok) if cli.dry_run else SHAPES[MODEL]
    data, (prompt_len, context_len) = build_dataset(tok, workload.batch * (workload.warmup + steps), workload)
    tokens = workload.sampled_tokens if sampled else workload.completion_tokens
    document = {
        "status": "running",
        "settings": {
            "model": MODEL + (" architecture at trl_nca.testing's tiny sizes (dry run)" if cli.dry_run else ""),
            "shape": shape,
            "parameters": _parameters(shape),
            "nca_beta": beta,
            "nca_beta_schedule": "constant",
            "completions": "sampled on-policy" if sampled else "fixed random tokens",
            "completion_tokens": tokens,
            "batch": workload.batch,
            "prompt_tokens": prompt_len,
            "context_prompt_tokens": context_len,
            "warmup_steps": workload.warmup,
            "timed_steps": steps,
            "lora": {"r": 16, "alpha": 32, "target_modules": LORA_TARGETS},
            "teacher": "LoRA self-teacher (adapter disabled)",
            "gradient_checkpointing": True,
            "launcher": f"accelerate launch --config_file {LAUNCH_CONFIG} --num_processes 1" if zero3 else "python",
        },
        "measured": {},
        "measured_on": measured_on(device, dtype, cli.dry_run),
    }
    baseline = torch.cuda.memory_allocated() / 2**30 if device == "cuda" else None
    args = NCAConfig(  # before the model: under ZeRO-3 it is what makes transformers build the model partitioned
        output_dir=str(Path(cli.work) / part),
        max_steps=workload.warmup + steps,
        per_device_train_batch_size=workload.batch,
        lmbda=1.0,
        nca_beta=beta,
        nca_beta_schedule="constant",
        bf16=dtype == torch.bfloat16,
        use_cpu=device == "cpu",
        gradient_checkpointing=True,
        learning_rate=1e-5,
        max_new_tokens=tokens,
        max_length=None,
        report_to=[],
        save_strategy="no",
        logging_steps=10_000,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
        **({"ddp_backend": "gloo"} if zero3 and cli.dry_run else {}),
    )
    from transformers.integrations import is_deepspeed_zero3_enabled

    if zero3 != is_deepspeed_zero3_enabled():
        raise RuntimeError(f"{part}: ZeRO-3 expected {zero3}, enabled {is_deepspeed_zero3_enabled()}")
    model = build_model(shape, tok, None if zero3 else device, dtype)
    peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_TARGETS)

    def report():
        document["measured"] = _step_figures(meter, baseline, sampled)
        write(document)

    meter = Meter(device, workload.warmup, report)
    trainer = NCATrainer(
        model=model,
        teacher_model=None,
        args=args,
        train_dataset=data,
        processing_class=tok,
        callbacks=[meter.callback()],
        peft_config=peft_config,
    )
    if zero3:
        state = trainer.accelerator.state
        document["settings"]["zero_stage"] = state.deepspeed_plugin.zero_stage
        document["settings"]["world_size"] = state.num_processes
    document["settings"]["gradient_checkpointing_kwargs"] = trainer.args.gradient_checkpointing_kwargs
    document["settings"]["teacher_type"] = type(trainer.accelerator.unwrap_model(trainer.teacher_model)).__name__
    if sampled:  # every sample exactly `tokens` long: no early end-of-sequence
        trainer.generation_config.min_new_tokens = tokens
        trainer.generation_kwargs["min_new_tokens"] = tokens
        meter.time_sampling(trainer)
    else:
        fix_completions(trainer, tokens, tok)
    write(document)
    trainer.train()
    if sampled and (meter.new_tokens != [tokens] * steps or meter.sampled_tokens != [workload.batch * tokens] * steps):
        raise RuntimeError(
            f"{part}: the timed steps sampled {meter.new_tokens} new tokens per row ({meter.sampled_tokens} in all), "
            f"expected {[tokens] * steps} ({workload.batch * tokens} each)"
        )
    document["status"] = "ok"
    report()


def _step_figures(meter: Meter, baseline, sampled: bool) -> dict:
    """The measured figures of a step part so far (memory only on a GPU, None where not measured)."""

    def above(value):
        return None if value is None or baseline is None else value - baseline

    figures = {
        "step_s": statistics.median(meter.times) if meter.times else None,
        "step_s_all": list(meter.times),
        "resident_gib": above(meter.resident),
        "peak_allocated_gib": above(meter.peak_allocated),
        "peak_reserved_gib": above(meter.peak_reserved),
        "steps_done": meter.step,
    }
    if sampled:
        sampling = statistics.median(meter.sampling) if meter.sampling else None
        figures.update(
            sampling_s=sampling,
            sampling_s_all=list(meter.sampling),
            train_s=None if sampling is None or figures["step_s"] is None else figures["step_s"] - sampling,
            sampled_tokens_per_step=meter.sampled_tokens[0] if meter.sampled_tokens else None,
        )
    return figures


def _parameters(shape: dict) -> int:
    """Parameter count of an architecture, built on the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(build_config(shape))
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------------------------------------------------
# The parts: each its own process with its own timeout; the JSON rewritten as each ends


@dataclass(frozen=True)
class Part:
    name: str
    timeout_s: int  # on the GPU
    dry_run_timeout_s: int  # on a 2-core CPU (the dry run)
    what: str
    dry_run_what: str | None = None  # what the dry run measures instead, where `what` names the GPU's shape


def what_of(part: Part, dry_run: bool) -> str:
    """What a part measures: in the dry run, never the 8B shape or the real lengths it does not run at."""
    return part.dry_run_what if dry_run and part.dry_run_what else part.what


# The wheel install of gpu_check.sh (it reads this value with --install-timeout) and the parts, in their order. On the
# GPU install plus parts add up to at most GPU_CALL_S, which leaves the device tool's 10-minute call a minute for the
# machine's start and the transfers; the dry run's to at most DRY_RUN_CALL_S (tests/project/test_gpu_check.py checks both).
# The GPU timeouts: the first GPU run (2026-12-04, benchmarks/README.md "GPU check") measured install 2 s, environment
# 31 s, opd 40 s, nca 44 s, nca-zero3 89 s, and killed nca-sampled at 80 s and launch at 115 s; the measured parts keep
# about 25% headroom and the two unfinished ones share the rest. A part past its timeout is killed and the next one runs.
# The dry run's three step parts get 60 s each: the opd part hit 50 s once, its imports slowed by the suite's DeepSpeed
# launches running beside it on the same two cores (2026-12-07); the dry run's total stays within DRY_RUN_CALL_S.
INSTALL_TIMEOUT_S = 20
PARTS = (
    Part("environment", 40, 90, "imports, versions, unmet requirements, the device, DeepSpeed's accelerator"),
    Part(
        "opd",
        55,
        60,
        "8B-shaped OPD step (nca_beta=0), fixed completions at the real lengths",
        "OPD step (nca_beta=0) of the Qwen3 architecture at the tiny model's sizes, fixed completions of a few tokens",
    ),
    Part(
        "nca",
        60,
        60,
        "8B-shaped NCA step (nca_beta=0.5), fixed completions at the real lengths",
        "NCA step (nca_beta=0.5) of the Qwen3 architecture at the tiny model's sizes, fixed completions of a few "
        "tokens",
    ),
    Part("nca-zero3", 110, 110, "the NCA step under ZeRO-3 at world size 1 (accelerate launch, zero3.yaml)"),
    Part(
        "nca-sampled",
        115,
        60,
        "one sampled 8B-shaped NCA step (256 tokens per row, sampling timed inside)",
        "one sampled NCA step of the Qwen3 architecture at the tiny model's sizes (a few tokens per row, sampling "
        "timed inside)",
    ),
    Part("launch", 140, 200, "examples/medmcqa.py under zero3.yaml, 1 process, LoRA: 2 steps, save, resume"),
)
GPU_CALL_S = 540
DRY_RUN_CALL_S = 600
MODEL = "qwen3-8b"


def workload_of(cli) -> Workload:
    base = DRY_RUN_WORKLOAD if cli.dry_run else GPU_WORKLOAD
    given = {k: getattr(cli, k) for k in Workload.__dataclass_fields__ if getattr(cli, k, None) is not None}
    return Workload(**{**asdict(base), **given})


def run_environment_part(cli, write) -> None:
    import torch

    env = environment(Path(cli.wheels) if cli.wheels else None)
    env["missing_wheels"] = missing_wheels(Path(cli.wheels)) if cli.wheels else []
    device = "cpu" if cli.dry_run or not torch.cuda.is_available() else "cuda"
    env["cuda_available"] = torch.cuda.is_available()
    dtype = torch.float32 if cli.dry_run else torch.bfloat16
    write({"status": "ok", "settings": env, "measured": {}, "measured_on": measured_on(device, dtype, cli.dry_run)})


def run_launch_part(cli, write) -> None:
    import torch

    config = LAUNCH_CONFIG if importlib.util.find_spec("deepspeed") is not None else FALLBACK_LAUNCH_CONFIG
    launch = launch_medmcqa(Path(cli.work), cli.dry_run, timeout_s=cli.part_timeout, config=config)
    device = "cpu" if cli.dry_run else "cuda"
    dtype = torch.float32 if cli.dry_run else torch.bfloat16
    measured = {
        "seconds": launch.pop("seconds"),
        "records": launch.pop("records"),
        "rc": launch.pop("rc"),
        "ok": launch["ok"],
    }
    write(
        {
            "status": "ok" if launch["ok"] else "failed",
            "settings": launch,
            "measured": measured,
            "measured_on": measured_on(device, dtype, cli.dry_run),
        }
    )


def _part_command(part: Part, cli, part_out: Path, port: int) -> list[str]:
    own = [
        str(Path(__file__).resolve()),
        "--part",
        part.name,
        "--part-out",
        str(part_out),
        "--work",
        cli.work,
        "--part-timeout",
        str(timeout_of(part, cli.dry_run)),
    ]
    own += ["--dry-run"] * cli.dry_run + (["--wheels", cli.wheels] if cli.wheels else [])
    for key in Workload.__dataclass_fields__:
        if getattr(cli, key, None) is not None:
            own += [f"--{key.replace('_', '-')}", str(getattr(cli, key))]
    if part.name != "nca-zero3":
        return [sys.executable, *own]
    launcher = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        LAUNCH_CONFIG,
        "--num_processes",
        "1",
        "--main_process_port",
        str(port),
    ]
    return launcher + (["--mixed_precision", "no"] if cli.dry_run else []) + own


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timeout_of(part: Part, dry_run: bool) -> int:
    return part.dry_run_timeout_s if dry_run else part.timeout_s


def _run_part(part: Part, cli, tmp: Path, port: int) -> dict:
    """Run one part as its own process group; kill the group at its timeout. Returns its entry: what the part wrote
    (what it measured so far, if it was killed) with its status, timeout, wall time and log tail."""
    part_out, log_path = tmp / f"{part.name}.json", tmp / f"{part.name}.log"
    timeout = timeout_of(part, cli.dry_run)
    started = time.perf_counter()
    with open(log_path, "w") as log:
        child = subprocess.Popen(
            _part_command(part, cli, part_out, port),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            rc = "timeout"
    wall = time.perf_counter() - started
    entry = json.loads(part_out.read_text()) if part_out.exists() else {"settings": {}, "measured": {}}
    if rc == "timeout":
        entry["status"] = "timeout"
        entry["error"] = f"killed at its timeout of {timeout} s"
    elif rc != 0 or entry.get("status") != "ok":
        entry["status"] = "failed"
        entry.setdefault("error", f"exit code {rc}")
    text = log_path.read_text(errors="replace")
    entry["log_tail"] = text[-(6000 if entry["status"] != "ok" else 1500) :]
    entry["timeout_s"] = timeout
    entry.setdefault("measured", {})["part_wall_s"] = wall
    return entry


def part_main(cli) -> int:
    """A part's own process: run it, rewriting `--part-out` as it goes; a failure is written with its traceback."""
    out = Path(cli.part_out)

    def write(document):
        if int(os.environ.get("RANK", "0")) == 0:
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(_no_nan(document), indent=2, allow_nan=False))
            tmp.replace(out)

    try:
        if cli.part == "environment":
            run_environment_part(cli, write)
        elif cli.part == "launch":
            run_launch_part(cli, write)
        else:
            run_step_part(cli.part, cli, write)
    except Exception as error:
        import traceback

        traceback.print_exc()
        document = json.loads(out.read_text()) if out.exists() else {"settings": {}, "measured": {}}
        document.update(status="failed", error=f"{type(error).__name__}: {error}")
        write(document)
        return 1
    finally:
        try:
            from trl_nca.core.launch import end_process_group

            end_process_group()
        except Exception:
            pass
    return 0


def targets(parts: dict, dry_run: bool) -> list[dict]:
    """The project's targets at the 8B shape, from the measured parts (none where a part did not measure)."""

    def figure(part, key):
        entry = parts.get(part) or {}
        return (entry.get("measured") or {}).get(key) if entry.get("status") == "ok" else None

    checks = []

    def check(name, a, b, limit, ratio=True):
        value = None if a is None or (ratio and not b) else (a / b if ratio else a)
        checks.append({"check": name, "measured": {"value": value}, "target": {"limit": limit}})

    check(
        "peak memory NCA / OPD",
        figure("nca", "peak_allocated_gib"),
        figure("opd", "peak_allocated_gib"),
        TARGETS["memory_ratio"],
    )
    check(
        "step time NCA / OPD, fixed completions",
        figure("nca", "step_s"),
        figure("opd", "step_s"),
        TARGETS["time_ratio"],
    )
    check("NCA step peak (reserved) GiB", figure("nca", "peak_reserved_gib"), None, TARGETS["fits_gib"], ratio=False)
    check(
        "NCA under ZeRO-3 step peak (reserved) GiB",
        figure("nca-zero3", "peak_reserved_gib"),
        None,
        TARGETS["fits_gib"],
        ratio=False,
    )
    check("step time NCA under ZeRO-3 / NCA", figure("nca-zero3", "step_s"), figure("nca", "step_s"), None)
    check(
        "peak memory NCA under ZeRO-3 / NCA",
        figure("nca-zero3", "peak_allocated_gib"),
        figure("nca", "peak_allocated_gib"),
        None,
    )
    check(
        "sampling share of the sampled NCA step",
        figure("nca-sampled", "sampling_s"),
        figure("nca-sampled", "step_s"),
        None,
    )
    for c in checks:
        value, limit = c["measured"]["value"], c["target"]["limit"]
        c["pass"] = None if dry_run or value is None or limit is None else bool(value <= limit)
    return checks


def table(parts: dict, checks: list[dict]) -> str:
    def f(value, digits=3):
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [
        "| part | status | s/step (median) | of which sampling | peak alloc GiB | peak reserved GiB | part s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, entry in parts.items():
        m = entry.get("measured") or {}
        lines.append(
            f"| {name} | {entry['status']} | {f(m.get('step_s'))} | {f(m.get('sampling_s'))} "
            f"| {f(m.get('peak_allocated_gib'), 1)} | {f(m.get('peak_reserved_gib'), 1)} | {f(m.get('part_wall_s'), 0)} |"
        )
    lines += ["", "| check | measured | target | pass |", "| --- | ---: | ---: | --- |"]
    for c in checks:
        verdict = {True: "yes", False: "**no**", None: "n/a"}[c["pass"]]
        limit = c["target"]["limit"]
        lines.append(
            f"| {c['check']} | {f(c['measured']['value'])} | {'-' if limit is None else f'<= {limit}'} | {verdict} |"
        )
    return "\n".join(lines)


def _no_nan(value):
    """JSON has no NaN: quantities not measured become null."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_no_nan(v) for v in value]
    return value


def _parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/gpu_check.json", help="where to write the JSON")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU, tiny models, a few tokens: the same parts, no timing or memory claims",
    )
    parser.add_argument(
        "--parts",
        nargs="*",
        default=None,
        choices=[p.name for p in PARTS],
        help="run only these parts (the environment always runs)",
    )
    parser.add_argument("--skip-launch", action="store_true", help="leave out the launch of examples/medmcqa.py")
    for key in Workload.__dataclass_fields__:
        parser.add_argument(
            f"--{key.replace('_', '-')}",
            type=int,
            default=None,
            help=f"workload: {key} (default {getattr(GPU_WORKLOAD, key)} on the GPU, "
            f"{getattr(DRY_RUN_WORKLOAD, key)} in the dry run)",
        )
    parser.add_argument("--wheels", default=None, help="the wheel folder gpu_check.sh installed (for its notes)")
    parser.add_argument(
        "--plan-wheels",
        metavar="DIR",
        default=None,
        help="only check the wheels in DIR against the GPU machine (download_wheels.sh)",
    )
    parser.add_argument("--install-timeout", action="store_true", help="print gpu_check.sh's install timeout (s)")
    # a part's own process (run by the parts loop)
    parser.add_argument("--part", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--part-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--part-timeout", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv=None):
    parser = _parser()
    cli = parser.parse_args(argv)
    if cli.install_timeout:
        print(INSTALL_TIMEOUT_S)
        return 0
    if cli.plan_wheels is not None:
        problems = plan_wheels(Path(cli.plan_wheels))
        for problem in problems:
            print(f"  PROBLEM: {problem}")
        return 1 if problems else 0
    if cli.part is not None:
        return part_main(cli)
    workload_of(cli)  # the workload's values are ints
    started = time.perf_counter()
    out = Path(cli.out)
    problem = out_problem(out)  # before any part: a bad --out found at the end would cost the lent GPU time
    if problem is not None:
        print(f"gpu_check: error: {problem}", file=sys.stderr, flush=True)
        return 2
    chosen = [p for p in PARTS if p.name == "environment" or cli.parts is None or p.name in cli.parts]
    chosen = [p for p in chosen if not (cli.skip_launch and p.name == "launch")]
    budget = {
        "install_s": INSTALL_TIMEOUT_S,
        "parts_s": {p.name: timeout_of(p, cli.dry_run) for p in chosen},
        "call_s": DRY_RUN_CALL_S if cli.dry_run else GPU_CALL_S,
    }
    document = {
        "meta": {
            "dry_run": cli.dry_run,
            "budget": budget,
            "settings": {
                "workload": asdict(workload_of(cli)),
                "model": MODEL + (" architecture at trl_nca.testing's tiny sizes (dry run)" if cli.dry_run else ""),
            },
            "note": "Every figure sits under a 'measured' key next to the 'measured_on' it was measured on. "
            + ("Dry run: tiny models on the CPU; it claims nothing about GPU time or memory." if cli.dry_run else ""),
        },
        "parts": {
            p.name: {"status": "not run", "timeout_s": timeout_of(p, cli.dry_run), "what": what_of(p, cli.dry_run)}
            for p in chosen
        },
        "targets": [],
        "table": None,
    }

    def save():
        document["targets"] = targets(document["parts"], cli.dry_run)
        document["table"] = table(document["parts"], document["targets"])
        env_entry = document["parts"]["environment"]
        document["measured"] = {"wall_s": time.perf_counter() - started}
        document["measured_on"] = env_entry.get("measured_on") or {
            "device": "unknown (the environment part failed)",
            "dtype": None,
            "versions": versions(),
        }
        for entry in [*document["parts"].values(), *document["targets"]]:  # a part killed before it wrote its own
            if "measured" in entry:
                entry.setdefault("measured_on", document["measured_on"])
        write_whole(out, json.dumps(_no_nan(document), indent=2, allow_nan=False))

    status = 0
    with tempfile.TemporaryDirectory() as work:
        cli.work = work
        for part in chosen:
            print(
                f"gpu_check: {part.name} ({what_of(part, cli.dry_run)}; timeout {timeout_of(part, cli.dry_run)} s)",
                flush=True,
            )
            if part.name == "nca-zero3" and importlib.util.find_spec("deepspeed") is None:
                document["parts"][part.name].update(status="not run", error=DEEPSPEED_ABSENT)
                print(f"gpu_check: nca-zero3: NOT RUN: {DEEPSPEED_ABSENT}", flush=True)
                status = 1
                save()
                continue
            entry = _run_part(part, cli, Path(work), _free_port())
            document["parts"][part.name].update(entry)
            save()
            if part.name == "environment":
                code = _report_environment(entry, cli)
                if code:
                    print(f"wrote {out}")
                    return code
                continue
            _print_part(part.name, entry)
            if entry["status"] != "ok":
                status = 1
    save()
    note = "\n\ndry run (CPU, tiny models): no timing or memory claims" if cli.dry_run else ""
    print("\n" + document["table"] + note + f"\n\nwall time {time.perf_counter() - started:.0f} s", flush=True)
    print(f"wrote {out}")
    failed = [name for name, entry in document["parts"].items() if entry["status"] != "ok"]
    if failed:
        print(f"gpu_check: FAILED: {', '.join(failed)}", flush=True)
    return status


def out_problem(out: Path) -> str | None:
    """Why `--out` cannot be written (None when it can): a folder, a path below a file, a folder that cannot be made
    or written to (a file is made there and removed). Checked before any part runs; needs nothing but the standard
    library (the environment part is what checks the imports)."""
    if out.is_dir():
        return f"--out {str(out)!r} is a folder; give the path of the JSON file to write (e.g. {out / 'check.json'})."
    below = next((parent for parent in out.parents if parent.exists() and not parent.is_dir()), None)
    if below is not None:
        return f"--out {str(out)!r} lies below {str(below)!r}, which is a file; give a path in a folder."
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        probe = out.with_name(f".{out.name}.probe-{os.getpid()}")
        probe.touch()
        probe.unlink()
    except OSError as error:
        return (
            f"--out {str(out)!r} cannot be written ({error.strerror or error}); give a path in a folder you can "
            "write to."
        )
    return None


def write_whole(out: Path, text: str) -> None:
    """`out` rewritten whole (a temporary file renamed onto it); a failed write leaves the earlier `out` and no
    temporary file, and raises `SystemExit` with one line (a full disk or a folder made unwritable mid-run)."""
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        tmp.replace(out)
    except OSError as error:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise SystemExit(
            f"gpu_check: error: cannot write {out} ({error.strerror or error}); what was written before "
            "is kept. Free some space or choose another --out."
        ) from None


def _report_environment(entry: dict, cli) -> int:
    """Print the environment part; the exit status that stops the check (3: something missing, 4: no GPU), or 0."""
    if entry["status"] != "ok":
        print(f"gpu_check: environment FAILED ({entry.get('error')}):\n{entry['log_tail']}", flush=True)
        return 3
    env = entry["settings"]
    print_environment(env)
    print(f"gpu_check: measured on {entry['measured_on']['device']}, {entry['measured_on']['dtype']}", flush=True)
    if env["missing_wheels"]:  # a carried set without one of its wheels: the GPU run would fail on it
        print(
            f"gpu_check: MISSING WHEELS in {cli.wheels}: {', '.join(env['missing_wheels'])} (run "
            "benchmarks/download_wheels.sh again)",
            flush=True,
        )
        return 3
    if env["missing"]:
        return 3
    if not cli.dry_run and not env["cuda_available"]:
        print("gpu_check: no CUDA device here; run with --dry-run for the CPU check of the script", flush=True)
        return 4
    if not cli.dry_run and env["deepspeed_accelerator"] not in (None, "cuda"):
        print(f"gpu_check: DeepSpeed detected {env['deepspeed_accelerator']!r}, not cuda", flush=True)
        return 3
    return 0


def _print_part(name: str, entry: dict) -> None:
    m = entry.get("measured") or {}
    if entry["status"] != "ok":
        print(
            f"gpu_check: {name}: {entry['status'].upper()} ({entry.get('error')}) after {m['part_wall_s']:.0f} s; "
            f"kept: {sorted(k for k, v in m.items() if v not in (None, []))}\n{entry['log_tail']}",
            flush=True,
        )
    elif name == "launch":
        print(f"gpu_check: launch ok in {m['seconds']:.0f} s, paired records {m['records']}", flush=True)
    else:
        sampling = f" (sampling {m['sampling_s']:.3f} s)" if m.get("sampling_s") is not None else ""
        memory = (
            ""
            if m.get("peak_allocated_gib") is None
            else (f", peak {m['peak_allocated_gib']:.1f} GiB allocated / {m['peak_reserved_gib']:.1f} reserved")
        )
        print(
            f"gpu_check: {name}: {m['step_s']:.3f} s/step{sampling}{memory} (part {m['part_wall_s']:.0f} s)", flush=True
        )


if __name__ == "__main__":
    sys.exit(main())
