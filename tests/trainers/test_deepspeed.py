"""DeepSpeed ZeRO-2 and ZeRO-3 on CPU (gloo, 2 processes, launched with the shipped `examples/accelerate/` configs):
the update and the logged terms equal one process training on the whole batch, for full fine-tuning and LoRA, with a
separate teacher, the adapter-disabled self-teacher and frozen copies of a partitioned student; sampling under ZeRO-3
with gathered weights draws what the unsharded model draws."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trl_nca.testing import FLOAT32, KL32, STORED32, free_port


if importlib.util.find_spec("deepspeed") is None:
    if os.environ.get("CI"):  # CI installs the dev extras, which include deepspeed: missing there is an error
        raise ImportError("deepspeed is not installed; `pip install -e '.[dev]'` installs it.")
    pytest.skip("deepspeed is not installed (`pip install -e '.[dev]'`)", allow_module_level=True)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parents[1] / "scripts" / "ds_train.py"
CONFIGS = ROOT / "examples" / "accelerate"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from trl_nca.testing import save_tiny_model

    folder = tmp_path_factory.mktemp("models")
    save_tiny_model(folder / "student", seed=0)
    save_tiny_model(folder / "teacher", seed=1)
    return folder


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return env


def _train(
    out: Path, models: Path, tuning: str, teacher: str, config: str | None = None, *extra: str, processes: int = 2
) -> Path:
    args = [str(SCRIPT), str(out), "--tuning", tuning, "--teacher", teacher, "--models", str(models), *extra]
    if config is not None:
        launch = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(CONFIGS / f"{config}.yaml"),
            "--num_processes",
            str(processes),
            "--mixed_precision",
            "no",
            "--main_process_port",
            str(free_port()),
        ]
        args = launch + args
    else:
        args = [sys.executable, *args]
    result = subprocess.run(args, cwd=out.parent, env=_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    # DeepSpeed's CPU shared-memory op is never built or loaded (trl_nca.core.launch.skip_deepspeed_shared_memory_op)
    assert "shm_comm_op built" not in result.stdout + result.stderr
    return out


_references: dict[tuple[str, str], Path] = {}


def _reference(tmp_path_factory, models, tuning: str, teacher: str, *data: str) -> Path:
    """One process, 4 rows per step, no DeepSpeed (trained once per module and data set)."""
    key = (tuning, teacher, *data)
    if key not in _references:
        out = tmp_path_factory.mktemp("single") / "-".join(key).strip("-")
        _references[key] = _train(out, models, tuning, teacher, None, *data)
    return _references[key]


def _assert_same_step(single: Path, zero: Path, tuning: str, processes: int = 2) -> dict:
    info = json.loads((zero / "info.json").read_text())
    assert info["processes"] == processes  # with 2, the data was split over them, not trained twice on the same rows
    a, b = torch.load(single / "weights.pt"), torch.load(zero / "weights.pt")
    initial = torch.load(zero / "initial.pt")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(torch.load(single / "initial.pt")[name], initial[name], rtol=0, atol=0)
        FLOAT32.close(a[name], b[name], msg=lambda m, n=name: f"{n}: {m}")  # float32 sums in another order
    moved = {n for n in b if not torch.equal(b[n], initial[n])}
    if tuning == "full":
        assert moved == set(b), f"parameters the step did not update: {sorted(set(b) - moved)}"
    else:  # LoRA: every B moves (A too unless B starts at zero); the base weights stay
        lora = {n for n in b if "lora_" in n}
        assert {n for n in lora if "lora_B" in n} <= moved <= lora, sorted(moved ^ lora)
    assert sum((b[n] - initial[n]).norm() ** 2 for n in b) ** 0.5 > 1e-2  # SGD, lr 1: the update is the gradient
    (log_single,) = json.loads((single / "logs.json").read_text())
    (log_zero,) = json.loads((zero / "logs.json").read_text())
    for key in ("loss", "opd_loss", "nca_loss", "view_kl"):
        assert log_zero[key] == KL32.approx(log_single[key]), key  # float32 KLs, rows split over processes
    assert log_zero["grad_norm"] == FLOAT32.approx(log_single["grad_norm"])  # a norm of float32 gradients
    assert log_zero["completions/mean_length"] == log_single["completions/mean_length"]  # a ratio of token counts
    assert log_zero["loss"] == STORED32.approx(log_zero["opd_loss"] + 0.5 * log_zero["nca_loss"])  # float32 loss
    return info


# Gradient checkpointing on (TRL's default) in every case: reentrant checkpointing fires each weight's gradient hook
# once per view, which DeepSpeed's reduce buckets count twice (an AssertionError at ZeRO-3, "already reduced" at ZeRO-2)
# or, when the bucket is flushed between the two calls, overwrite (a wrong gradient without an error). A reduce bucket
# of 1 element flushes after every gradient, so only a step that fires each hook once matches the reference.
@pytest.mark.parametrize(
    "config, tuning, teacher, extra, use_reentrant, joint",
    [
        # TRL forces use_reentrant=True for PEFT + ZeRO-3; the trainers keep it non-reentrant (DeepSpeed >= 0.19.3)
        ("zero3", "lora", "self", ("--on-policy",), False, False),
        ("zero3", "lora", "self", ("--on-policy", "--reentrant", "true", "--reduce-bucket", "1"), True, True),
        ("zero3", "full", "separate", ("--reentrant", "true", "--reduce-bucket", "1"), True, True),
        ("zero2", "lora", "self", ("--on-policy", "--reentrant", "true", "--reduce-bucket", "1"), True, True),
        ("zero2", "full", "separate", ("--reduce-bucket", "1"), False, False),
        ("zero3", "lora", "self", ("--trainer", "distill"), False, False),
        ("zero3", "lora", "self", ("--trainer", "distill", "--reentrant", "true", "--reduce-bucket", "1"), True, True),
    ],
    ids=[
        "zero3-lora-trl-default",
        "zero3-lora-reentrant",
        "zero3-full-reentrant-offpolicy",
        "zero2-lora-reentrant",
        "zero2-full-default",
        "distill-zero3-lora-default",
        "distill-zero3-lora-reentrant",
    ],
)
def test_zero_one_process_with_checkpointing_matches_without_deepspeed(
    tmp_path, tmp_path_factory, models, config, tuning, teacher, extra, use_reentrant, joint
):
    data = tuple(flag for flag in extra if flag in ("--on-policy", "--trainer", "distill"))
    single = _reference(tmp_path_factory, models, tuning, teacher, *data)
    out = _train(tmp_path / "zero", models, tuning, teacher, config, "--per-device", "4", *extra, processes=1)
    info = _assert_same_step(single, out, tuning, processes=1)
    assert info["zero_stage"] == int(config[4])
    assert (info["use_reentrant"], info["joint_forward"]) == (use_reentrant, joint)


def test_separate_views_with_reentrant_checkpointing_under_deepspeed_are_refused(tmp_path, models):
    """`nca_joint_forward=False` with reentrant checkpointing under DeepSpeed cannot be exact: one line, before any
    step."""
    args = [
        str(SCRIPT),
        str(tmp_path / "zero"),
        "--tuning",
        "lora",
        "--teacher",
        "self",
        "--models",
        str(models),
        "--reentrant",
        "true",
        "--joint-forward",
        "false",
    ]
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(CONFIGS / "zero3.yaml"),
        "--num_processes",
        "1",
        "--mixed_precision",
        "no",
        "--main_process_port",
        str(free_port()),
    ]
    result = subprocess.run(launch + args, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode != 0
    assert "nca_joint_forward=False cannot be exact with reentrant gradient checkpointing under DeepSpeed" in (
        result.stderr
    ), result.stderr[-3000:]
    assert not (tmp_path / "zero" / "weights.pt").exists()


def test_zero3_two_processes_reentrant_small_bucket(tmp_path, tmp_path_factory, models):
    """The joint forward under 2 processes with reentrant checkpointing and a bucket that flushes after every
    gradient: each weight's hook fires once, and the update equals one process training on the whole batch."""
    single = _reference(tmp_path_factory, models, "lora", "self")
    extra = ("--per-device", "2", "--reentrant", "true", "--reduce-bucket", "1")
    out = _train(tmp_path / "zero", models, "lora", "self", "zero3", *extra)
    info = _assert_same_step(single, out, "lora")
    assert info["use_reentrant"] is True and info["joint_forward"] is True


