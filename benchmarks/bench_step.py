"""Seconds per step and peak memory: TRL's GKDTrainer and DistillationTrainer vs NCATrainer and
NCADistillationTrainer (nca_beta 0 and 0.5), side by side in one process.

Every configuration trains on the same prompts with the same seed; GKDTrainer gets the context inside its prompt so
its teacher reads what NCATrainer's teacher reads; TRL's DistillationTrainer gets the prompts without the context (its
student and teacher both read the plain prompt, as it is used without trl-nca). Completions are forced to exactly
`--new-tokens` tokens (`min_new_tokens`) so every configuration scores the same number of tokens.

    python benchmarks/bench_step.py --model embedded --steps 3      # SmolLM2-135M, batch 4, 32 new tokens
    python benchmarks/bench_step.py --model tiny --steps 5          # the 2-layer test model

Time is the median wall time per optimizer step (sampling included). Peak memory is measured on one extra step: the
CUDA allocator's peak above the level before it on a GPU; on a CPU the peak of the running sum of PyTorch's tensor
allocations and frees (not the Python heap) as the profiler records them, each at its own time.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
import tempfile
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback


CONTEXT_SENTENCES = [
    "You are a senior clinician who reviews medical exam questions.",
    "Read the question and every option before you decide.",
    "Recall the relevant anatomy, physiology, pharmacology or pathology.",
    "Rule out the options that contradict it and prefer the most specific correct option.",
    "Keep your reasoning short and factual, and never invent facts you are unsure of.",
    "Finish with exactly one line of the form <answer>X</answer>, where X is the letter of your chosen option.",
]


class PeakMemory:
    """Peak tensor memory above the level at `start()`: the CUDA allocator's peak on a GPU; on a CPU the peak of the
    running sum of the tensor allocations and frees the PyTorch profiler records, each at its own time."""

    def __init__(self, device: str):
        self.device = device
        self.gflop = float("nan")  # matrix-multiply work of the watched run (CPU only): the same on any machine

    def start(self):
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return
        self.profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True, with_flops=True
        )
        self.profiler.__enter__()

    def stop(self) -> float:
        """Peak in MiB above the starting level."""
        if self.device == "cuda":
            torch.cuda.synchronize()
            return (torch.cuda.max_memory_allocated() - self.base) / 2**20
        self.profiler.__exit__(None, None, None)
        # Every allocation and free of a tensor is one "[memory]" event with its own time and signed size (frees of
        # tensors allocated before the profiler started are not reported); the running sum is the live tensor memory.
        events = sorted(
            (e.start_ns(), e.nbytes()) for e in self.profiler.profiler.kineto_results.events() if e.name() == "[memory]"
        )
        level = peak = 0
        for _, delta in events:
            level += delta
            peak = max(peak, level)
        self.gflop = sum(e.flops for e in self.profiler.key_averages()) / 1e9
        return peak / 2**20


def context_view_backward(model, view, completion_mask, states=None) -> None:
    """One forward+backward of the student's context view with the NCA term the trainer computes on it (tiled over
    the vocabulary like the trainer's loss, against the view's own detached distribution): what the context view
    adds to a step, on its own. `states(model, view, mask)` gives the completion states (default: unshared)."""
    from trl_nca.core.losses import DivergenceSpec, LMHead, token_divergences
    from trl_nca.core.views import completion_states

    h = (states or completion_states)(model, view, completion_mask)
    head = LMHead.from_model(model)
    nca = token_divergences(h.detach(), None, head, head, DivergenceSpec(), h_c=h, terms=("nca",))["nca"]
    nca.sum().backward()


class StepTimer(TrainerCallback):
    """Wall time between consecutive step ends (so sampling, which happens before a step begins, is included), and
    the peak memory of one extra step measured after the timed ones (the profiler slows the step it watches)."""

    def __init__(self, warmup: int, timed: int, meter: PeakMemory):
        self.warmup, self.timed, self.meter, self.times, self.peak = warmup, timed, meter, [], 0.0
        self.last = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.last = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        now = time.perf_counter()
        step = state.global_step
        if self.warmup < step <= self.warmup + self.timed:
            self.times.append(now - self.last)
        if step == self.warmup + self.timed:
            self.meter.start()
        elif step == self.warmup + self.timed + 1:
            self.peak = self.meter.stop()
        self.last = time.perf_counter()


def load(model_name: str, device: str):
    if model_name == "tiny":
        from trl_nca.testing import make_tiny_model, make_tiny_tokenizer

        tok = make_tiny_tokenizer()
        return make_tiny_model(tok, seed=0, num_layers=4, hidden_size=128).to(device), tok
    from trl_nca.models.names import resolve_model_name_or_path

    path = resolve_model_name_or_path(model_name)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok


def datasets(tok, n: int, context_tokens: int):
    context = ""
    i = 0
    while len(tok(context)["input_ids"]) < context_tokens:
        context += CONTEXT_SENTENCES[i % len(CONTEXT_SENTENCES)] + " "
        i += 1
    prompts = [
        f"Question {k}: which organ produces insulin? (A) Liver (B) Spleen (C) Pancreas (D) Kidney" for k in range(n)
    ]
    nca = Dataset.from_dict({"prompt": prompts, "context": [context.strip()] * n})
    # TRL's DistillationTrainer: the same prompts without the context (conversational, so it applies the chat template).
    plain = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts]})
    # GKD: the context inside the prompt (as a system message), plus a placeholder answer GKD's collator requires.
    gkd = Dataset.from_dict(
        {
            "messages": [
                [
                    {"role": "system", "content": context.strip()},
                    {"role": "user", "content": p},
                    {"role": "assistant", "content": "<answer>C</answer>"},
                ]
                for p in prompts
            ]
        }
    )
    return nca, gkd, plain, len(tok(context)["input_ids"])


def common_args(out, steps, batch, new_tokens, device, checkpointing):
    return dict(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=batch,
        max_new_tokens=new_tokens,
        bf16=device == "cuda",
        use_cpu=device == "cpu",
        report_to=[],
        save_strategy="no",
        logging_steps=1000,
        gradient_checkpointing=checkpointing,
        lmbda=1.0,
        beta=1.0,
        temperature=1.0,
        learning_rate=1e-6,
        seed=0,
        max_length=None,
        disable_tqdm=True,
    )


def distillation_args(args_kwargs):
    """The same settings under DistillationConfig's names (its completion budget is `max_completion_length`; it has
    no `lmbda` or `max_length`: every step is on-policy)."""
    kwargs = {k: v for k, v in args_kwargs.items() if k not in ("max_new_tokens", "lmbda", "max_length")}
    return dict(kwargs, max_completion_length=args_kwargs["max_new_tokens"])


def run(kind, base_model, tok, data, args_kwargs, warmup, device, lora):
    from peft import LoraConfig
    from trl import DistillationConfig, DistillationTrainer
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    from trl_nca import NCAConfig, NCADistillationConfig, NCADistillationTrainer, NCATrainer

    torch.manual_seed(0)
    student = copy.deepcopy(base_model)
    peft = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]) if lora else None
    meter = PeakMemory(device)
    timer = StepTimer(warmup, args_kwargs["max_steps"] - warmup - 1, meter)
    if kind == "gkd":
        teacher = copy.deepcopy(base_model)
        trainer = GKDTrainer(
            model=student,
            teacher_model=teacher,
            args=GKDConfig(**args_kwargs),
            train_dataset=data,
            processing_class=tok,
            callbacks=[timer],
            peft_config=peft,
        )
    elif kind == "dist":
        teacher = copy.deepcopy(base_model)
        trainer = DistillationTrainer(
            model=student,
            teacher_model=teacher,
            args=DistillationConfig(**distillation_args(args_kwargs)),
            train_dataset=data,
            processing_class=tok,
            callbacks=[timer],
            peft_config=peft,
        )
    elif kind.startswith("ncad"):
        teacher = None if lora else copy.deepcopy(base_model)
        trainer = NCADistillationTrainer(
            model=student,
            teacher_model=teacher,
            args=NCADistillationConfig(**distillation_args(args_kwargs), nca_beta=0.5 if kind == "ncad05" else 0.0),
            train_dataset=data,
            processing_class=tok,
            callbacks=[timer],
            peft_config=peft,
        )
    else:  # nca0; nca05 (nca_sequential_views's default), nca05-seq (in sequence), nca05-joint (both views at once),
        # nca05-onefwd (both views as one forward of 2 x batch rows, nca_joint_forward: what reentrant checkpointing
        # under DeepSpeed or DDP runs; DeepSpeed runs both views before one backward, so it is set against nca05-joint)
        teacher = None if lora else copy.deepcopy(base_model)
        sequential = {"nca05-seq": True, "nca05-joint": False, "nca05-onefwd": False}.get(kind)
        one_forward = True if kind == "nca05-onefwd" else None
        nca = dict(
            nca_beta=0.0 if kind == "nca0" else 0.5, nca_sequential_views=sequential, nca_joint_forward=one_forward
        )
        trainer = NCATrainer(
            model=student,
            teacher_model=teacher,
            args=NCAConfig(**args_kwargs, **nca),
            train_dataset=data,
            processing_class=tok,
            callbacks=[timer],
            peft_config=peft,
        )
    # Same sampling work for every trainer: exactly max_new_tokens tokens, with the KV cache (GKDTrainer turns the cache
    # off under gradient checkpointing; NCATrainer keeps it, so GKD gets it here too for a like-for-like comparison).
    for key, value in (("min_new_tokens", args_kwargs["max_new_tokens"]), ("use_cache", True)):
        setattr(trainer.generation_config, key, value)
        trainer.generation_kwargs[key] = value
    trainer.train()
    result = statistics.median(timer.times), timer.peak, meter.gflop
    del trainer, student, teacher
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def manual_view_step(base_model, tok, data, batch, new_tokens, device, lora, view, warmup, steps, checkpointing):
    """One forward+backward of a single student view on fixed samples (`view`: 'x' or 'c'), timed like a step: the
    NCA term's tiled loss on the context view (`context_view_backward`), full-logit cross-entropy on the no-context
    view (the student-only reference)."""
    from peft import LoraConfig, get_peft_model

    from trl_nca.core.losses import LMHead
    from trl_nca.core.views import ContextSpec, build_view, completion_states
    from trl_nca.trainers.data import Limits, NCACollator, prepare_dataset

    model = copy.deepcopy(base_model)
    if lora:
        model = get_peft_model(
            model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        )
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable()
        if lora:
            model.enable_input_require_grads()
    ds = prepare_dataset(data, tok, ContextSpec(), Limits(max_new_tokens=new_tokens), "bench")
    b = NCACollator(tok.pad_token_id)([ds[i] for i in range(batch)])
    b = {k: v.to(device) for k, v in b.items()}
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, len(tok), (batch, new_tokens), generator=g).to(device)
    mask = torch.ones_like(ids)
    key = ("prompts", "prompt_attention_mask") if view == "x" else ("context_prompts", "context_prompt_attention_mask")
    meter, times = PeakMemory(device), []
    for step in range(warmup + steps + 1):
        if step == warmup + steps:
            meter.start()
        t0 = time.perf_counter()
        v = build_view(b[key[0]], b[key[1]], ids, mask)
        if view == "c":
            context_view_backward(model, v, mask)
        else:
            h = completion_states(model, v, mask)
            logits = LMHead.from_model(model).logits(h)
            torch.nn.functional.cross_entropy(logits, ids[mask.bool()]).backward()
        model.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        if warmup <= step < warmup + steps:
            times.append(time.perf_counter() - t0)
    peak = meter.stop()
    del model
    gc.collect()
    return statistics.median(times), peak, meter.gflop


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded", help="'embedded' (SmolLM2-135M), 'tiny', or a path")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--context-tokens", type=int, default=200)
    parser.add_argument("--steps", type=int, default=3, help="measured steps per configuration")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--only", nargs="*", help="subset of configurations to run")
    parser.add_argument(
        "--no-checkpointing", action="store_true", help="disable gradient checkpointing (on by default, as in TRL)"
    )
    cli = parser.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base, tok = load(cli.model, device)
    n = cli.batch * (cli.steps + cli.warmup + 1)
    nca_data, gkd_data, plain_data, ctx_len = datasets(tok, n, cli.context_tokens)
    print(
        f"model={cli.model} device={device} batch={cli.batch} new_tokens={cli.new_tokens} context={ctx_len} tokens "
        f"gradient_checkpointing={not cli.no_checkpointing} torch_threads={torch.get_num_threads()}"
    )
    rows = {}
    with tempfile.TemporaryDirectory() as out:
        kw = common_args(out, cli.steps + cli.warmup + 1, cli.batch, cli.new_tokens, device, not cli.no_checkpointing)
        configs = [
            ("gkd/separate", "gkd", gkd_data, False),
            ("dist/separate", "dist", plain_data, False),
            ("nca0/separate", "nca0", nca_data, False),
            ("ncad0/separate", "ncad0", nca_data, False),
            ("ncad05/separate", "ncad05", nca_data, False),
            ("nca05/separate", "nca05", nca_data, False),
            ("nca05-seq/separate", "nca05-seq", nca_data, False),
            ("nca05-joint/separate", "nca05-joint", nca_data, False),
            ("nca05-onefwd/separate", "nca05-onefwd", nca_data, False),
            ("nca0/lora-self", "nca0", nca_data, True),
            ("nca05/lora-self", "nca05", nca_data, True),
            ("nca05-seq/lora-self", "nca05-seq", nca_data, True),
            ("nca05-joint/lora-self", "nca05-joint", nca_data, True),
            ("nca05-onefwd/lora-self", "nca05-onefwd", nca_data, True),
            ("ncad0/lora-self", "ncad0", nca_data, True),
        ]
        for name, kind, data, lora in configs:
            if cli.only and name not in cli.only:
                continue
            rows[name] = run(kind, base, tok, data, kw, cli.warmup, device, lora)
            print(
                f"{name:22s} {rows[name][0]:8.3f} s/step  peak {rows[name][1]:9.1f} MiB  {rows[name][2]:8.1f} GFLOP",
                flush=True,
            )
        for name, view, lora in (("view-c/full", "c", False), ("view-c/lora", "c", True), ("view-x/lora", "x", True)):
            rows[name] = manual_view_step(
                base,
                tok,
                nca_data,
                cli.batch,
                cli.new_tokens,
                device,
                lora,
                view,
                cli.warmup,
                cli.steps,
                not cli.no_checkpointing,
            )
            print(
                f"{name:22s} {rows[name][0]:8.3f} s/step  peak {rows[name][1]:9.1f} MiB  {rows[name][2]:8.1f} GFLOP",
                flush=True,
            )

    def ratio(a, b, i):
        return rows[a][i] / rows[b][i] if a in rows and b in rows and rows[b][i] > 0 else float("nan")

    print("\nratios (target)")
    print(f"time  nca0/gkd                         {ratio('nca0/separate', 'gkd/separate', 0):6.2f}  (<= 1.00)")
    print(f"mem   nca0/gkd                         {ratio('nca0/separate', 'gkd/separate', 1):6.2f}  (<= 0.70)")
    print(f"time  nca0/dist                        {ratio('nca0/separate', 'dist/separate', 0):6.2f}  (<= 1.00)")
    print(f"mem   nca0/dist                        {ratio('nca0/separate', 'dist/separate', 1):6.2f}  (<= 1.00)")
    print(f"time  ncad0/dist                       {ratio('ncad0/separate', 'dist/separate', 0):6.2f}  (<= 1.00)")
    print(f"mem   ncad0/dist                       {ratio('ncad0/separate', 'dist/separate', 1):6.2f}  (<= 1.00)")
    print(f"time  ncad0/nca0                       {ratio('ncad0/separate', 'nca0/separate', 0):6.2f}")
    print(f"mem   ncad0/nca0                       {ratio('ncad0/separate', 'nca0/separate', 1):6.2f}")
    for tuning, view in (("separate", "view-c/full"), ("lora-self", "view-c/lora")):
        opd, nca, joint = f"nca0/{tuning}", f"nca05-seq/{tuning}", f"nca05-joint/{tuning}"
        if not all(k in rows for k in (opd, nca, joint, view)):
            continue
        larger = max(rows[opd][1], rows[view][1])
        print(
            f"mem   nca05/max(nca0, view-c), {tuning:9s}  in sequence {rows[nca][1] / larger:6.2f}  "
            f"both at once {rows[joint][1] / larger:6.2f}  (<= 1.15)"
        )
        for i, what in ((0, "time "), (2, "GFLOP")):
            both = rows[opd][i] + rows[view][i]
            print(
                f"{what} nca05/(nca0 + view-c), {tuning:9s}    in sequence {rows[nca][i] / both:6.2f}  "
                f"both at once {rows[joint][i] / both:6.2f}  (<= 1.10)"
            )
            print(f"{what} in sequence / both at once, {tuning:9s} {rows[nca][i] / rows[joint][i]:6.2f}  (<= 1.05)")
    print(f"mem   nca0 LoRA self / student-only    {ratio('nca0/lora-self', 'view-x/lora', 1):6.2f}  (<= 1.15)")
    # The cost of the joint forward (reentrant checkpointing under DeepSpeed or DDP) against two forwards before one
    # backward (non-reentrant, the trainers' default there): the no-context rows are padded to the context width.
    for tuning in ("separate", "lora-self"):
        one, two = f"nca05-onefwd/{tuning}", f"nca05-joint/{tuning}"
        print(
            f"time  one forward / two forwards, {tuning:9s}  {ratio(one, two, 0):6.2f}   "
            f"mem {ratio(one, two, 1):6.2f}   GFLOP {ratio(one, two, 2):6.2f}"
        )


if __name__ == "__main__":
    main()
