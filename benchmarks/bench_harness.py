"""The paired evaluation of an lm-eval task against lm-eval's own two runs of it, side by side.

Two modes, each timing A (the paired evaluation) against B (lm-eval run twice by hand: the task as shipped, then a copy
whose `doc_to_text` puts each document's `context` field before its question, the same prompts as A's second view) on
the shipped task `island_facts_mc`, embedded SmolLM2-135M-Instruct, fp32, the chat template applied:

    in-process (default): one process, one loaded model wrapped once in `HFLM` and one `TaskManager` built before
        timing (its index of lm-eval's own tasks is left out of both). A = `trl_nca.eval.harness.evaluate_harness`
        with each document's fact sheet as its context in the user turn (the checks, both views, records.jsonl) plus
        `write_report` (1000 bootstrap resamples, no figures): what `trl-nca eval --tasks` does once its model is
        loaded. B = `lm_eval.simple_evaluate` twice.
    --cli: what a user types, each a process of its own that loads the model. A = one `trl-nca eval --tasks` (model
        load, checks, both views, report without figures); B = two `lm-eval run --model hf` processes.

After one untimed pair, the repeats interleave A B, B A, A B, ... so a shared, noisy machine slows both alike; the
ratio printed is median(A) / median(B), with each pair's own ratio and the load average before and after.

    python benchmarks/bench_harness.py                          # in-process, 8 documents, 3 pairs
    python benchmarks/bench_harness.py --limit 16 --repeats 6
    python benchmarks/bench_harness.py --cli --limit 16 --repeats 3
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def by_hand_tasks(bundled: Path, task: str) -> Path:
    """A folder with the task a user writes to run lm-eval with each document's context: `<task>_ctx`."""
    folder = Path(tempfile.mkdtemp(prefix="bench_harness_tasks_"))
    shipped = (bundled / f"{task}.yaml").read_text()
    (folder / "ctx.yaml").write_text(
        shipped.replace(f"task: {task}", f"task: {task}_ctx")
        .replace("utils.load_docs", "bench_utils.load_docs")
        .replace('doc_to_text: "{{question}}', 'doc_to_text: "{{context}}\\n\\n{{question}}')
    )
    (folder / "bench_utils.py").write_text(
        (bundled / "utils.py")
        .read_text()
        .replace('Path(__file__).with_name("island_facts_mc.jsonl")', f"Path({str(bundled / f'{task}.jsonl')!r})")
    )
    return folder


def in_process_sides(args, by_hand: Path) -> dict[str, Callable[[], str]]:
    """A and B in this process, on one loaded model."""
    import lm_eval
    import torch

    from trl_nca.core.views import ContextSpec
    from trl_nca.eval.harness import HarnessOptions, evaluate_harness, hf_lm
    from trl_nca.eval.harness_index import task_manager
    from trl_nca.eval.loading import load_model, load_tokenizer
    from trl_nca.eval.report import write_report
    from trl_nca.tasks.harness_data import HARNESS_TASK

    logging.disable(logging.WARNING)  # lm-eval's per-run notes
    torch.set_num_threads(int(torch.get_num_threads()))
    model, tokenizer = load_model(args.model, dtype="float32", device="cpu"), load_tokenizer(args.model)
    options = HarnessOptions(batch_size=args.batch_size, limit=args.limit)
    lm = hf_lm(model, tokenizer, options)
    manager = task_manager(str(by_hand), include_defaults=False)

    def paired() -> str:
        with tempfile.TemporaryDirectory() as out:
            runs = evaluate_harness(
                model,
                tokenizer,
                [HARNESS_TASK],
                context=ContextSpec(column="context", placement="user"),
                include_path=str(by_hand),
                options=options,
                output_dir=out,
                model_name="embedded",
                lm=lm,
            )
            m = write_report(runs, out, n_bootstrap=1000, plots=False)["models"][0]["metrics"]
        return f"Acc_x {m['acc_x']:.4f} Acc_xc {m['acc_xc']:.4f} harm {m['harm_count']} help {m['help_count']}"

    def by_lm_eval() -> str:
        accs = []
        for task in (HARNESS_TASK, f"{HARNESS_TASK}_ctx"):
            results = lm_eval.simple_evaluate(
                model=lm,
                tasks=[task],
                task_manager=manager,
                apply_chat_template=True,
                limit=args.limit,
                random_seed=0,
                numpy_random_seed=0,
                torch_random_seed=0,
            )
            accs.append(results["results"][task]["acc,none"])
        return f"lm-eval acc without {accs[0]:.4f}, with {accs[1]:.4f}"

    return {"A": paired, "B": by_lm_eval}


