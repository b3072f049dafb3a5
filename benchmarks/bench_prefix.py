"""Shared-prefix reuse (`NCAConfig.share_prefix`): time and peak memory with and without it, side by side in one run.

For each shape, on the same fixed batch (LoRA r=16 on q/k/v/o, the teacher being the student with its adapter
disabled, as in the quickstart), with sharing off and on:

    teacher        the teacher's forward over the context view (no gradient)
    view-c         one forward+backward of the student's context view (its NCA term, tiled like the trainer's loss)
    nca0 step      NCATrainer.training_step with nca_beta=0 (plain OPD: teacher + no-context view + loss + backward)
    nca05 step     NCATrainer.training_step with nca_beta=0.5, the views in sequence (the default with LoRA)
    nca05 joint    the same with both views' graphs alive until one backward (nca_sequential_views=False)

Completions are fixed random tokens (`--new-tokens` per row), so sampling, which sharing does not touch, is left out.
The teacher keeps its prefix cache across steps (its weights do not change), so after the warm-up step its shared
forward runs the suffixes only; `--no-persist` measures it recording the prefix every time.

    python benchmarks/bench_prefix.py --model embedded                   # quickstart and game-like shapes
    python benchmarks/bench_prefix.py --model tiny --steps 3             # the 4-layer test model

Shapes: `quickstart` (batch 4, a system context of about 200 tokens, 32 new tokens, as examples/configs/quickstart.yaml)
and `game` (batch 8, the context in the user turn, at least 4x longer than prompt plus completion). Time is the median
wall time over `--steps` runs after `--warmup` (and one untimed training step per trainer before any); peak memory is
measured on one more run (see bench_step.PeakMemory).
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
import sys
import tempfile
import time

import torch
from datasets import Dataset


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_step import CONTEXT_SENTENCES, PeakMemory, context_view_backward, load  # noqa: E402


GAME_RULES = [
    "Experience from earlier episodes; it may be incomplete.",
    "The player P moves one cell per action: [up] [down] [left] [right].",
    "Falling into a hole H ends the episode; reaching the goal G wins it.",
    "Plan the whole path before the first move, and avoid cells next to two holes when a safer path exists.",
    "An invalid move costs a turn; two invalid moves in a row end the game.",
]


def _text(sentences, tok, tokens):
    text, i = "", 0
    while len(tok(text)["input_ids"]) < tokens:
        text += sentences[i % len(sentences)] + " "
        i += 1
    return text.strip()


def shape_data(tok, shape: str, batch: int, context_tokens: int):
    """(dataset, context placement) of a shape; the context is the same for every row."""
    if shape == "quickstart":
        context = _text(CONTEXT_SENTENCES, tok, context_tokens)
        prompts = [
            f"Question {k}: which organ produces insulin? (A) Liver (B) Spleen (C) Pancreas (D) Kidney"
            for k in range(batch)
        ]
        return Dataset.from_dict({"prompt": prompts, "context": [context] * batch}), "system"
    context = _text(GAME_RULES, tok, context_tokens)
    prompts = [f"Board {k}:\n P _ H\n _ _ _\n H _ G\nYour move?" for k in range(batch)]
    return Dataset.from_dict({"prompt": prompts, "context": [context] * batch}), "user"


def build(base, tok, data, placement, nca_beta, new_tokens, checkpointing, out):
    from peft import LoraConfig

    from trl_nca import NCAConfig, NCATrainer

    args = NCAConfig(
        output_dir=out,
        max_steps=1,
        per_device_train_batch_size=len(data),
        max_new_tokens=new_tokens,
        use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available(),
        report_to=[],
        save_strategy="no",
        gradient_checkpointing=False,
        lmbda=1.0,
        nca_beta=nca_beta,
        context_placement=placement,
        max_length=None,
        disable_tqdm=True,
    )
    peft = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    trainer = NCATrainer(
        model=copy.deepcopy(base), args=args, train_dataset=data, processing_class=tok, peft_config=peft
    )
    if checkpointing:  # as Trainer.train would turn it on (transformers' default: non-reentrant)
        trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trainer.model.train()
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(data))])
    g = torch.Generator().manual_seed(0)
    batch["completion_ids"] = torch.randint(0, len(tok), (len(data), new_tokens), generator=g)
    batch["completion_mask"] = torch.ones_like(batch["completion_ids"])
    return trainer, {**trainer._prepare_inputs(batch), "on_policy": True}  # completions ready, as sampled


def measure(fn, warmup, steps, device):
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    meter = PeakMemory(device)
    gc.collect()
    meter.start()
    fn()
    peak = meter.stop()
    return statistics.median(times), peak, meter.gflop


def run_shape(base, tok, shape, cli, device):
    from trl_nca.core.views import render_prompt_ids

    batch_size = cli.batch or (4 if shape == "quickstart" else 8)
    context_tokens = cli.context_tokens or (200 if shape == "quickstart" else 0)
    if shape == "game" and not cli.context_tokens:  # at least 4x the no-context prompt plus the completion
        data, _ = shape_data(tok, shape, batch_size, 1)
        prompt = max(len(render_prompt_ids(tok, [{"role": "user", "content": p}])) for p in data["prompt"])
        context_tokens = 4 * (prompt + cli.new_tokens) + 8
    data, placement = shape_data(tok, shape, batch_size, context_tokens)
    with tempfile.TemporaryDirectory() as out:
        rows, lengths, shared = {}, None, 0
        for nca_beta in (0.5, 0.0):
            trainer, batch = build(base, tok, data, placement, nca_beta, cli.new_tokens, cli.checkpointing, out)
            lengths, shared = measure_trainer(trainer, batch, shape, nca_beta, cli, device, rows) or (lengths, shared)
            del trainer, batch
            gc.collect()
    return rows, batch_size, context_tokens, lengths, shared


def measure_trainer(trainer, inputs, shape, nca_beta, cli, device, rows):
    """Time the passes of one trainer with sharing off, then on, into `rows`; with nca_beta > 0 also return the
    longest no-context prompt and context view, and the teacher's shared prefix length."""
    from trl_nca.core.losses import LMHead
    from trl_nca.core.views import build_view

    model, sharing = trainer.model, trainer.nca.prefix_sharing
    batch = trainer.nca_batch(inputs)
    mask = batch.completion_mask
    view_c = build_view(batch.context_prompts, batch.context_prompt_attention_mask, batch.completion_ids, mask)
    items = mask.sum()
    head = LMHead.from_model(model)

    def teacher():
        with torch.no_grad():
            trainer.nca.teacher_states(view_c, mask, None, head)

    def context_view():
        states = lambda m, v, k: sharing.completion_states(m, v, k, "student's context view")  # noqa: E731
        context_view_backward(model, view_c, mask, states)
        model.zero_grad(set_to_none=True)

    def step(sequential=True):
        def run():
            trainer.nca.sequential = sequential
            trainer.training_step(model, inputs, items)
            model.zero_grad(set_to_none=True)

        return run

    jobs = [("nca0 step", step())]
    if nca_beta:
        jobs = [("nca05 step", step()), ("nca05 joint", step(False)), ("teacher", teacher), ("view-c", context_view)]
    step()  # one untimed step first: lazy initialisation is charged to no measurement
    for share in (False, True):
        sharing.enabled = share
        sharing._kept = _NoKeep() if cli.no_persist else {}
        for name, fn in jobs:
            rows[(name, share)] = measure(fn, cli.warmup, cli.steps, device)
            t, m, w = rows[(name, share)]
            print(
                f"  {shape:10s} {name:11s} share={share!s:5s} {t:8.3f} s  peak {m:9.1f} MiB  {w:8.1f} GFLOP", flush=True
            )
    if not nca_beta:
        return None
    lengths = (int(batch.prompt_attention_mask.sum(1).max()), int(view_c.attention_mask.sum(1).max()))
    return lengths, sharing.last_shared.get("teacher", 0)


