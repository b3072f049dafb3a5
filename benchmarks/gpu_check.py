"""The GPU check: one call on a bare GPU machine (`bash benchmarks/gpu_check.sh`), which

1. reports the environment: every import trl-nca needs, every requirement of the installed distributions that is not
   met, and why deepspeed is absent where it is (it cannot travel as a binary wheel);
2. launches `examples/medmcqa.py` the way users launch it under DDP (`accelerate launch --config_file
   examples/accelerate/ddp.yaml`), on one process, with the tiny model of `trl_nca.testing` and a local MedMCQA-format
   JSONL, and checks that training and the paired evaluation ran to the end (exit code 0 and the report files);
3. measures OPD (`nca_beta=0`) against NCA (`nca_beta=0.5`) at the shapes of Qwen3-1.7B and Qwen3-8B: seconds per
   training step with on-policy sampling included, the sampling's share of it, and peak memory.

Models are built with random weights from the published architectures (the models' config.json, written out below),
in bf16, which costs the same time and memory as the trained model. Every step samples on-policy (`lmbda=1`) with
`min_new_tokens = max_new_tokens`, so each row's completion has exactly `--completion-tokens` tokens, both variants do
the same work, and the step time does not depend on when sampling would stop. LoRA self-distillation (r 16 on q/k/v/o,
the teacher is the student with its adapter disabled), gradient checkpointing on. Per model and variant: a fresh model
(same seed), `--warmup` untimed steps, then `--steps` timed steps (median wall time, CUDA-synchronised); peak memory is
the CUDA allocator's maximum over the timed steps (allocated and reserved) above what was allocated before the model
was built. Results are written to `--out` after every run, so a run cut short still leaves what it measured; a run
that would not finish within `--budget-s` is skipped and listed as skipped.

`--dry-run` runs the same functions on the CPU with tiny models (the sizes of `trl_nca.testing`'s tiny model, in the
same architecture), fp32, a few tokens: it checks that the script works before a GPU is lent and claims nothing about
time or memory. Without a GPU the script refuses to run anything but `--dry-run`.

`--plan-wheels DIR` (used by `benchmarks/download_wheels.sh`) checks the wheels in DIR against what the GPU machine
is known to have installed (`GPU_MACHINE`): every requirement of every wheel must be met by another wheel or by the
machine.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path


os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parents[1]

# Published architectures (Qwen/Qwen3-1.7B and Qwen/Qwen3-8B, config.json), random weights.
SHAPES = {
    "qwen3-1.7b": dict(
        model_type="qwen3", hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True,
    ),
    "qwen3-8b": dict(
        model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=False,
    ),
}  # fmt: skip

# The lent GPU machine, as reported for it (CPython 3.12.3, x86-64 Linux, no network). None: present, version not
# reported. MACHINE_DEPENDENCIES: installed there because the packages above require them (transformers: pyyaml,
# regex, typer, tqdm, packaging; huggingface-hub: filelock, httpx, click, hf-xet, typing-extensions; accelerate: psutil;
# torch: jinja2, sympy, networkx, setuptools; pandas: python-dateutil, tzdata); their versions are not checked here.
GPU_MACHINE = {
    "torch": "2.11.0", "transformers": "5.17.0", "accelerate": "1.15.0", "peft": None, "pyarrow": None,
    "pandas": None, "xxhash": None, "fsspec": None, "huggingface-hub": "1.33.0", "tokenizers": "0.23.0",
    "safetensors": "0.8.0", "numpy": "2.5.0",
}  # fmt: skip
MACHINE_DEPENDENCIES = (
    "pyyaml", "regex", "typer", "tqdm", "packaging", "filelock", "httpx", "click", "hf-xet", "typing-extensions",
    "psutil", "jinja2", "sympy", "networkx", "setuptools", "python-dateutil", "tzdata",
)  # fmt: skip
MACHINE_PYTHON = {"python_version": "3.12", "python_full_version": "3.12.3", "platform_machine": "x86_64",
                  "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
                  "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}  # fmt: skip
# Imports the check needs; deepspeed is optional (ZeRO launches), reported either way.
REQUIRED_IMPORTS = ("torch", "transformers", "accelerate", "peft", "datasets", "trl", "trl.experimental.gkd",
                    "trl_nca", "trl_nca.trainers.nca_trainer", "trl_nca.eval.compare")  # fmt: skip
DEEPSPEED_ABSENT = (
    "deepspeed is not installed: benchmarks/download_wheels.sh builds it as a pure-Python wheel "
    "(`DS_BUILD_OPS=0 pip wheel --no-deps deepspeed==0.19.8`: no op compiled; ZeRO-2/3 with the Trainer's torch "
    "optimizer compiles none) and carries it with its dependencies; without it the launch falls back to "
    "examples/accelerate/ddp.yaml and ZeRO is not checked."
)

TARGETS = {"fits_gib": 80.0, "memory_ratio": 1.15, "time_ratio": 1.3}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
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
        "name": _canonical(fields["Name"]), "version": fields["Version"], "file": path.name,
        "requires_python": fields.get("Requires-Python"), "requires": fields["Requires-Dist"],
    }  # fmt: skip


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
        "imports": imports, "missing": [m for m, v in imports.items() if v != "ok"], "deepspeed": deepspeed,
        "deepspeed_accelerator": accelerator,
        "unmet_requirements": unmet_requirements(_project_dependencies()), "versions": versions(),
        "vllm": "installed, not used (NCATrainer samples with generate)" if importlib.util.find_spec("vllm")
        else "not installed",
    }  # fmt: skip


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
        {"id": f"m{i}", "question": f"Case {i}: which organ produces insulin?", "opa": "Liver", "opb": "Spleen",
         "opc": "Pancreas", "opd": "Kidney", "cop": 2, "choice_type": "single", "exp": "",
         "subject_name": subjects[i % len(subjects)], "topic_name": "t"}
        for i in range(n)
    ]  # fmt: skip


def launch_model(work: Path, dry_run: bool) -> str:
    """The launched student: on the GPU a random model of Qwen3-1.7B's published config (bf16, the tiny tokenizer,
    whose ids the wider output layer covers); in a dry run the tiny model of `trl_nca.testing`."""
    from trl_nca.testing import make_tiny_tokenizer, save_tiny_model

    if dry_run:
        return save_tiny_model(work / "tiny", seed=0)
    import torch

    folder = work / "qwen3-1.7b-random"
    tok = make_tiny_tokenizer()
    model = build_model(SHAPES["qwen3-1.7b"], tok, "cuda", torch.bfloat16)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    del model
    torch.cuda.empty_cache()
    return str(folder)


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
    model = launch_model(work, dry_run)
    data = work / "medmcqa.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in medmcqa_rows(64)) + "\n")
    out = work / "medmcqa-out"
    eval_limit = 8
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config,
                "--num_processes", "1", "--main_process_port", "29517"]  # fmt: skip
    script = ["examples/medmcqa.py", "--model_name_or_path", model, "--dataset_path", str(data),
              "--per_device_train_batch_size", "2", "--max_new_tokens", "8", "--train_limit", "16",
              "--eval_limit", str(eval_limit), "--eval_max_new_tokens", "8", "--eval_batch_size", "8",
              "--output_dir", str(out), "--report_to", "none", "--save_strategy", "steps", "--save_steps", "1",
              "--use_peft", "true", "--lora_r", "16", "--lora_alpha", "32", "--lora_target_modules",
              *LORA_TARGETS]  # fmt: skip
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
        "command": commands[0], "commands": commands, "config": config, "rc": 0 if not problems else 1,
        "seconds": seconds, "records": records, "ok": not problems, "problems": problems,
        "log_tail": "\n".join(logs)[-6000:],
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# The step benchmark


def dry_run_shape(shape: dict, tok) -> dict:
    """`shape`'s architecture at the sizes of trl_nca.testing's tiny model. Its output layer has more rows than the
    tiny tokenizer has tokens, as on the GPU (151936 rows for the same tokenizer), so samples hold ids past it there
    too."""
    from trl_nca.testing import make_tiny_model

    tiny = make_tiny_model(tok, vocab_size=512).config
    sizes = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
    return dict(shape, **{k: getattr(tiny, k) for k in sizes}, head_dim=tiny.hidden_size // tiny.num_attention_heads,
                vocab_size=tiny.vocab_size)  # fmt: skip


def build_config(shape: dict, tok=None):
    from transformers import AutoConfig

    shape = dict(shape)
    if tok is not None:  # the special tokens of the benchmark's tokenizer
        shape.update(pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return AutoConfig.for_model(shape.pop("model_type"), **shape)


def build_model(shape: dict, tok, device: str, dtype, seed: int = 0):
    import torch
    from transformers import AutoModelForCausalLM

    config = build_config(shape, tok)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


def build_dataset(tok, rows: int, context_tokens: int):
    """Text rows: a question as the prompt and a system context of at least `context_tokens` tokens; and the token
    lengths of the first row's prompt without and with the context."""
    from datasets import Dataset

    from trl_nca.core.views import ContextSpec
    from trl_nca.trainers.data import Limits, prepare_dataset

    words = CONTEXT_WORDS.split()
    context, i = "", 0
    while len(tok(context)["input_ids"]) < context_tokens:
        context += words[i % len(words)] + " "
        i += 1
    prompts = [f"Question {k}: which organ produces insulin? (A) Liver (B) Spleen (C) Pancreas (D) Kidney" for k in
               range(rows)]  # fmt: skip
    text = Dataset.from_dict({"prompt": prompts, "context": [context] * rows})
    first = prepare_dataset(text.select([0]), tok, ContextSpec(column="context"), Limits(max_new_tokens=1), "probe")
    return text, (len(first[0]["prompt_ids"]), len(first[0]["context_prompt_ids"]))


