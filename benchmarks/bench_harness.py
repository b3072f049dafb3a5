"""The paired evaluation of an lm-eval task against lm-eval's own two runs of it, side by side in one process.

    A (paired)  `trl_nca.eval.harness.evaluate_harness` on the shipped task `island_facts_mc` with each document's
                fact sheet as its context, in the user turn: the checks (every prompt rendered and measured against the
                model's positions), both views, records.jsonl, then `write_report` (summary, report, 1000 bootstrap
                resamples; no figures), i.e. what `trl-nca eval --tasks` does once its model is loaded;
    B (lm-eval) `lm_eval.simple_evaluate` twice, as a user would run it by hand: the task as shipped, then a copy
                whose `doc_to_text` puts the `context` field before the question (the same prompts as A's second view),
                lm-eval's defaults otherwise (log_samples, stderr).

Both sides run on one loaded model wrapped once in `HFLM` (batch size `--batch-size`, chat template applied) and one
`TaskManager` built before timing (its index of lm-eval's own tasks is left out of both). After one untimed pair, the
repeats interleave A B, B A, A B, ... so a shared, noisy machine slows both alike; the ratio printed is
median(A) / median(B), with each pair's own ratio next to it.

    python benchmarks/bench_harness.py                          # embedded SmolLM2-135M-Instruct, 8 documents, 3 pairs
    python benchmarks/bench_harness.py --limit 16 --repeats 6
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--limit", type=int, default=8, help="Documents of island_facts_mc (default: 8 of 96).")
    parser.add_argument("--repeats", type=int, default=3, help="A/B pairs, interleaved (default: 3).")
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # lm-eval's per-run notes

    import lm_eval
    import torch

    from trl_nca.core.views import ContextSpec
    from trl_nca.eval.harness import HarnessOptions, evaluate_harness, hf_lm
    from trl_nca.eval.harness_index import bundled_tasks_folder, task_manager
    from trl_nca.eval.loading import load_model, load_tokenizer
    from trl_nca.eval.report import write_report
    from trl_nca.tasks.harness_data import HARNESS_TASK

    torch.set_num_threads(int(torch.get_num_threads()))
    model, tokenizer = load_model(args.model, dtype="float32", device="cpu"), load_tokenizer(args.model)
    options = HarnessOptions(batch_size=args.batch_size, limit=args.limit)
    lm = hf_lm(model, tokenizer, options)
    context = ContextSpec(column="context", placement="user")

    by_hand = Path(tempfile.mkdtemp(prefix="bench_harness_tasks_"))
    shipped = (bundled_tasks_folder() / f"{HARNESS_TASK}.yaml").read_text()
    (by_hand / "ctx.yaml").write_text(
        shipped.replace(f"task: {HARNESS_TASK}", f"task: {HARNESS_TASK}_ctx")
        .replace("utils.load_docs", "bench_utils.load_docs")
        .replace('doc_to_text: "{{question}}', 'doc_to_text: "{{context}}\\n\\n{{question}}')
    )
    (by_hand / "bench_utils.py").write_text(
        (bundled_tasks_folder() / "utils.py")
        .read_text()
        .replace(
            'Path(__file__).with_name("island_facts_mc.jsonl")',
            f"Path({str(bundled_tasks_folder() / 'island_facts_mc.jsonl')!r})",
        )
    )
    manager = task_manager(str(by_hand), include_defaults=False)

    def paired() -> dict:
        with tempfile.TemporaryDirectory() as out:
            runs = evaluate_harness(
                model,
                tokenizer,
                [HARNESS_TASK],
                context=context,
                include_path=str(by_hand),
                options=options,
                output_dir=out,
                model_name="embedded",
                lm=lm,
            )
            summary = write_report(runs, out, n_bootstrap=1000, plots=False)
        return summary["models"][0]["metrics"]

    def by_lm_eval() -> tuple[float, float]:
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
        return accs[0], accs[1]

    times: dict[str, list[float]] = {"A": [], "B": []}
    print(
        f"model {args.model}, task {HARNESS_TASK}, {args.limit} documents, batch {args.batch_size}, "
        f"{torch.get_num_threads()} torch threads"
    )
    paired(), by_lm_eval()  # one untimed pair: first-call costs (kernels, caches) fall on neither side
    for repeat in range(args.repeats):
        order = (("A", paired), ("B", by_lm_eval))
        for side, run in order if repeat % 2 == 0 else order[::-1]:  # A B, B A, A B, ...: drifts cancel
            start = time.perf_counter()
            result = run()
            times[side].append(time.perf_counter() - start)
            if side == "A":
                accs = (result["acc_x"], result["acc_xc"])
                note = (
                    f"Acc_x {accs[0]:.4f} Acc_xc {accs[1]:.4f} harm {result['harm_count']} help {result['help_count']}"
                )
            else:
                note = f"lm-eval acc without {result[0]:.4f}, with {result[1]:.4f}"
            print(f"pair {repeat + 1} {side}: {times[side][-1]:7.2f} s  {note}", flush=True)
    pairs = [a / b for a, b in zip(times["A"], times["B"], strict=True)]
    print(
        f"median paired {statistics.median(times['A']):.2f} s, median lm-eval x2 {statistics.median(times['B']):.2f} s"
    )
    print(
        f"ratio (paired)/(lm-eval's two runs) = {statistics.median(times['A']) / statistics.median(times['B']):.3f} "
        f"(per pair: {', '.join(f'{r:.3f}' for r in pairs)}; target <= 1.05)"
    )
    shutil.rmtree(by_hand)


if __name__ == "__main__":
    main()