@pytest.mark.parametrize(
    "config, tuning, teacher, extra, teacher_kind",
    [
        # 2 processes x 1 row x 2 accumulation steps: DeepSpeed's own accumulation scaling must not apply on top
        ("zero2", "full", "separate", ("--per-device", "1", "--grad-accum", "2"), "LlamaForCausalLM"),
        ("zero2", "lora", "self", ("--per-device", "2"), "SelfTeacher"),
        ("zero3", "full", "separate", ("--per-device", "2"), "LlamaForCausalLM"),
        ("zero3", "lora", "self", ("--per-device", "2", "--sample"), "SelfTeacher"),
        # the frozen copies of a student that ZeRO-3 partitioned as it loaded: merged LoRA (random B), full weights
        ("zero3", "lora", "self-copy", ("--per-device", "2"), "LlamaForCausalLM"),
        ("zero3", "full", "self", ("--per-device", "2"), "LlamaForCausalLM"),
        # weights and optimizer state in CPU memory (the same memory here, but DeepSpeed's offload code paths)
        ("zero3_offload", "lora", "self", ("--per-device", "2"), "SelfTeacher"),
        # processes whose rows share prefixes of different lengths, with prompts and completions of different lengths
        ("zero3", "full", "separate", ("--per-device", "2", "--mixed"), "LlamaForCausalLM"),
    ],
    ids=[
        "zero2-full-separate-accum",
        "zero2-lora-self",
        "zero3-full-separate",
        "zero3-lora-self-sample",
        "zero3-lora-merged-copy",
        "zero3-full-copy",
        "zero3-offload-lora-self",
        "zero3-mixed-prefixes",
    ],
)
def test_zero_two_processes_match_single_process(
    tmp_path, tmp_path_factory, models, config, tuning, teacher, extra, teacher_kind
):
    data = tuple(flag for flag in extra if flag == "--mixed")
    single = _reference(tmp_path_factory, models, tuning, teacher, *data)
    out = _train(tmp_path / "zero", models, tuning, teacher, config, *extra)
    info = _assert_same_step(single, out, tuning)
    zero = int(config[4])
    assert info["zero_stage"] == zero and info["teacher"] == teacher_kind
    if zero == 3:
        assert info["loaded_partitioned"] and info["student_partitioned"]
        # a teacher with weights of its own is partitioned too; the self-teacher has none and calls the student
        assert info["teacher_partitioned"] == (teacher_kind != "SelfTeacher")
    if "--sample" in extra:
        _assert_same_samples(out, models)
    if data:  # every forward gathers under ZeRO-3: both processes ran the prefix length they agreed on, not their own
        shared = [json.loads((out / f"shared_rank{rank}.json").read_text()) for rank in range(2)]
        assert shared[0] == shared[1]
        assert shared[0]["student's no-context view"] > 0  # shared, at the shorter length of process 1
        assert shared[0]["student's context view"] == shared[0]["teacher"] == 0  # process 1 cannot share them