class _NoKeep(dict):
    def __setitem__(self, key, value):
        pass


def report(shape, rows, batch_size, context_tokens, lengths, shared):
    def t(name, share):
        return rows[(name, share)][0]

    def m(name, share):
        return rows[(name, share)][1]

    def w(name, share):
        return rows[(name, share)][2]

    print(
        f"\n{shape}: batch {batch_size}, no-context prompt <= {lengths[0]} tokens, context view <= {lengths[1]} tokens "
        f"(context {context_tokens} tokens), shared prefix of the context view {shared} tokens"
    )
    print(
        f"| {'pass':12s} | s unshared | s shared | time ratio | MiB unshared | MiB shared | memory ratio | "
        "GFLOP unshared | GFLOP shared |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in ("teacher", "view-c", "nca0 step", "nca05 step", "nca05 joint"):
        print(
            f"| {name:12s} | {t(name, False):.3f} | {t(name, True):.3f} | {t(name, True) / t(name, False):.2f} | "
            f"{m(name, False):.1f} | {m(name, True):.1f} | {m(name, True) / max(m(name, False), 1e-9):.2f} | "
            f"{w(name, False):.1f} | {w(name, True):.1f} |"
        )
    both = (t("teacher", True) + t("view-c", True)) / (t("teacher", False) + t("view-c", False))
    print(f"teacher + context view, shared / unshared time: {both:.2f} (target at the game shape <= 0.50)")
    for share in (False, True):
        for step in ("nca05 step", "nca05 joint"):
            views = "in sequence " if step == "nca05 step" else "both at once"
            ref = max(m("nca0 step", share), m("view-c", share))
            extra = t(step, share) / (t("nca0 step", share) + t("view-c", share))
            work = w(step, share) / (w("nca0 step", share) + w("view-c", share))
            print(
                f"share={share!s:5s} {views}: NCA peak / max(OPD step, context-view fwd+bwd) {m(step, share) / ref:.2f} "
                f"(target <= 1.15); NCA / (OPD step + context-view fwd+bwd): time {extra:.2f}, GFLOP {work:.2f} "
                "(target <= 1.10)"
            )
        ratio, work = t("nca05 step", share) / t("nca05 joint", share), w("nca05 step", share) / w("nca05 joint", share)
        print(f"share={share!s:5s} in sequence / both at once: time {ratio:.2f}, GFLOP {work:.2f} (target <= 1.05)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded", help="'embedded' (SmolLM2-135M), 'tiny', or a path")
    parser.add_argument("--shapes", nargs="*", default=["quickstart", "game"])
    parser.add_argument("--batch", type=int, default=None, help="rows (default: 4 quickstart, 8 game)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--context-tokens", type=int, default=None, help="default: 200 quickstart, 4x game")
    parser.add_argument("--steps", type=int, default=2, help="timed runs per measurement")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--checkpointing", action="store_true", help="non-reentrant gradient checkpointing")
    parser.add_argument("--no-persist", action="store_true", help="the teacher records its prefix every time")
    cli = parser.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base, tok = load(cli.model, device)
    print(
        f"model={cli.model} device={device} new_tokens={cli.new_tokens} checkpointing={cli.checkpointing} "
        f"persist={not cli.no_persist} torch_threads={torch.get_num_threads()}"
    )
    results = [(shape, *run_shape(base, tok, shape, cli, device)) for shape in cli.shapes]
    for shape, *rest in results:
        report(shape, *rest)


if __name__ == "__main__":
    main()
