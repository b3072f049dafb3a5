"""Where the time of the fr-30 job goes: today's code and the fast path, side by side in one process.

The fr-30 job (examples/configs/results/fr-30.yaml: the embedded SmolLM2-135M-Instruct, LoRA r=16 on every linear,
8 prompts x 32 new tokens per step, 30 steps, OPD vs NCA x 3 seeds, then 240 held-out items x 2 views x 4 samples for
the base and each of the 6 students) is planned exactly as `trl-nca compare` plans it (`plan_comparison` on the
YAML), with fewer evaluated items and steps, and measured at one torch thread (as each of compare's `workers` runs):

    today  sampling without a shared prefix (`share_prefix=False`: in fr-30 the training forwards share nothing
           either, their prefixes being shorter than `share_prefix_min_tokens`), evaluation batches of 32 prompts
    fast   the prompts' shared prefix (chat template opening, system message, the instruction) run once per sampling
           call in training and in the evaluation (`trl_nca.core.sampling.shared_prefill`), evaluation batches of
           `--fast-eval-batch` prompts (fr-30.yaml's `eval_batch_size`)

Phases, today and fast interleaved:

    steps  `--warmup` untimed and `--steps` timed optimizer steps of OPD and of NCA, each split into sampling (the
           trainer's `generate` of 8 x 32 tokens) and the rest (the views' forwards, the loss, the backward, the
           update); the completions of today's and the fast path's steps are compared
    eval   the paired evaluation of `--items` items of the base and of the fast path's OPD student, `--repeats` times;
           the records of both paths are compared item by item

The job estimate scales the phases to fr-30's 240 items and 30 steps, per unit (the base's evaluation; each student
trained and evaluated), then adds the units up: one after another (`workers: 1`), and on two cores
(`workers: 2`: compare's units in its order, each to the first free worker). Model loading and the report are left
out; the job itself is measured end to end with `trl-nca compare` (benchmarks/README.md).

    python benchmarks/bench_fr30.py                                   # 32 items, 1 + 2 steps, 1 repeat
    python benchmarks/bench_fr30.py --items 64 --repeats 2
    python benchmarks/bench_fr30.py --eval-batch-sizes 32 64 128 --items 32 --repeats 2   # the evaluation batch only
    python benchmarks/bench_fr30.py --dtype bfloat16                  # the same in bfloat16 (fr-30 is float32)
    python benchmarks/bench_fr30.py --decoding                        # decoding alone: dtypes, batches, caches

`--decoding` measures the model's decoding alone, at one thread: for float32 and bfloat16, the prefill of 45-token
prompts (every position's logits) and 8 decoding steps at batches of 8, 32, 64 and 128, with a LoRA adapter on every
linear (a student); then 128 rows x 32 greedy tokens of the base with transformers' dynamic cache, its static cache,
and the static cache with a compiled decoding step, each twice in turn, the tokens compared.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import heapq
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FR30 = ROOT / "examples" / "configs" / "results" / "fr-30.yaml"
FR30_ITEMS, FR30_STEPS, FR30_SEEDS = 240, 30, 3
PATHS = ("today", "fast")


class TimedBackend:
    """A generation backend that times every call: rows, generated tokens, seconds."""

    def __init__(self, backend, calls: list):
        self.backend, self.calls, self.name = backend, calls, backend.name

    def generate(self, prompts, seeds, settings):
        start = time.perf_counter()
        out = self.backend.generate(prompts, seeds, settings)
        self.calls.append((len(prompts), sum(len(g.token_ids) for g in out), time.perf_counter() - start))
        return out


def plan_for(dtype: str, items: int, steps: int, out: Path):
    from trl import ModelConfig, TrlParser

    from trl_nca.recipes import CompareArguments, plan_comparison
    from trl_nca.trainers.nca_config import NCAConfig

    parser = TrlParser((CompareArguments, NCAConfig, ModelConfig))
    argv = [
        "--config",
        str(FR30),
        "--output_dir",
        str(out),
        "--eval_items",
        str(items),
        "--max_steps",
        str(steps),
        "--dtype",
        dtype,
        "--seeds",
        "0",
        "--slices_dir",
        str(out / "slices"),
    ]
    args, config, model_args = parser.parse_args_and_config(args=argv)
    return plan_comparison(args, config, model_args)


def measure_steps(plan, run, tokenizer, warmup: int, timed: int, share_prefix: bool):
    """Train the run's student for warmup + timed steps with sampling's shared prefix on or off; returns (per-step
    seconds, sampling seconds per step, every sampled completion, the trained student)."""
    from transformers import TrainerCallback

    from trl_nca.recipes.compare import train_run
    from trl_nca.trainers.nca_trainer import NCATrainer

    sampling: list[float] = []
    completions: list[torch.Tensor] = []
    original = NCATrainer._generate

    def timed_generate(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            out = original(self, *args, **kwargs)
            completions.append(out[0][out[1].bool()].clone())
            return out
        finally:
            sampling.append(time.perf_counter() - start)

    class Clock(TrainerCallback):
        def __init__(self):
            self.ends = []

        def bind(self, trainer):  # train_run binds its tracker to the trainer; the clock needs nothing from it
            pass

        def on_train_begin(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

    clock = Clock()
    config = dataclasses.replace(run.config, max_steps=warmup + timed, share_prefix=share_prefix)
    NCATrainer._generate = timed_generate
    try:
        trainer = train_run(
            plan.task,
            config,
            plan.model_paths[run.organism],
            plan.model_init_kwargs,
            tokenizer,
            copy.deepcopy(plan.peft_config),
            plan.train_rows,
            clock,
        )
    finally:
        NCATrainer._generate = original
    trainer.remove_callback(clock)
    step_times = [b - a for a, b in zip(clock.ends, clock.ends[1:])][warmup:]
    return step_times, sampling[warmup:], completions, trainer.accelerator.unwrap_model(trainer.model)


def evaluate(evaluator, model, tokenizer, path: str, batch_size: int, calls: list):
    """One paired evaluation by today's path or the fast one; returns (seconds, records)."""
    from trl_nca.core.sampling import HFBackend

    ev = copy.copy(evaluator)
    ev.generation = dataclasses.replace(evaluator.generation, batch_size=batch_size)
    backend = TimedBackend(HFBackend(model, tokenizer, share_prefix=path == "fast"), calls)
    start = time.perf_counter()
    records = ev.run(model, tokenizer, backend=backend, progress=False)
    return time.perf_counter() - start, records


