"""Tiny, fully offline models for tests, benchmarks and smoke runs, and what the tests share.

Builds a byte-level BPE tokenizer with a ChatML template and a 2-layer Llama from scratch, so nothing is fetched from
the Hub. Everything is deterministic for a given seed. The tests' common data (`CONTEXT`, `prompt_dataset`,
`ragged_answers`), run settings (`run_args` with the presets `CPU`, `SHORT_RUN`, ...) and named tolerances
(`FLOAT64`, `FLOAT32`, `KL32`, `STORED32`) are here too; their fixtures are in tests/conftest.py. The loss tests'
one full-logit reference is `full_logprobs` with `token_kl`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import socket
import sys
from pathlib import Path


CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# The privileged context of the tests' datasets (a system prompt to distil).
CONTEXT = "You are a careful medical expert. Answer with the letter inside <answer></answer> tags."
# The prompts of the tests' prompt-only datasets, in turn.
QUESTIONS = ["Which answer? (A) yes (B) no", "Is this statement hateful?", "Push the box.", "Frozen lake: up"]

_CORPUS = [
    CONTEXT,
    "Which of the following is the answer? (A) yes (B) no (C) maybe (D) unknown",
    "The player moves up, down, left or right on the frozen lake and must avoid the holes.",
    "Push the box onto the target. Walls block movement. [up] [down] [left] [right]",
    "Is this statement hateful? Answer <answer>yes</answer> or <answer>no</answer>.",
    "system user assistant question context experience hint rule strategy answer",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?()[]{}<>/\\'\"-_=+*#@%&|~`^$",
]
SPECIAL_TOKENS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def make_tiny_tokenizer(vocab_size: int = 320):
    """A byte-level BPE tokenizer with ChatML specials (pad, bos/eos, im_start, im_end) and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.padding_side = "left"
    return fast


def permuted_tokenizer(swap=(100, 101)):
    """The tiny tokenizer with two ordinary tokens' ids swapped: same size, different token -> id map."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    base = make_tiny_tokenizer()
    data = json.loads(base.backend_tokenizer.to_str())
    vocab = data["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    a, b = by_id[swap[0]], by_id[swap[1]]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)),
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
    )
    fast.chat_template = base.chat_template
    assert len(fast) == len(base) and fast.get_vocab() != base.get_vocab()
    return fast


def make_tiny_model(
    tokenizer,
    seed: int = 0,
    num_layers: int = 2,
    hidden_size: int = 64,
    tie_word_embeddings: bool = False,
    vocab_size: int | None = None,
    architecture: str = "llama",
):
    """A randomly initialised Llama small enough to train on one CPU core in milliseconds per step.

    `vocab_size` sets the rows of the embedding and output layers (default: `len(tokenizer)`); more rows than the
    tokenizer has mimic the padded output layers of real models (Qwen2.5-7B has 152064 rows for 151665 tokens).
    `architecture="qwen2"` builds a Qwen2 of the same sizes instead (biases on q, k and v).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if architecture not in classes:
        raise ValueError(f"architecture must be one of {sorted(classes)}, got {architecture!r}.")
    config_class, model_class = classes[architecture]
    config = config_class(
        vocab_size=len(tokenizer) if vocab_size is None else vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=tie_word_embeddings,
    )
    torch.manual_seed(seed)
    model = model_class(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def float64_model(model):
    """`model` in float64 end to end, in place: `.double()`, and every RMSNorm replaced by `torch.nn.RMSNorm` with the
    same weight and epsilon (the same formula). Transformers' Llama and Qwen2 norms compute in float32 even inside a
    float64 model, so a gradient summed over rows before such a norm's backward and one summed after it differ by
    float32 rounding; exactness tests of reorganised computations (shared-prefix reuse) need float64 throughout."""
    import torch

    model.double()
    for name, module in list(model.named_modules()):
        if type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            norm = torch.nn.RMSNorm(module.weight.shape[0], eps=module.variance_epsilon, dtype=torch.float64)
            with torch.no_grad():
                norm.weight.copy_(module.weight)
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, norm)
    return model