def cli_sides(args, by_hand: Path) -> dict[str, Callable[[], str]]:
    """A and B as processes of their own, as a user runs them."""
    from trl_nca.eval.harness_index import bundled_tasks_folder
    from trl_nca.eval.loading import resolve_model_path
    from trl_nca.tasks.harness_data import HARNESS_TASK

    path = resolve_model_path(args.model, "--model")
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}

    def run(command: list[str]) -> None:
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr[-2000:]}")

    def paired() -> str:
        with tempfile.TemporaryDirectory() as out:
            run(
                [sys.executable, "-m", "trl_nca.cli", "eval", "--model", args.model, "--tasks", HARNESS_TASK]
                + ["--context-column", "context", "--placement", "user", "--limit", str(args.limit), "--dtype"]
                + [
                    "float32",
                    "--device",
                    "cpu",
                    "--batch-size",
                    str(args.batch_size),
                    "--no-plots",
                    "--output-dir",
                    out,
                ]
            )
        return "trl-nca eval --tasks"

    def by_lm_eval() -> str:
        for task, include in ((HARNESS_TASK, bundled_tasks_folder()), (f"{HARNESS_TASK}_ctx", by_hand)):
            run(
                ["lm-eval", "run", "--model", "hf", "--model_args", f"pretrained={path},dtype=float32", "--tasks"]
                + [task, "--include_path", str(include), "--apply_chat_template", "--limit", str(args.limit)]
                + ["--device", "cpu", "--batch_size", str(args.batch_size)]
            )
        return "two lm-eval run processes"

    return {"A": paired, "B": by_lm_eval}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--limit", type=int, default=8, help="Documents of island_facts_mc (default: 8 of 96).")
    parser.add_argument("--repeats", type=int, default=3, help="A/B pairs, interleaved (default: 3).")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--cli", action="store_true", help="Time the command lines, each a process of its own.")
    args = parser.parse_args()

    from trl_nca.eval.harness_index import bundled_tasks_folder
    from trl_nca.tasks.harness_data import HARNESS_TASK

    by_hand = by_hand_tasks(bundled_tasks_folder(), HARNESS_TASK)
    sides = (cli_sides if args.cli else in_process_sides)(args, by_hand)
    print(
        f"{'command lines' if args.cli else 'in-process'}: model {args.model}, task {HARNESS_TASK}, {args.limit} "
        f"documents, batch {args.batch_size}; load average {os.getloadavg()[0]:.2f}"
    )
    times: dict[str, list[float]] = {"A": [], "B": []}
    sides["A"](), sides["B"]()  # one untimed pair: first-call costs (kernels, caches) fall on neither side
    for repeat in range(args.repeats):
        order = ("A", "B") if repeat % 2 == 0 else ("B", "A")  # A B, B A, A B, ...: drifts cancel
        for side in order:
            start = time.perf_counter()
            note = sides[side]()
            times[side].append(time.perf_counter() - start)
            print(f"pair {repeat + 1} {side}: {times[side][-1]:7.2f} s  {note}", flush=True)
    pairs = [a / b for a, b in zip(times["A"], times["B"], strict=True)]
    print(
        f"median paired {statistics.median(times['A']):.2f} s, median lm-eval x2 {statistics.median(times['B']):.2f} s"
    )
    print(
        f"ratio (paired)/(lm-eval's two runs) = {statistics.median(times['A']) / statistics.median(times['B']):.3f} "
        f"(per pair: {', '.join(f'{r:.3f}' for r in pairs)}); load average at the end {os.getloadavg()[0]:.2f}"
    )
    shutil.rmtree(by_hand)


if __name__ == "__main__":
    main()
