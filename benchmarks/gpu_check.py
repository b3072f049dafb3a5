"""OPD (nca_beta=0) against NCA (nca_beta=0.5) on one GPU: seconds per training step and peak memory, at the shapes of
Qwen3-1.7B and Llama-3.1-8B, LoRA self-distillation, bf16, gradient checkpointing on. Run it through
`benchmarks/gpu_check.sh` (which brings trl and datasets as wheels); see benchmarks/README.md.

No weights are loaded: each model is built with random weights from its published architecture (below), which costs
the same time and memory as the trained model. Completions are fixed: every row scores the same pre-made random
completion of exactly `--completion-tokens` tokens (`lmbda=0`, so the step scores the dataset's completions instead
of sampling), so both variants do the same work and the step time does not depend on when sampling would stop. Sampling
is timed separately, once per model: `generate` through the trainer's own path, forced to exactly that many new tokens
(`min_new_tokens`), from the no-context prompts. vLLM is only recorded as present or absent (NCATrainer samples with
`generate`).

Per model and variant: a fresh model (same seed), one warm-up step, then `--steps` timed steps (median wall time,
CUDA-synchronised); peak memory is the CUDA allocator's maximum over the timed steps (allocated and reserved), next to
the memory resident before them, both counted above what was allocated before the model was built (`baseline_gib`,
about 0 unless an earlier run leaked). `--smoke` runs the same code at tiny shapes on any device (seconds on a CPU), so the
script is known to work before a GPU session.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

# Published architectures (the models' config.json on the Hub), random weights.
SHAPES = {
    "qwen3-1.7b": dict(
        model_type="qwen3", hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True,
    ),
    "llama3.1-8b": dict(
        model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    ),
}  # fmt: skip
# --smoke: the same two architecture families, tiny.
SMOKE_SHAPES = {
    name: dict(shape, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, vocab_size=512)
    for name, shape in SHAPES.items()
}  # fmt: skip

TARGETS = {"fits_gib": 80.0, "memory_ratio": 1.15, "time_ratio": 1.3}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
CONTEXT_WORDS = (
    "Read the question and every option before you decide. Recall the relevant facts, rule out the options that "
    "contradict them and prefer the most specific correct option. Keep your reasoning short and factual. "
)


def build_config(shape: dict, tok=None):
    from transformers import AutoConfig

    shape = dict(shape)
    if tok is not None:  # the special tokens of the benchmark's tokenizer
        shape.update(pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return AutoConfig.for_model(shape.pop("model_type"), **shape)


def build_model(shape: dict, tok, device: str, dtype: torch.dtype, seed: int = 0):
    from transformers import AutoModelForCausalLM

    config = build_config(shape, tok)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


def build_dataset(tok, rows: int, context_tokens: int, completion_tokens: int, seed: int = 0):
    """Token rows: the chat prompt without and with a `context_tokens`-token system context, and one fixed random
    completion of exactly `completion_tokens` ordinary tokens per row."""
    from datasets import Dataset

    from trl_nca.data import Limits, prepare_dataset
    from trl_nca.views import ContextSpec

    words = CONTEXT_WORDS.split()
    context, i = "", 0
    while len(tok(context)["input_ids"]) < context_tokens:
        context += words[i % len(words)] + " "
        i += 1
    prompts = [f"Question {k}: which organ produces insulin? (A) Liver (B) Spleen (C) Pancreas (D) Kidney" for k in
               range(rows)]  # fmt: skip
    text = Dataset.from_dict({"prompt": prompts, "context": [context] * rows})
    limits = Limits(max_new_tokens=completion_tokens)
    data = prepare_dataset(text, tok, ContextSpec(column="context", placement="system"), limits, "benchmark")
    special = set(tok.all_special_ids)
    ordinary = torch.tensor([t for t in range(len(tok)) if t not in special])
    generator = torch.Generator().manual_seed(seed)
    completions = ordinary[torch.randint(len(ordinary), (rows, completion_tokens), generator=generator)].tolist()
    data = data.remove_columns([c for c in data.column_names if c not in ("prompt_ids", "context_prompt_ids")])
    data = data.add_column("completion_ids", completions)
    lengths = (len(data[0]["prompt_ids"]), len(data[0]["context_prompt_ids"]))
    return data, lengths


class Meter:
    """Step wall times (step end to step end, CUDA-synchronised) and the allocator's peaks over the timed steps."""

    def __init__(self, device: str, warmup: int):
        self.device, self.warmup, self.times, self.last = device, warmup, [], None
        self.resident = self.peak_allocated = self.peak_reserved = float("nan")

    def sync(self):
        if self.device == "cuda":
            torch.cuda.synchronize()

    def callback(self):
        from transformers import TrainerCallback

        meter = self

        class _Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                meter.sync()
                meter.last = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                meter.sync()
                now = time.perf_counter()
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