def save_tiny_model(directory: str | os.PathLike, seed: int = 0, **model_kwargs) -> str:
    """Write a tiny tokenizer and model to `directory` (once) and return the path, loadable by `from_pretrained`."""
    directory = Path(directory)
    if not (directory / "config.json").exists():
        directory.mkdir(parents=True, exist_ok=True)
        tokenizer = make_tiny_tokenizer()
        model = make_tiny_model(tokenizer, seed=seed, **model_kwargs)
        tokenizer.save_pretrained(directory)
        model.save_pretrained(directory)
    return str(directory)


def free_port() -> int:
    """A TCP port free on this machine now, for the rendezvous of a multi-process test launch (a fixed port collides
    when two test runs launch at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------- test runs and data

# Presets of training fields for `run_args`. Every test run: on the CPU, in float32, reporting nowhere.
CPU = {"bf16": False, "use_cpu": True, "report_to": []}
# The paper's constant anchor: the loss references weigh the NCA term by `nca_beta` from the first step (the default,
# gated anchor is off until the views drift apart; tests/trainers/test_schedule.py and tests/trainers/test_stall.py run it).
CONSTANT_ANCHOR = {"nca_beta_schedule": "constant"}
# A short reproducible run: 2 optimizer steps of 2 rows, 6 sampled tokens, every step logged, nothing saved.
SHORT_RUN = {
    **CPU,
    **CONSTANT_ANCHOR,
    "save_strategy": "no",
    "max_steps": 2,
    "per_device_train_batch_size": 2,
    "max_new_tokens": 6,
    "logging_steps": 1,
    "gradient_checkpointing": False,
    "seed": 0,
    "data_seed": 0,
}
# `NCADistillationTrainer`'s one step whose update is the gradient: 4 rows, 8 sampled tokens, SGD at learning rate 1
# without clipping, the constant anchor at 0.5 (the distillation trainer's and the vLLM tests').
ONE_SGD_STEP = {
    **CPU,
    **CONSTANT_ANCHOR,
    "save_strategy": "no",
    "max_steps": 1,
    "per_device_train_batch_size": 4,
    "max_completion_length": 8,
    "logging_steps": 1,
    "gradient_checkpointing": False,
    "seed": 0,
    "data_seed": 0,
    "nca_beta": 0.5,
    "optim": "sgd",
    "learning_rate": 1.0,
    "max_grad_norm": 0.0,
    "lr_scheduler_type": "constant",
    "disable_tqdm": True,
}
# One batch of 3 dataset rows scored off-policy (the references), NCA on at the paper's weight, nothing saved.
REFERENCE_BATCH = {
    **CPU,
    **CONSTANT_ANCHOR,
    "save_strategy": "no",
    "per_device_train_batch_size": 3,
    "max_new_tokens": 6,
    "lmbda": 0.0,
    "nca_beta": 0.5,
}
# Played episodes: 2 steps of 2 rows, no length cap (the episodes' prompts grow), a learning rate that moves weights.
ROLLOUT_RUN = {
    **CPU,
    "save_strategy": "no",
    "max_steps": 2,
    "per_device_train_batch_size": 2,
    "logging_steps": 1,
    "gradient_checkpointing": False,
    "max_length": None,
    "learning_rate": 1e-2,
}
# Bad-input checks: one step of 4 sampled tokens, as little work as building the trainer allows.
ONE_STEP = {**CPU, "max_new_tokens": 4, "max_steps": 1}


def full_logprobs(model, prompts, prompt_mask, completion_ids, completion_mask, temperature: float = 1.0):
    """The tests' full-logit reference: float64 log-probabilities (one row per completion token, the masked ones left
    out) of `model` on one view (`prompts` and their mask, then the completions, as `core.views.build_view` lays
    them out), from the model's own full logits divided by `temperature`; no chunking, no reuse of the library's
    loss."""
    import torch.nn.functional as F

    from .core.views import build_view

    view = build_view(prompts, prompt_mask, completion_ids, completion_mask)
    out = model(input_ids=view.input_ids, attention_mask=view.attention_mask, position_ids=view.position_ids)
    logits = out.logits[:, view.prompt_width - 1 :][completion_mask.bool()]
    return F.log_softmax(logits.double() / temperature, -1)


def token_kl(p, q):
    """KL(p || q) per token of two rows of log-probabilities (`full_logprobs`): the reverse KL of OPD with p the
    student's no-context view and q the teacher's, the NCA term with q the context view."""
    return (p.exp() * (p - q)).sum(-1)


def run_args(config_class, directory, preset: dict | None = None, **fields):
    """`config_class` (`NCAConfig`, `NCADistillationConfig`, GKD's `GKDConfig`) for a test run writing to
    `directory`: the fields of `preset` (default `CPU`), then `fields`, which add to or override them (`output_dir`
    too)."""
    return config_class(**{"output_dir": str(directory), **(CPU if preset is None else preset), **fields})


def cloned_parameters(model) -> dict:
    """A copy of the model's parameters by name, to compare with after a step."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def batch_dict(batch) -> dict:
    """The fields of a trainer's `trl_nca.trainers.batch.NCABatch` by name (a mapping, such as a collator's batch, is
    returned as it is), for references that read both kinds."""
    if isinstance(batch, dict):
        return batch
    return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}