class Meter:
    """Step wall times (step end to step end, CUDA-synchronised), the sampling time and tokens inside each step, and
    the allocator's peaks over the timed steps."""

    def __init__(self, device: str, warmup: int):
        self.device, self.warmup, self.times, self.last, self.step = device, warmup, [], None, 0
        self.sampling, self.new_tokens, self.sampled_tokens = [], [], []
        self.resident = self.peak_allocated = self.peak_reserved = float("nan")

    def sync(self):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()

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
                meter.last = time.perf_counter()

            def on_train_end(self, args, state, control, **kwargs):
                if meter.device == "cuda":
                    meter.peak_allocated = torch.cuda.max_memory_allocated() / 2**30
                    meter.peak_reserved = torch.cuda.max_memory_reserved() / 2**30

        return _Callback()


def run_variant(name, shape, variant, beta, tok, data, cli, device, dtype, out_dir, share_prefix=True) -> dict:
    """One model and variant: a fresh model, `warmup + steps` on-policy steps, each sampling exactly
    `completion_tokens` tokens per row."""
    import torch
    from peft import LoraConfig

    from trl_nca import NCAConfig, NCATrainer

    baseline = torch.cuda.memory_allocated() / 2**30 if device == "cuda" else float("nan")  # left by earlier runs
    model = build_model(shape, tok, device, dtype)
    meter = Meter(device, cli.warmup)
    args = NCAConfig(
        output_dir=str(out_dir / f"{name}-{variant}"), max_steps=cli.warmup + cli.steps,
        per_device_train_batch_size=cli.batch, lmbda=1.0, nca_beta=beta, bf16=dtype == torch.bfloat16,
        use_cpu=device == "cpu", gradient_checkpointing=True, learning_rate=1e-5, max_new_tokens=cli.completion_tokens,
        max_length=None, report_to=[], save_strategy="no", logging_steps=10_000, disable_tqdm=True, seed=0,
        divergence_support=cli.support, dataloader_num_workers=0, share_prefix=share_prefix,
    )  # fmt: skip
    peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_TARGETS)
    trainer = NCATrainer(
        model=model, teacher_model=None, args=args, train_dataset=data, processing_class=tok, callbacks=[meter.callback()],
        peft_config=peft_config,
    )  # fmt: skip
    # every sample exactly completion_tokens long: no early end-of-sequence, the same work in both variants
    trainer.generation_config.min_new_tokens = cli.completion_tokens
    trainer.generation_kwargs["min_new_tokens"] = cli.completion_tokens
    meter.time_sampling(trainer)
    trainer.train()
    expected = [cli.completion_tokens] * cli.steps
    if meter.new_tokens != expected or meter.sampled_tokens != [cli.batch * cli.completion_tokens] * cli.steps:
        raise RuntimeError(
            f"{name} {variant}: the timed steps sampled {meter.new_tokens} new tokens per row "
            f"({meter.sampled_tokens} in all), expected {expected} ({cli.batch * cli.completion_tokens} each)"
        )
    step = statistics.median(meter.times)
    sampling = statistics.median(meter.sampling)
    row = {
        "model": name, "variant": variant, "nca_beta": beta, "share_prefix": share_prefix,
        "teacher": type(trainer._teacher()).__name__, "step_s": step, "step_s_all": meter.times,
        "sampling_s": sampling, "sampling_s_all": meter.sampling, "train_s": step - sampling,
        "sampled_tokens_per_step": meter.sampled_tokens[0], "baseline_gib": baseline,
        "resident_gib": meter.resident - baseline, "peak_allocated_gib": meter.peak_allocated - baseline,
        "peak_reserved_gib": meter.peak_reserved - baseline,
    }  # fmt: skip
    del trainer, model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def targets(rows: list[dict], dry_run: bool) -> list[dict]:
    by = {(r["model"], r["variant"]): r for r in rows}
    checks = []
    for name in dict.fromkeys(r["model"] for r in rows):
        opd, nca = by.get((name, "opd")), by.get((name, "nca"))
        unshared = by.get((name, "nca-unshared"))
        if unshared is not None and nca is not None:  # issue 12: the shared prefix against the unshared forwards
            checks += [
                {"model": name, "check": "NCA step time (sampling included), shared prefix / unshared", "value":
                 nca["step_s"] / unshared["step_s"], "limit": 1.0},
                {"model": name, "check": "NCA peak memory, shared prefix / unshared", "value":
                 nca["peak_allocated_gib"] / unshared["peak_allocated_gib"], "limit": 1.0},
            ]  # fmt: skip
        if opd is not None and nca is not None:
            checks += [
                {"model": name, "check": "peak memory NCA / OPD", "value":
                 nca["peak_allocated_gib"] / opd["peak_allocated_gib"], "limit": TARGETS["memory_ratio"]},
                {"model": name, "check": "step time NCA / OPD, sampling included", "value":
                 nca["step_s"] / opd["step_s"], "limit": TARGETS["time_ratio"]},
                {"model": name, "check": "step time NCA / OPD, sampling excluded", "value":
                 nca["train_s"] / opd["train_s"], "limit": TARGETS["time_ratio"]},
            ]  # fmt: skip
        if "8b" in name and nca is not None:
            checks.append(
                {"model": name, "check": "NCA step peak (reserved) GiB", "value": nca["peak_reserved_gib"],
                 "limit": TARGETS["fits_gib"]}
            )  # fmt: skip
    for check in checks:
        value = check["value"]
        check["pass"] = None if dry_run or value != value else bool(value <= check["limit"])  # NaN: not measured
    return checks