def test_zero3_processes_agree_on_the_sampling_prefix(tmp_path, models):
    """On-policy sampling under ZeRO-3 without gathering the weights for generation, where every forward of the
    sampling prefill gathers weights with collectives: on step 1 both processes share a prefix (the shorter of their
    two), on step 2 process 1 has none to share, so neither runs a prefix pass; the run finishes."""
    extra = ("--per-device", "2", "--on-policy", "--steps", "2", "--sampling-prefixes", "--no-gather-for-generation")
    out = _train(tmp_path / "zero", models, "lora", "self", "zero3", *extra)
    sampled = [json.loads((out / f"sampling_rank{rank}.json").read_text()) for rank in range(2)]
    (a0, b0), (a1, b1) = (record["local"] for record in sampled)
    assert a0 > a1 > 0 and b0 > 0 and b1 == 0  # what each process could share on its own, per step
    assert sampled[0]["shared"] == sampled[1]["shared"] == [a1]  # what they ran: the agreed length, then nothing


@pytest.mark.parametrize("teacher", ["separate", "self-copy"])
def test_zero3_teacher_runs_through_its_engine_every_step(tmp_path, models, teacher):
    """A teacher with weights of its own (a separate model, a frozen merged copy of the student) under ZeRO-3 is called
    through its DeepSpeed engine on every step: the engine's hooks on its top-level module run (DeepSpeed resets its
    parameter trace and prefetches there), not only those of its decoder layers."""
    tuning = "full" if teacher == "separate" else "lora"
    out = _train(tmp_path / "zero", models, tuning, teacher, "zero3", "--per-device", "2", "--steps", "2")
    for rank in range(2):
        record = json.loads((out / f"teacher_calls_rank{rank}.json").read_text())
        assert record["engine"] == "DeepSpeedEngine"
        assert sorted(set(record["calls"])) == [0, 1], record  # called through the engine on each of the 2 steps