def record_batches(trainer) -> list:
    """Wrap `trainer.compute_loss` to keep every micro-batch it sees in training, as the trainer's
    `trl_nca.trainers.batch.NCABatch` (`trainer.nca_batch`), its tensors cloned, in order: the returned list fills as
    the trainer trains."""
    import torch

    batches, compute_loss = [], trainer.compute_loss

    def spy(model, inputs, *args, **kwargs):
        if trainer.model.training:
            batch = trainer.nca_batch(inputs)
            fields = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
            batches.append(
                dataclasses.replace(batch, **{k: v.clone() for k, v in fields.items() if torch.is_tensor(v)})
            )
        return compute_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = spy
    return batches


def prompt_dataset(n: int = 4, context: str = CONTEXT):
    """`n` prompt-only rows (`QUESTIONS` in turn), each with `context` in the `context` column."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [QUESTIONS[i % len(QUESTIONS)] for i in range(n)], "context": [context] * n})


def ragged_answers(n: int = 3, words_per_row: int = 3):
    """`n` chat rows with reference answers of different lengths: row i's answer is `<answer>A</answer>` (or B)
    followed by `words_per_row * i` words, so the completion block of a batch is ragged; `CONTEXT` in every row."""
    from datasets import Dataset

    rows = [
        [
            {"role": "user", "content": f"Question {i}: which answer? (A) yes (B) no"},
            {"role": "assistant", "content": "<answer>" + "AB"[i % 2] + "</answer>" + " ok" * (words_per_row * i)},
        ]
        for i in range(n)
    ]
    return Dataset.from_dict({"messages": rows, "context": [CONTEXT] * n})


def scripted_generate(tokenizer, reply):
    """A `trl_nca.core.sampling.GenerateFn` that answers every prompt with `reply(prompt_text)`: a scripted policy for
    tests of rollouts and evaluations. `prompt_text` is the whole rendered prompt (chat markers included); each
    completion is the reply's tokens followed by the end-of-turn token, and its text is the reply."""
    from .core.sampling import Generated

    def generate(prompts, seeds):
        out = []
        for ids in prompts:
            text = reply(tokenizer.decode(list(ids)))
            tokens = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
            out.append(Generated(tokens, text, truncated=False))
        return out

    return generate


