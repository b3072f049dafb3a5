"""Where the time of the fr-30 job goes, and the evaluation's fast path against today's, side by side in one run.

The fr-30 job (examples/configs/results/fr-30.yaml: the embedded SmolLM2-135M-Instruct, LoRA r=16 on every linear,
8 prompts x 32 new tokens per step, 30 steps, OPD vs NCA x 3 seeds, then 240 held-out items x 2 views x 4 samples for
the base and each of the 6 students) is planned exactly as `trl-nca compare` plans it (`plan_comparison` on the
YAML), with a smaller `eval_items` and `max_steps`, and measured per phase, for each `--dtypes`:

    step     one OPD and one NCA optimizer step (after `--warmup` untimed ones), split into sampling (the trainer's
             `generate` of 8 x 32 tokens) and the rest (the views' forwards, the loss, the backward, the update)
    eval     the paired evaluation of `--items` items x 2 views x 4 samples, of the base and of the OPD student just
             trained, with today's code (`group_samples=False`, `HFBackend(share_prompts=False)`: one generate call
             per view and sample index) and with the fast path (the k samples of a view in one call, each distinct
             prompt prefilled once), interleaved; the records of both are compared field by field

Every generate call is timed: sampling tokens per second at each batch size (generated tokens, which stop at the end
of sequence of each row, over wall time). The fr-30 estimate scales the measured phases to the job:

    base eval + 6 students x (30 steps of their method + their eval), eval scaled by 240 / --items

    python benchmarks/bench_fr30.py                                  # 32 items, float32 and bfloat16
    python benchmarks/bench_fr30.py --items 16 --dtypes float32      # quicker
    python benchmarks/bench_fr30.py --one-call --repeats 2           # one 32-row call, prefill shared or not
    python benchmarks/bench_fr30.py --eval-batch-sizes 32 64 128 --items 32 --dtypes float32 --repeats 2
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
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


class TimedBackend:
    """A generation backend that times every call: rows, generated tokens, seconds (per label)."""

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
    argv = ["--config", str(FR30), "--output_dir", str(out), "--eval_items", str(items), "--max_steps", str(steps),
            "--dtype", dtype, "--seeds", "0"]  # fmt: skip
    args, config, model_args = parser.parse_args_and_config(args=argv)
    return plan_comparison(args, config, model_args)


def measure_steps(plan, run, tokenizer, warmup: int, timed: int):
    """Train the run's student for warmup + timed steps; returns (per-step seconds, sampling seconds per step, the
    trained student)."""
    from transformers import TrainerCallback

    from trl_nca.recipes.compare import train_run
    from trl_nca.trainers.nca_trainer import NCATrainer

    sampling: list[float] = []
    original = NCATrainer._generate

    def timed_generate(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
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
    config = dataclasses.replace(run.config, max_steps=warmup + timed)
    NCATrainer._generate = timed_generate
    try:
        trainer = train_run(
            plan.task, config, plan.model_paths[run.organism], plan.model_init_kwargs, tokenizer,
            copy.deepcopy(plan.peft_config), plan.train_rows, clock,
        )  # fmt: skip
    finally:
        NCATrainer._generate = original
    trainer.remove_callback(clock)
    step_times = [b - a for a, b in zip(clock.ends, clock.ends[1:])][warmup:]
    return step_times, sampling[warmup:], trainer.accelerator.unwrap_model(trainer.model)


def evaluate(evaluator, model, tokenizer, fast: bool, calls: list):
    from trl_nca.core.sampling import HFBackend

    ev = copy.copy(evaluator)
    ev.group_samples = fast
    backend = TimedBackend(HFBackend(model, tokenizer, share_prompts=fast), calls)
    start = time.perf_counter()
    records = ev.run(model, tokenizer, backend=backend, progress=False)
    return time.perf_counter() - start, records


def one_call(plan, dtype: str, repeats: int):
    """The evaluation's unit of work at fr-30's shapes, both ways, interleaved: 8 items x 4 samples of the context view
    in one call of 32 rows (the fast path's call) with each prompt prefilled 4 times (today's arithmetic) and once."""
    from transformers import AutoTokenizer

    from trl_nca.core.sampling import HFBackend
    from trl_nca.eval.paired import sample_seed
    from trl_nca.recipes.compare import _load_base

    path = plan.model_paths[None]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = _load_base(path, plan.model_init_kwargs).eval()
    items = plan.evaluator.items(tokenizer)[:8]
    prompts = [it.prompt_ids_xc for it in items for _ in range(4)]
    seeds = [sample_seed(it.seed, j) for it in items for j in range(4)]
    settings = plan.evaluator.generation
    times, outs = {False: [], True: []}, {}
    for _ in range(repeats):
        for share in (False, True):
            start = time.perf_counter()
            outs[share] = HFBackend(model, tokenizer, share_prompts=share).generate(prompts, seeds, settings)
            times[share].append(time.perf_counter() - start)
            tokens = sum(len(g.token_ids) for g in outs[share])
            print(f"[{dtype}] one call, 32 rows, prefill shared={share}: {times[share][-1]:.1f} s, {tokens} tokens, "
                  f"{tokens / times[share][-1]:.1f} tokens/s", flush=True)  # fmt: skip
    same = sum(a.token_ids == b.token_ids for a, b in zip(outs[False], outs[True]))
    print(f"[{dtype}] one call: speed-up {min(times[False]) / min(times[True]):.2f}x (best of {repeats}); "
          f"{same}/32 rows identical", flush=True)  # fmt: skip


def batch_sizes(plan, dtype: str, sizes: list[int], repeats: int):
    """The base's fast evaluation at each evaluation batch size, interleaved over `repeats`: wall time, the ratio to
    the first size's, and whether the records equal the first size's (the batch size is left out of the run key)."""
    from transformers import AutoTokenizer

    from trl_nca.recipes.compare import _load_base

    path = plan.model_paths[None]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = _load_base(path, plan.model_init_kwargs).eval()
    seconds, records = defaultdict(list), {}
    for _ in range(repeats):
        for size in sizes:
            evaluator = copy.copy(plan.evaluator)
            evaluator.generation = dataclasses.replace(plan.evaluator.generation, batch_size=size)
            wall, records[size] = evaluate(evaluator, model, tokenizer, True, [])
            seconds[size].append(wall)
            print(f"[{dtype}] eval base, batch {size}: {wall:.1f} s", flush=True)
    first = sizes[0]
    print(
        f"\n| dtype | eval batch | seconds per repeat | best | best vs batch {first} | records equal batch {first}'s |"
    )
    print("| --- | ---: | --- | ---: | ---: | --- |")
    for size in sizes:
        equal = sum(a == b for a, b in zip(comparable(records[size]), comparable(records[first])))
        print(f"| {dtype} | {size} | {', '.join(f'{t:.1f}' for t in seconds[size])} | {min(seconds[size]):.1f} | "
              f"{min(seconds[first]) / min(seconds[size]):.2f}x | {equal} of {len(records[size])} items |")  # fmt: skip


def comparable(records):
    out = [r.to_dict() for r in records]
    for record in out:
        record["meta"].pop("versions", None)
    return out


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=32, help="held-out items evaluated (fr-30: 240)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--warmup", type=int, default=1, help="untimed training steps before the timed one(s)")
    parser.add_argument("--steps", type=int, default=1, help="timed training steps per method")
    parser.add_argument("--repeats", type=int, default=1, help="evaluations per path and model (interleaved)")
    parser.add_argument("--skip-steps", action="store_true", help="measure the evaluation only (of the base)")
    parser.add_argument("--one-call", action="store_true", help="only one generate call of 32 rows, both ways")
    parser.add_argument("--eval-batch-sizes", type=int, nargs="+", default=None,
                        help="only the base's fast evaluation at these batch sizes, interleaved (e.g. 32 64 128)")  # fmt: skip
    cli = parser.parse_args()

    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from trl_nca.recipes.compare import _load_base

    hf_logging.disable_progress_bar()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}", flush=True)  # fmt: skip
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in cli.dtypes:
            plan = plan_for(dtype, cli.items, cli.warmup + cli.steps, Path(tmp) / dtype)
            if cli.one_call:
                one_call(plan, dtype, cli.repeats)
                continue
            if cli.eval_batch_sizes:
                batch_sizes(plan, dtype, cli.eval_batch_sizes, cli.repeats)
                continue
            path = plan.model_paths[None]
            tokenizer = AutoTokenizer.from_pretrained(path)
            row = results[dtype] = {"calls": defaultdict(list)}
            student = None
            if not cli.skip_steps:
                for run in plan.runs:  # one seed: the OPD run, then the NCA run
                    times, sampling, model = measure_steps(plan, run, tokenizer, cli.warmup, cli.steps)
                    row[run.method.name] = (statistics.median(times), statistics.median(sampling))
                    print(f"[{dtype}] {run.method.name} step {row[run.method.name][0]:.1f} s, of which sampling "
                          f"{row[run.method.name][1]:.1f} s", flush=True)  # fmt: skip
                    if student is None:
                        student = model
                    else:
                        del model
            models = {"base": _load_base(path, plan.model_init_kwargs).eval()}
            if student is not None:
                models["student"] = student.eval()
            for name, model in models.items():
                seconds = {True: [], False: []}
                records = {}
                for _ in range(cli.repeats):
                    for fast in (False, True):
                        wall, records[fast] = evaluate(plan.evaluator, model, tokenizer, fast, row["calls"][fast])
                        seconds[fast].append(wall)
                        print(f"[{dtype}] eval {name} {'fast' if fast else 'today'}: {wall:.1f} s", flush=True)
                same = comparable(records[True]) == comparable(records[False])
                changed = sum(a != b for a, b in zip(comparable(records[True]), comparable(records[False])))
                row[f"eval {name}"] = (min(seconds[False]), min(seconds[True]), same, changed)
        if not (cli.one_call or cli.eval_batch_sizes):
            report(results, cli)


def report(results, cli):
    scale = FR30_ITEMS / cli.items
    k = 4
    print("\n## Sampling tokens/s per batch size (generated tokens / wall time of the generate call)\n")
    print("| dtype | path | batch | calls | tokens/s |\n| --- | --- | ---: | ---: | ---: |")
    for dtype, row in results.items():
        for fast, calls in row["calls"].items():
            by_batch = defaultdict(lambda: [0, 0, 0.0])
            for rows, tokens, seconds in calls:
                entry = by_batch[rows]
                entry[0] += 1
                entry[1] += tokens
                entry[2] += seconds
            for batch, (n, tokens, seconds) in sorted(by_batch.items()):
                print(f"| {dtype} | {'fast' if fast else 'today'} | {batch} | {n} | {tokens / seconds:.1f} |")
    print(
        f"\n## Phases and the fr-30 estimate ({cli.items} items evaluated, x{scale:.1f} to 240; {k} samples per view)\n"
    )
    print(
        "| dtype | OPD step (sampling) s | NCA step (sampling) s | eval base today / fast s | eval student today / "
        "fast s | records equal | fr-30 today | fr-30 fast | speed-up of the eval | of the job |"
    )
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for dtype, row in results.items():
        opd, nca = row.get("opd"), row.get("nca")
        base = row["eval base"]
        student = row.get("eval student", base)
        if opd is None or nca is None:
            print(f"| {dtype} | - | - | {base[0]:.1f} / {base[1]:.1f} | - | {base[2]} | - | - | "
                  f"{base[0] / base[1]:.2f} | - |")  # fmt: skip
            continue
        train = FR30_SEEDS * FR30_STEPS * (opd[0] + nca[0])
        today = train + scale * (base[0] + 2 * FR30_SEEDS * student[0])
        fast = train + scale * (base[1] + 2 * FR30_SEEDS * student[1])
        eval_today, eval_fast = base[0] + 2 * FR30_SEEDS * student[0], base[1] + 2 * FR30_SEEDS * student[1]
        equal = f"{base[2]} / {student[2]} ({base[3]}, {student[3]} items differ)"
        print(f"| {dtype} | {opd[0]:.1f} ({opd[1]:.1f}) | {nca[0]:.1f} ({nca[1]:.1f}) | {base[0]:.1f} / {base[1]:.1f} "
              f"| {student[0]:.1f} / {student[1]:.1f} | {equal} | {minutes(today)} | {minutes(fast)} | "
              f"{eval_today / eval_fast:.2f} | {today / fast:.2f} |")  # fmt: skip
        shares = {"training sampling": FR30_SEEDS * FR30_STEPS * (opd[1] + nca[1]),
                  "training rest": FR30_SEEDS * FR30_STEPS * (opd[0] - opd[1] + nca[0] - nca[1]),
                  "evaluation": scale * eval_today}  # fmt: skip
        print(f"  shares of fr-30 today ({dtype}): " + ", ".join(f"{k} {v / today:.0%}" for k, v in shares.items()))


if __name__ == "__main__":
    main()