def _assert_same_samples(out: Path, models: Path) -> None:
    """Each process sampled its own prompts under ZeRO-3 (weights gathered for generation); the unsharded model with
    the same trained weights, seed and generation settings draws the same tokens."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(models / "student")
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))
    model.load_state_dict(torch.load(out / "weights.pt"), strict=True)
    model.eval()
    pad, eos = model.generation_config.pad_token_id, model.generation_config.eos_token_id
    config = GenerationConfig(
        max_new_tokens=6,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        pad_token_id=pad,
        eos_token_id=eos,
        use_cache=True,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the launched processes
    try:
        for rank in range(2):
            saved = torch.load(out / f"samples_rank{rank}.pt")
            torch.manual_seed(saved["seed"])
            with torch.no_grad():
                sequences = model.generate(
                    input_ids=saved["prompts"], attention_mask=saved["prompt_mask"], generation_config=config
                )
            ids = sequences[:, saved["prompts"].shape[1] :]
            assert ids.shape[1] > 0 and saved["mask"].sum() > 0
            torch.testing.assert_close(saved["ids"], ids, rtol=0, atol=0)
            ends = [row.tolist().index(eos) + 1 if eos in row.tolist() else len(row) for row in ids]
            assert saved["mask"].sum(1).tolist() == ends  # up to and including the first end-of-sequence token
    finally:
        torch.set_num_threads(threads)


def test_processes_that_do_not_see_each_other_are_refused(tmp_path, models):
    """A ZeRO config in the training arguments on a machine without GPUs: accelerate gets no process-group backend
    and counts 1 process while DeepSpeed joins 2, so both would train on the same rows. The trainer refuses it."""
    out = tmp_path / "zero"
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        str(SCRIPT),
        str(out),
        "--tuning",
        "full",
        "--teacher",
        "separate",
        "--models",
        str(models),
        "--per-device",
        "2",
        "--zero-in-args",
        "2",
    ]
    result = subprocess.run(args, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode != 0
    assert "2 processes were launched, but accelerate counts 1" in result.stderr
    assert "ddp_backend='gloo'" in result.stderr
    assert not (out / "weights.pt").exists()


@pytest.mark.parametrize("gather", [True, False], ids=["gathered", "sharded"])
def test_rollout_generate_calls_agree_across_processes(tmp_path, models, gather):
    """Episodes of process 0 end after 1 model call, those of process 1 after 4, under ZeRO-3 with the weights gathered
    for sampling or kept sharded (`ds3_gather_for_generation`): process 0 keeps calling `generate` on a throw-away row
    while process 1 still plays, so both make the same calls (otherwise the collectives mismatch)."""
    out = tmp_path / "rollout"
    out.mkdir()
    script = Path(__file__).parents[1] / "scripts" / "ds_rollout.py"
    args = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(CONFIGS / "zero3.yaml"),
        "--num_processes",
        "2",
        "--mixed_precision",
        "no",
        "--main_process_port",
        str(free_port()),
        str(script),
        str(out),
        "--models",
        str(models),
        *([] if gather else ["--no-gather"]),
    ]
    result = subprocess.run(args, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    calls = [json.loads((out / f"calls_rank{rank}.json").read_text()) for rank in range(2)]
    assert [c["rollout_calls"] for c in calls] == [2, 8]  # 2 steps: 1 and 4 model calls per episode
    assert len(calls[0]["generate_rows"]) == len(calls[1]["generate_rows"]) == 8
    assert calls[0]["generate_rows"] == [2, 1, 1, 1] * 2  # its own episodes, then throw-away rows
    assert calls[1]["generate_rows"] == [2] * 8