# ---------------------------------------------------------------------------------------------------------------------
# Tolerances. Float results differ between CPUs in their last bits (the vectorised kernels that ATEN_CPU_CAPABILITY
# selects round differently), so every tolerance of the test suite comes from an error model, never from the
# difference one machine happened to show. u32 = 2**-24 (about 6.0e-8) and u64 = 2**-53 (about 1.1e-16) are the unit
# roundoffs of float32 and float64.


class Tolerance:
    """A named tolerance and the error model it comes from (`why`), for `torch.testing.assert_close` (`close`) and
    `pytest.approx` (`approx`). `close(..., scale=s)` compares `actual / s` with `expected / s`: the rounding error of
    a sum is relative to the size of its terms, for which a tensor's largest entry stands in."""

    def __init__(self, name: str, rtol: float, atol: float, why: str):
        self.name, self.rtol, self.atol, self.why = name, rtol, atol, why

    def __repr__(self) -> str:
        return f"Tolerance({self.name}: rtol={self.rtol}, atol={self.atol})"

    def close(self, actual, expected, msg=None, scale=None) -> None:
        import torch

        if scale is not None:
            scale = torch.as_tensor(scale).clamp_min(1e-30)
            actual, expected = actual / scale, expected / scale
        torch.testing.assert_close(actual, expected, rtol=self.rtol, atol=self.atol, msg=msg)

    def approx(self, expected):
        import pytest

        return pytest.approx(expected, rel=self.rtol, abs=self.atol)


FLOAT64 = Tolerance(
    "FLOAT64",
    rtol=1e-10,
    atol=1e-10,
    why="Both sides computed in float64 (`float64_model`): two orders of summing n terms of size O(1) differ by about "
    "n * u64 (1e-11 for n = 10^5), inside 1e-10, while a real error (a token too many, a missing term, a wrong "
    "position) moves values by 1e-3 or more. Gradients are compared with `scale=` their largest entry.",
)
FLOAT32 = Tolerance(
    "FLOAT32",
    rtol=1e-4,
    atol=1e-6,
    why="float32 tensors of the tiny test models (weights, gradients, hidden states, logits) computed in two orders or "
    "batch shapes: each carries about sqrt(n) * u32 relative to its terms, at most 6e-6 for the n <= 10^4 terms of "
    "these models, so 1e-4 leaves a margin of 15; atol covers entries near zero whose terms are O(1e-2).",
)
STORED32 = Tolerance(
    "STORED32",
    rtol=1e-6,
    atol=1e-12,
    why="A float64 value that passed through a float32 number a few times (Trainer keeps the running `loss` it logs in "
    "a float32 tensor): each rounding changes it by at most u32 = 6e-8 relative.",
)
KL32 = Tolerance(
    "KL32",
    rtol=1e-5,
    atol=2e-6,
    why="A KL divergence (or a token mean of them) computed in float32: every log-probability carries a few "
    "u32 * |log p|, about 4e-7 for the 320-token vocabulary (|log p| near log 320), and the KL is a p-weighted sum of "
    "their differences, so its error is absolute, near 1e-6, whatever the KL's value: the KL of two nearby views "
    "(1e-3) has no relative precision to test, an OPD loss of O(1) keeps rtol 1e-5.",
)


def one_error_line(command_main, argv, capsys, command: str | None = None) -> str:
    """Run a command-line entry point (`trl_nca.cli.main`) on `argv`; it must exit 2 with exactly one error line on
    stderr and no traceback (`capsys`: pytest's fixture), which starts with `trl-nca COMMAND: error: ` when `command`
    is given. Returns that line."""
    try:
        code = command_main(argv)
    except SystemExit as exit_info:  # argparse's own errors
        code = exit_info.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if ": error: " in line]  # argparse's usage lines may come before
    assert len(lines) == 1, err
    assert command is None or lines[0].startswith(f"trl-nca {command}: error: "), lines[0]
    return lines[0]


def load_script(path: str | Path):
    """A file of the repository that is not in the package (`scripts/check_documented.py`, `docs/results/build.py`)
    loaded as a module, registered in `sys.modules` (a dataclass in it looks its module up there)."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"_script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