def table(rows: list[dict], checks: list[dict]) -> str:
    lines = [
        "| model | variant | s/step, sampling included (median) | of which sampling | resident GiB | peak alloc GiB "
        "| peak reserved GiB |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['variant']} (nca_beta={r['nca_beta']}) | {r['step_s']:.3f} | {r['sampling_s']:.3f} "
            f"| {r['resident_gib']:.1f} | {r['peak_allocated_gib']:.1f} | {r['peak_reserved_gib']:.1f} |"
        )
    lines += ["", "| model | check | measured | target | pass |", "| --- | --- | ---: | ---: | --- |"]
    for c in checks:
        verdict = {True: "yes", False: "**no**", None: "n/a"}[c["pass"]]
        lines.append(f"| {c['model']} | {c['check']} | {c['value']:.3f} | <= {c['limit']} | {verdict} |")
    return "\n".join(lines)


def _no_nan(value):
    """JSON has no NaN: quantities not measured (memory on a CPU) become null."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return value


def _parameters(shape: dict) -> int:
    """Parameter count of an architecture, built on the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(build_config(shape))
    return sum(p.numel() for p in model.parameters())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/gpu_check.json", help="where to write the JSON")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, tiny models, a few tokens: the same functions, no timing or memory claims")  # fmt: skip
    parser.add_argument("--models", nargs="*", default=["qwen3-8b", "qwen3-1.7b"], choices=list(SHAPES),
                        help="in this order; the default runs 8B first, so the time budget never skips it")  # fmt: skip
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--completion-tokens", type=int, default=256)
    parser.add_argument("--context-tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per model and variant")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--support", choices=["full", "top_k"], default="full", help="divergence support")
    parser.add_argument("--sharing", action="store_true",
                        help="also run NCA with share_prefix=False, to measure the shared prefix against it")  # fmt: skip
    parser.add_argument("--skip-launch", action="store_true", help="do not launch examples/medmcqa.py")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="skip a model run that would end later than this many seconds after the start")  # fmt: skip
    parser.add_argument("--wheels", default=None, help="the wheel folder gpu_check.sh installed (for its notes)")
    parser.add_argument("--plan-wheels", metavar="DIR", default=None,
                        help="only check the wheels in DIR against the GPU machine (download_wheels.sh)")  # fmt: skip
    cli = parser.parse_args(argv)
    if cli.plan_wheels is not None:
        problems = plan_wheels(Path(cli.plan_wheels))
        for problem in problems:
            print(f"  PROBLEM: {problem}")
        return 1 if problems else 0
    if cli.warmup < 1:
        parser.error("--warmup must be at least 1 (the first step compiles and allocates)")
    started = time.perf_counter()
    out = Path(cli.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {"meta": {"dry_run": cli.dry_run}, "environment": None, "launch": None, "runs": [], "skipped": [],
                "targets": [], "table": None}  # fmt: skip

    def save():
        document["meta"]["wall_s"] = time.perf_counter() - started
        out.write_text(json.dumps(_no_nan(document), indent=2, allow_nan=False))

    env = environment(Path(cli.wheels) if cli.wheels else None)
    env["missing_wheels"] = missing_wheels(Path(cli.wheels)) if cli.wheels else []
    document["environment"] = env
    print_environment(env)
    if env["missing_wheels"]:  # a carried set without one of its wheels: the GPU run would fail on it
        print(f"gpu_check: MISSING WHEELS in {cli.wheels}: {', '.join(env['missing_wheels'])} (run "
              "benchmarks/download_wheels.sh again)", flush=True)  # fmt: skip
        save()
        print(f"wrote {out}")
        return 3
    if env["missing"]:
        save()
        print(f"wrote {out}")
        return 3

    import torch

    if not cli.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run with --dry-run for the CPU check of the script", flush=True)
        save()
        return 4
    device = "cpu" if cli.dry_run else "cuda"
    dtype = torch.float32 if cli.dry_run else torch.bfloat16
    if cli.dry_run:
        cli.batch, cli.completion_tokens, cli.context_tokens, cli.steps = 2, 8, 32, 1
    document["meta"].update(
        device=torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        dtype=str(dtype).replace("torch.", ""),
    )
    print(f"gpu_check: {document['meta']['device']}, {document['meta']['dtype']}", flush=True)

    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if not cli.skip_launch:
            config = LAUNCH_CONFIG if env["deepspeed_accelerator"] else FALLBACK_LAUNCH_CONFIG
            if not cli.dry_run and env["deepspeed_accelerator"] not in (None, "cuda"):
                failures.append("deepspeed accelerator")
                print(f"gpu_check: DeepSpeed detected {env['deepspeed_accelerator']!r}, not cuda", flush=True)
            print(
                f"gpu_check: launching examples/medmcqa.py under {config}, 1 process, LoRA, save and resume", flush=True
            )
            launch = launch_medmcqa(tmp, cli.dry_run, timeout_s=240 if device == "cuda" else 900, config=config)
            document["launch"] = launch
            print(f"gpu_check: launch: {launch['command']}", flush=True)
            if launch["ok"]:
                print(f"gpu_check: launch ok in {launch['seconds']:.0f} s, paired records {launch['records']}")
            else:
                failures.append("launch")
                print(f"gpu_check: launch FAILED: {'; '.join(launch['problems'])}\n{launch['log_tail']}", flush=True)
            save()

        from trl_nca.testing import make_tiny_tokenizer

        tok = make_tiny_tokenizer()
        data, (prompt_len, context_len) = build_dataset(tok, cli.batch * (cli.warmup + cli.steps), cli.context_tokens)
        shapes = {m: dry_run_shape(SHAPES[m], tok) if cli.dry_run else SHAPES[m] for m in cli.models}
        document["meta"].update(
            batch=cli.batch, completion_tokens=cli.completion_tokens, context_tokens=cli.context_tokens,
            prompt_tokens=prompt_len, context_prompt_tokens=context_len, steps=cli.steps, warmup=cli.warmup,
            support=cli.support, lora={"r": 16, "alpha": 32, "target_modules": LORA_TARGETS},
            teacher="LoRA self-teacher (adapter disabled)", gradient_checkpointing=True, lmbda=1.0,
            shapes=shapes, parameters={m: _parameters(s) for m, s in shapes.items()},
        )  # fmt: skip
        print(
            f"gpu_check: batch {cli.batch} x {cli.completion_tokens} sampled tokens per step, prompt {prompt_len} "
            f"tokens, with context {context_len}; vllm: {env['vllm']}",
            flush=True,
        )
        last = None  # (seconds, parameters) of the last run: the estimate of the next one's time
        for name in cli.models:
            variants = [("opd", 0.0, True), ("nca", 0.5, True)]
            if cli.sharing:
                variants.append(("nca-unshared", 0.5, False))
            for variant, beta, share in variants:
                elapsed = time.perf_counter() - started
                size = document["meta"]["parameters"][name]
                # the last run's time, scaled by the parameter count and by 1.25 for NCA's extra forward and backward
                estimate = None if last is None else last[0] * max(1.0, size / last[1]) * 1.25
                if not cli.dry_run and estimate is not None and elapsed + estimate > cli.budget_s:
                    reason = f"would end at about {elapsed + estimate:.0f} s, past --budget-s {cli.budget_s:.0f}"
                    document["skipped"].append({"model": name, "variant": variant, "reason": reason})
                    print(f"gpu_check: {name} {variant}: SKIPPED: {reason}", flush=True)
                    continue
                t0 = time.perf_counter()
                try:
                    row = run_variant(name, shapes[name], variant, beta, tok, data, cli, device, dtype, tmp, share)
                except Exception as error:  # reported, and the remaining runs still get their turn
                    import traceback

                    failures.append(f"{name} {variant}")
                    document["skipped"].append({"model": name, "variant": variant, "reason": repr(error)})
                    print(f"gpu_check: {name} {variant}: FAILED\n{traceback.format_exc()}", flush=True)
                    gc.collect()
                    if device == "cuda":
                        torch.cuda.empty_cache()
                    save()
                    continue
                row["wall_s"] = time.perf_counter() - t0
                last = (row["wall_s"], size)
                document["runs"].append(row)
                print(
                    f"gpu_check: {name} {variant}: {row['step_s']:.3f} s/step (sampling {row['sampling_s']:.3f} s), "
                    f"peak {row['peak_allocated_gib']:.1f} GiB allocated / {row['peak_reserved_gib']:.1f} reserved "
                    f"({row['wall_s']:.0f} s)",
                    flush=True,
                )
                save()
    document["targets"] = targets(document["runs"], cli.dry_run)
    document["table"] = table(document["runs"], document["targets"])
    note = "\n\ndry run (CPU, tiny models): no timing or memory claims" if cli.dry_run else ""
    print("\n" + document["table"] + note + f"\n\nwall time {time.perf_counter() - started:.0f} s", flush=True)
    save()
    print(f"wrote {out}")
    if failures:
        print(f"gpu_check: FAILED: {', '.join(failures)}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