def run_variant(name, shape, variant, beta, tok, data, cli, device, dtype, out_dir, share_prefix=True):
    from peft import LoraConfig

    from trl_nca import NCAConfig, NCATrainer

    baseline = torch.cuda.memory_allocated() / 2**30 if device == "cuda" else float("nan")  # left by earlier runs
    model = build_model(shape, tok, device, dtype)
    meter = Meter(device, cli.warmup)
    args = NCAConfig(
        output_dir=str(out_dir / f"{name}-{variant}"), max_steps=cli.warmup + cli.steps,
        per_device_train_batch_size=cli.batch, lmbda=0.0, nca_beta=beta, bf16=dtype == torch.bfloat16,
        use_cpu=device == "cpu", gradient_checkpointing=True, learning_rate=1e-5, max_new_tokens=cli.completion_tokens,
        max_length=None, report_to=[], save_strategy="no", logging_steps=10_000, disable_tqdm=True, seed=0,
        divergence_support=cli.support, dataloader_num_workers=0, share_prefix=share_prefix,
    )  # fmt: skip
    peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_TARGETS)
    trainer = NCATrainer(
        model=model, teacher_model=None, args=args, train_dataset=data, processing_class=tok, callbacks=[meter.callback()],
        peft_config=peft_config,
    )  # fmt: skip
    trainer.train()
    row = {
        "model": name, "variant": variant, "nca_beta": beta, "teacher": type(trainer._teacher()).__name__,
        "step_s": statistics.median(meter.times), "step_s_all": meter.times, "baseline_gib": baseline,
        "resident_gib": meter.resident - baseline, "peak_allocated_gib": meter.peak_allocated - baseline,
        "peak_reserved_gib": meter.peak_reserved - baseline,
    }  # fmt: skip
    if variant == "opd":
        row.update(time_sampling(trainer, data, cli, device))
    del trainer, model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def time_sampling(trainer, data, cli, device) -> dict:
    """One `generate` call through the trainer's path (weights unwrapped, checkpointing lifted, KV cache on) on one
    batch of no-context prompts, forced to exactly `completion_tokens` new tokens; after a short warm-up call."""
    batch = trainer.data_collator([data[i] for i in range(cli.batch)])
    prompts = batch["prompts"].to(trainer.args.device)
    mask = batch["prompt_attention_mask"].to(trainer.args.device)
    config, kwargs = trainer.generation_config, trainer.generation_kwargs
    saved = {k: getattr(config, k, None) for k in ("min_new_tokens", "max_new_tokens")}
    try:
        for key, value in (("min_new_tokens", 4), ("max_new_tokens", 4)):
            setattr(config, key, value)
            kwargs[key] = value
        trainer._generate(trainer.model_wrapped, prompts, mask)  # warm-up
        for key in ("min_new_tokens", "max_new_tokens"):
            setattr(config, key, cli.completion_tokens)
            kwargs[key] = cli.completion_tokens
        if device == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        ids, completion_mask = trainer._generate(trainer.model_wrapped, prompts, mask)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    finally:
        for key, value in saved.items():
            setattr(config, key, value)
            if value is None:
                kwargs.pop(key, None)
            else:
                kwargs[key] = value
    tokens = int(completion_mask.sum())
    if ids.shape[1] != cli.completion_tokens:
        raise RuntimeError(f"sampling produced {ids.shape[1]} new tokens, expected {cli.completion_tokens}")
    return {
        "sampling_s": seconds, "sampled_tokens": tokens,
        "sampling_peak_allocated_gib": peak, "sampling_resident_gib": base if device == "cuda" else float("nan"),
    }  # fmt: skip