def comparable(records):
    out = [r.to_dict() for r in records]
    for record in out:
        record["meta"].pop("versions", None)
    return out


def differing(a, b) -> int:
    return sum(x != y for x, y in zip(comparable(a), comparable(b)))


def makespan(units: list[float], workers: int) -> float:
    """Wall time of `units` run in this order, each started on the first free of `workers` workers."""
    free = [0.0] * workers
    for seconds in units:
        heapq.heappush(free, heapq.heappop(free) + seconds)
    return max(free)


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def batch_sizes(plan, sizes: list[int], repeats: int):
    """The base's fast evaluation at each batch size, interleaved over `repeats`: seconds, the ratio to the first
    size's, and the items whose records differ from the first size's (the batch size is left out of the run key)."""
    from transformers import AutoTokenizer

    from trl_nca.recipes.compare import load_base

    path = plan.model_paths[None]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_base(path, plan.model_init_kwargs).eval()
    seconds, records = defaultdict(list), {}
    for _ in range(repeats):
        for size in sizes:
            wall, records[size] = evaluate(plan.evaluator, model, tokenizer, "fast", size, [])
            seconds[size].append(wall)
            print(f"eval base, fast path, batch {size}: {wall:.1f} s", flush=True)
    first = sizes[0]
    print(f"\n| eval batch | seconds per repeat | best | best vs batch {first} | items whose records differ |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for size in sizes:
        print(
            f"| {size} | {', '.join(f'{t:.1f}' for t in seconds[size])} | {min(seconds[size]):.1f} | "
            f"{min(seconds[first]) / min(seconds[size]):.2f}x | {differing(records[size], records[first])} of "
            f"{len(records[size])} |"
        )


def decoding(plan):
    """Decoding alone (see the module docstring): prefill and per-step times per dtype and batch, then the caches."""
    from peft import LoraConfig, get_peft_model
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import CompileConfig

    from trl_nca.recipes.compare import load_base

    path = plan.model_paths[None]
    print(
        "\n| dtype | batch | prefill of 45 tokens s | decoding step ms | tokens/s |\n| --- | ---: | ---: | ---: | ---: |"
    )
    for dtype in ("float32", "bfloat16"):
        model = load_base(path, {**plan.model_init_kwargs, "dtype": dtype})
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets)).eval()
        for rows in (8, 32, 64, 128):
            ids = torch.randint(100, 1000, (rows, 45), generator=torch.Generator().manual_seed(rows))
            with torch.no_grad():
                start = time.perf_counter()
                out = model(input_ids=ids, use_cache=True)
                prefill = time.perf_counter() - start
                cache, last = out.past_key_values, ids[:, -1:]
                start = time.perf_counter()
                for _ in range(8):
                    cache = model(input_ids=last, past_key_values=cache, use_cache=True).past_key_values
                step = (time.perf_counter() - start) / 8
            print(f"| {dtype} | {rows} | {prefill:.2f} | {1000 * step:.0f} | {rows / step:.1f} |", flush=True)
        del model
    model = load_base(path, plan.model_init_kwargs).eval()
    ids = torch.randint(100, 1000, (128, 40), generator=torch.Generator().manual_seed(0))
    seconds, tokens = defaultdict(list), {}
    for _ in range(2):
        for kind in ("dynamic", "static", "compiled"):
            config = GenerationConfig(max_new_tokens=32, do_sample=False, pad_token_id=0, eos_token_id=None)
            if kind != "dynamic":
                config.cache_implementation = "static"
            if kind == "compiled":
                config.compile_config = CompileConfig(mode="default")
                config.compile_config._compile_all_devices = True  # transformers compiles on CUDA-like devices only
            start = time.perf_counter()
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
            seconds[kind].append(time.perf_counter() - start)
            tokens.setdefault(kind, out)
            print(f"{kind} cache: {seconds[kind][-1]:.1f} s", flush=True)
    print("\n| decoding, 128 rows x 32 tokens | first call s | second call s | tokens as the dynamic cache's |")
    print("| --- | ---: | ---: | --- |")
    for kind in ("dynamic", "static", "compiled"):
        same = torch.equal(tokens[kind], tokens["dynamic"])
        print(f"| {kind} | {seconds[kind][0]:.1f} | {seconds[kind][1]:.1f} | {'same' if same else 'different'} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=32, help="held-out items evaluated (fr-30: 240)")
    parser.add_argument("--dtype", default="float32", help="the models' dtype (fr-30: float32)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed training steps before the timed ones")
    parser.add_argument("--steps", type=int, default=2, help="timed training steps per method and path")
    parser.add_argument("--repeats", type=int, default=1, help="evaluations per path and model (interleaved)")
    parser.add_argument("--today-eval-batch", type=int, default=32, help="today's evaluation batch")
    parser.add_argument("--fast-eval-batch", type=int, default=None, help="the fast path's (default: fr-30.yaml's)")
    parser.add_argument("--decoding", action="store_true", help="decoding alone: dtypes, batches, caches")
    parser.add_argument(
        "--eval-batch-sizes",
        type=int,
        nargs="+",
        default=None,
        help="only the base's fast evaluation at these batch sizes, interleaved (e.g. 32 64 128)",
    )
    cli = parser.parse_args()

    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from trl_nca.recipes.compare import load_base

    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread, CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, {cli.dtype}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        plan = plan_for(cli.dtype, cli.items, cli.warmup + cli.steps, Path(tmp))
        if cli.decoding:
            decoding(plan)
            return
        if cli.eval_batch_sizes:
            batch_sizes(plan, cli.eval_batch_sizes, cli.repeats)
            return
        batch = {"today": cli.today_eval_batch, "fast": cli.fast_eval_batch or plan.args.eval_batch_size}
        tokenizer = AutoTokenizer.from_pretrained(plan.model_paths[None])
        steps, samples, student = {}, {}, None
        for run in plan.runs:  # one seed: the OPD run, then the NCA run
            for path in PATHS:
                times, sampling, samples[run.method.name, path], model = measure_steps(
                    plan, run, tokenizer, cli.warmup, cli.steps, share_prefix=path == "fast"
                )
                steps[run.method.name, path] = (statistics.median(times), statistics.median(sampling))
                print(
                    f"{run.method.name} step, {path}: {steps[run.method.name, path][0]:.2f} s, of which sampling "
                    f"{steps[run.method.name, path][1]:.2f} s",
                    flush=True,
                )
                if run.method.name == "opd" and path == "fast":
                    student = model
                else:
                    del model
        models = {"base": load_base(plan.model_paths[None], plan.model_init_kwargs).eval(), "student": student.eval()}
        evals, calls = {}, defaultdict(list)
        for name, model in models.items():
            seconds, records = defaultdict(list), {}
            for _ in range(cli.repeats):
                for path in PATHS:
                    wall, records[path] = evaluate(plan.evaluator, model, tokenizer, path, batch[path], calls[path])
                    seconds[path].append(wall)
                    print(f"eval {name}, {path} (batch {batch[path]}): {wall:.1f} s", flush=True)
            evals[name] = {path: min(seconds[path]) for path in PATHS}
            evals[name]["differ"] = differing(records["today"], records["fast"])
        report(cli, plan, steps, samples, evals, calls, batch)


def report(cli, plan, steps, samples, evals, calls, batch):
    scale = FR30_ITEMS / cli.items
    print("\n## Sampling tokens/s per call size (generated tokens / wall time of the generate call)\n")
    print("| path | rows per call | calls | tokens/s |\n| --- | ---: | ---: | ---: |")
    for path in PATHS:
        by_rows = defaultdict(lambda: [0, 0, 0.0])
        for rows, tokens, seconds in calls[path]:
            entry = by_rows[rows]
            entry[0], entry[1], entry[2] = entry[0] + 1, entry[1] + tokens, entry[2] + seconds
        for rows, (n, tokens, seconds) in sorted(by_rows.items()):
            print(f"| {path} | {rows} | {n} | {tokens / seconds:.1f} |")
    print(f"\n## Phases ({cli.items} items evaluated, scaled x{scale:.1f} to 240; median of {cli.steps} timed steps)\n")
    print("| phase | today s | fast s | today / fast | outputs |\n| --- | ---: | ---: | ---: | --- |")
    for method in ("opd", "nca"):
        today, fast = steps[method, "today"], steps[method, "fast"]
        same = sum(torch.equal(a, b) for a, b in zip(samples[method, "today"], samples[method, "fast"]))
        print(
            f"| {method} step (of which sampling) | {today[0]:.2f} ({today[1]:.2f}) | {fast[0]:.2f} ({fast[1]:.2f}) "
            f"| {today[0] / fast[0]:.2f} ({today[1] / fast[1]:.2f}) | {same} of {len(samples[method, 'fast'])} "
            "sampling calls gave the same completions |"
        )
    for name in ("base", "student"):
        e = evals[name]
        print(
            f"| eval {name} (batch {batch['today']} / {batch['fast']}) | {e['today']:.1f} | {e['fast']:.1f} | "
            f"{e['today'] / e['fast']:.2f} | {e['differ']} of {cli.items} items' records differ |"
        )
    units = {}
    for path in PATHS:
        base = scale * evals["base"][path]
        student = {m: FR30_STEPS * steps[m, path][0] + scale * evals["student"][path] for m in ("opd", "nca")}
        # compare's order: the base, then per seed the OPD and the NCA student
        units[path] = [base] + [student[run.method.name] for _ in range(FR30_SEEDS) for run in plan.runs]
    print("\n## The fr-30 job, from the phases (model loading and the report left out)\n")
    print("| path | base eval | OPD student | NCA student | units one after another | on 2 workers |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for path in PATHS:
        u = units[path]
        print(
            f"| {path} | {minutes(u[0])} | {minutes(u[1])} | {minutes(u[2])} | {minutes(sum(u))} | "
            f"{minutes(makespan(u, 2))} |"
        )
    today, fast = units["today"], units["fast"]
    print(
        f"\nfast vs today: {sum(today) / sum(fast):.2f}x one after another; today one after another vs fast on 2 "
        f"workers: {sum(today) / makespan(fast, 2):.2f}x"
    )


if __name__ == "__main__":
    main()
