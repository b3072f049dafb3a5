"""Sampling with Transformers and with vLLM (its CPU build), side by side in one run, at the shapes of the main job
(`trl_nca/resources/configs/main.yaml`: the rules organism, a 4-layer 128-wide Llama) and of fr-30
(`examples/configs/results/fr-30.yaml`: SmolLM2-135M-Instruct), as `trl-nca compare` plans them (`plan_comparison`).

Two shapes per job, both through trl-nca's generation backends (`trl_nca.core.sampling`) with per-item seeds:

    train  the trainer's sampling of one step: `per_device_train_batch_size` no-context prompts x `max_new_tokens`
    eval   the paired evaluation of `--items` held-out items: both views x `eval_samples_per_view` samples, in
           batches of the job's `eval_batch_size` (32 where the job leaves it)

Each shape is timed with `HFBackend` (the job's dtype, float32), then with `VLLMBackend` in float32 (equal precision)
and in bfloat16 (vLLM's CPU default for a float32 checkpoint), all in this process at `--threads` threads: the torch
threads of Transformers, and vLLM's OpenMP threads pinned to as many cores (`VLLM_CPU_OMP_THREADS_BIND`). Transformers
runs first: vLLM's engine pins the process's threads when it starts. Every completion runs to its budget (EOS ignored
by neither: each backend stops where the model ends its turn, so the rate is generated tokens per second of sampling).
The load average is printed before and after each backend: only ratios measured side by side at a similar load count.

Run it in the environment of scripts/vllm_venv.sh:

    VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/bench_vllm_sampling.py                 # both jobs, 32 items
    VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/bench_vllm_sampling.py --jobs fr-30 --items 64 --threads 2
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
JOBS = {
    "main": ROOT / "trl_nca" / "resources" / "configs" / "main.yaml",
    "fr-30": ROOT / "examples" / "configs" / "results" / "fr-30.yaml",
}


def plan_for(job: str, items: int, out: Path):
    from trl import ModelConfig, TrlParser

    from trl_nca.recipes import CompareArguments, plan_comparison
    from trl_nca.trainers.nca_config import NCAConfig

    parser = TrlParser((CompareArguments, NCAConfig, ModelConfig))
    argv = ["--config", str(JOBS[job]), "--output_dir", str(out), "--eval_items", str(items), "--seeds", "0"]
    argv += ["--slices_dir", str(out / "slices"), "--track_every", "0"]
    args, config, model_args = parser.parse_args_and_config(args=argv)
    return plan_comparison(args, config, model_args), config


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


class Timed:
    """A generation backend that counts rows, generated tokens and seconds of every call."""

    def __init__(self, backend):
        self.backend, self.name, self.rows, self.tokens, self.seconds = backend, backend.name, 0, 0, 0.0

    def generate(self, prompts, seeds, settings):
        start = time.perf_counter()
        out = self.backend.generate(prompts, seeds, settings)
        self.seconds += time.perf_counter() - start
        self.rows += len(prompts)
        self.tokens += sum(len(g.token_ids) for g in out)
        return out


def shapes(plan, config, tokenizer):
    """The job's evaluator, its sampling settings, and the no-context prompts of one training step."""
    from trl_nca.core.views import render_prompt_ids, split_example

    settings = plan.evaluator.generation
    if getattr(config, "eval_batch_size", None) is None:
        settings = dataclasses.replace(settings, batch_size=32)
    rows = plan.train_rows[: config.per_device_train_batch_size]
    train_prompts = [render_prompt_ids(tokenizer, split_example(row)[0]) for row in rows]
    return plan.evaluator, settings, train_prompts


def measure(name: str, backend, evaluator, settings, train_prompts, tokenizer) -> dict:
    from trl_nca.core.sampling import item_seed

    timed = Timed(backend)
    print(f"  {name:<14} load before {load()}", flush=True)
    if train_prompts:
        train = dataclasses.replace(settings, do_sample=True)
        timed.generate(train_prompts, [item_seed(0, str(i)) for i in range(len(train_prompts))], train)
    train_rate = timed.tokens / max(timed.seconds, 1e-9)
    timed_eval = Timed(backend)
    ev = copy.copy(evaluator)
    ev.generation = settings
    ev.run(getattr(backend, "model", None), tokenizer, backend=timed_eval, progress=False)
    eval_rate = timed_eval.tokens / max(timed_eval.seconds, 1e-9)
    print(
        f"  {name:<14} train {timed.tokens} tokens {timed.seconds:.1f} s ({train_rate:.1f}/s); eval "
        f"{timed_eval.rows} rows {timed_eval.tokens} tokens {timed_eval.seconds:.1f} s ({eval_rate:.1f}/s); load "
        f"after {load()}",
        flush=True,
    )
    return {"train": train_rate, "eval": eval_rate}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    parser.add_argument("--items", type=int, default=32, help="held-out items of the evaluation shape")
    parser.add_argument("--threads", type=int, default=1, help="threads of each backend (compare's workers use 1)")
    cli = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process, as in the tests
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if cli.threads == 1 else f"0-{cli.threads - 1}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM

    from trl_nca.core.sampling import HFBackend, VLLMBackend
    from trl_nca.recipes.budgets import position_limit_of

    torch.set_num_threads(cli.threads)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        plans = {job: plan_for(job, cli.items, Path(tmp) / job) for job in cli.jobs}
        paths = {job: next(iter(plan.model_paths.values())) for job, (plan, _) in plans.items()}
        limits = {job: min(1024, position_limit_of(path) or 1024) for job, path in paths.items()}
        for job, (plan, config) in plans.items():  # Transformers first (vLLM pins the threads)
            print(f"{job}: {paths[job]}", flush=True)
            tokenizer = AutoTokenizer.from_pretrained(paths[job])
            model = AutoModelForCausalLM.from_pretrained(paths[job], dtype=torch.float32).eval()
            evaluator, settings, train_prompts = shapes(plan, config, tokenizer)
            results[job, "hf"] = measure(
                "hf float32", HFBackend(model, tokenizer), evaluator, settings, train_prompts, tokenizer
            )
            del model
        for job, (plan, config) in plans.items():
            tokenizer = AutoTokenizer.from_pretrained(paths[job])
            evaluator, settings, train_prompts = shapes(plan, config, tokenizer)
            for dtype in ("float32", "bfloat16"):
                start = time.perf_counter()
                llm = LLM(model=paths[job], dtype=dtype, max_model_len=limits[job], enforce_eager=True, seed=0)
                print(f"{job}: vLLM {dtype} loaded in {time.perf_counter() - start:.0f} s", flush=True)
                backend = VLLMBackend(llm, tokenizer)
                results[job, dtype] = measure(f"vllm {dtype}", backend, evaluator, settings, train_prompts, tokenizer)
                del llm, backend
    print(f"\nratios (tokens per second of vLLM / Transformers float32, {cli.threads} thread(s), load now {load()}):")
    for job in cli.jobs:
        for shape in ("train", "eval"):
            hf = results[job, "hf"][shape]
            cells = ", ".join(f"{dtype} {results[job, dtype][shape] / hf:.2f}x" for dtype in ("float32", "bfloat16"))
            print(f"  {job:<6} {shape:<5} {cells}")


if __name__ == "__main__":
    main()