def targets(rows: list[dict], smoke: bool) -> list[dict]:
    by = {(r["model"], r["variant"]): r for r in rows}
    checks = []
    for name in dict.fromkeys(r["model"] for r in rows):
        opd, nca = by.get((name, "opd")), by.get((name, "nca"))
        unshared = by.get((name, "nca-unshared"))
        if unshared is not None and nca is not None:  # issue 12: the shared prefix against the unshared forwards
            checks += [
                {"model": name, "check": "NCA step time, shared prefix / unshared", "value":
                 nca["step_s"] / unshared["step_s"], "limit": 1.0},
                {"model": name, "check": "NCA peak memory, shared prefix / unshared", "value":
                 nca["peak_allocated_gib"] / unshared["peak_allocated_gib"], "limit": 1.0},
            ]  # fmt: skip
        if opd is None or nca is None:
            continue
        mem = nca["peak_allocated_gib"] / opd["peak_allocated_gib"]
        step = nca["step_s"] / opd["step_s"]
        with_sampling = (nca["step_s"] + opd["sampling_s"]) / (opd["step_s"] + opd["sampling_s"])
        checks += [
            {"model": name, "check": "peak memory NCA / OPD", "value": mem, "limit": TARGETS["memory_ratio"]},
            {"model": name, "check": "step time NCA / OPD", "value": step, "limit": TARGETS["time_ratio"]},
            {"model": name, "check": "step time NCA / OPD, sampling included", "value": with_sampling,
             "limit": TARGETS["time_ratio"]},
        ]  # fmt: skip
        if "8b" in name:
            checks.append(
                {"model": name, "check": "NCA step peak (reserved) GiB", "value": nca["peak_reserved_gib"],
                 "limit": TARGETS["fits_gib"]}
            )  # fmt: skip
    for check in checks:
        value = check["value"]
        check["pass"] = None if smoke or value != value else bool(value <= check["limit"])  # NaN: not measured
    return checks


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "vllm"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def table(rows: list[dict], checks: list[dict]) -> str:
    lines = [
        "| model | variant | s/step (median) | resident GiB | peak alloc GiB | peak reserved GiB | sampling s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        sampling = f"{r['sampling_s']:.2f}" if "sampling_s" in r else ""
        lines.append(
            f"| {r['model']} | {r['variant']} (nca_beta={r['nca_beta']}) | {r['step_s']:.3f} | {r['resident_gib']:.1f} "
            f"| {r['peak_allocated_gib']:.1f} | {r['peak_reserved_gib']:.1f} | {sampling} |"
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/gpu_check.json", help="where to write the JSON")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, fp32 unless on a GPU: checks the script")
    parser.add_argument("--models", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--completion-tokens", type=int, default=512)
    parser.add_argument("--context-tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per model and variant")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--support", choices=["full", "top_k"], default="full", help="divergence support")
    parser.add_argument("--sharing", action="store_true",
                        help="also run NCA with share_prefix=False, to measure the shared prefix against it")  # fmt: skip
    cli = parser.parse_args(argv)
    if cli.warmup < 1:
        parser.error("--warmup must be at least 1 (the first step compiles and allocates)")
    if cli.smoke:
        cli.batch, cli.completion_tokens, cli.context_tokens, cli.steps = 2, 8, 32, 1
    started = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shapes = SMOKE_SHAPES if cli.smoke else SHAPES
    from trl_nca.testing import make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    data, (prompt_len, context_len) = build_dataset(
        tok, cli.batch * (cli.warmup + cli.steps), cli.context_tokens, cli.completion_tokens
    )
    meta = {
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "dtype": str(dtype).replace("torch.", ""), "smoke": cli.smoke, "batch": cli.batch,
        "completion_tokens": cli.completion_tokens, "context_tokens": cli.context_tokens,
        "prompt_tokens": prompt_len, "context_prompt_tokens": context_len, "steps": cli.steps, "warmup": cli.warmup,
        "support": cli.support, "lora": {"r": 16, "alpha": 32, "target_modules": LORA_TARGETS},
        "teacher": "LoRA self-teacher (adapter disabled)", "gradient_checkpointing": True,
        "vllm": "installed, not used (NCATrainer samples with generate)" if importlib.util.find_spec("vllm")
        else "not installed", "versions": versions(), "shapes": {m: shapes[m] for m in cli.models},
    }  # fmt: skip
    print(
        f"gpu_check: {meta['device']} {meta['dtype']}, batch {cli.batch} x {cli.completion_tokens} completion tokens, "
        f"prompt {prompt_len} tokens, with context {context_len}; vllm: {meta['vllm']}",
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in cli.models:
            variants = [("opd", 0.0, True), ("nca", 0.5, True)] + (
                [("nca-unshared", 0.5, False)] if cli.sharing else []
            )
            for variant, beta, share in variants:
                t0 = time.perf_counter()
                rows.append(
                    run_variant(name, shapes[name], variant, beta, tok, data, cli, device, dtype, Path(tmp), share)
                )
                r = rows[-1]
                print(
                    f"{name:12s} {variant}: {r['step_s']:.3f} s/step, peak {r['peak_allocated_gib']:.1f} GiB allocated "
                    f"/ {r['peak_reserved_gib']:.1f} reserved"
                    + (f", sampling {r['sampling_s']:.2f} s" if "sampling_s" in r else "")
                    + f" ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
    checks = targets(rows, cli.smoke)
    meta["wall_s"] = time.perf_counter() - started
    report = table(rows, checks)
    print("\n" + report + f"\n\nwall time {meta['wall_s']:.0f} s", flush=True)
    out = Path(cli.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {"meta": meta, "runs": rows, "targets": checks, "table": report}
    out.write_text(json.dumps(_no_nan(document), indent=2, allow_nan=False))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
