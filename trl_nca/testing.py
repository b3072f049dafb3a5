"""Tiny, fully offline models for tests, benchmarks and smoke runs.

Builds a byte-level BPE tokenizer with a ChatML template and a 2-layer Llama from scratch, so nothing is fetched from
the Hub. Everything is deterministic for a given seed.
"""

from __future__ import annotations

import os
from pathlib import Path


CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = [
    "You are a careful medical expert. Answer with the letter inside <answer></answer> tags.",
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
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scripted_generate(tokenizer, reply):
    """A `trl_nca.sampling.GenerateFn` that answers every prompt with `reply(prompt_text)`: a scripted policy for
    tests of rollouts and evaluations. `prompt_text` is the whole rendered prompt (chat markers included); each
    completion is the reply's tokens followed by the end-of-turn token, and its text is the reply."""
    from .sampling import Generated

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
    "FLOAT64", rtol=1e-10, atol=1e-10,
    why="Both sides computed in float64 (`float64_model`): two orders of summing n terms of size O(1) differ by about "
    "n * u64 (1e-11 for n = 10^5), inside 1e-10, while a real error (a token too many, a missing term, a wrong "
    "position) moves values by 1e-3 or more. Gradients are compared with `scale=` their largest entry.",
)  # fmt: skip
FLOAT32 = Tolerance(
    "FLOAT32", rtol=1e-4, atol=1e-6,
    why="float32 tensors of the tiny test models (weights, gradients, hidden states, logits) computed in two orders or "
    "batch shapes: each carries about sqrt(n) * u32 relative to its terms, at most 6e-6 for the n <= 10^4 terms of "
    "these models, so 1e-4 leaves a margin of 15; atol covers entries near zero whose terms are O(1e-2).",
)  # fmt: skip
STORED32 = Tolerance(
    "STORED32", rtol=1e-6, atol=1e-12,
    why="A float64 value that passed through a float32 number a few times (Trainer keeps the running `loss` it logs in "
    "a float32 tensor): each rounding changes it by at most u32 = 6e-8 relative.",
)  # fmt: skip
KL32 = Tolerance(
    "KL32", rtol=1e-5, atol=2e-6,
    why="A KL divergence (or a token mean of them) computed in float32: every log-probability carries a few "
    "u32 * |log p|, about 4e-7 for the 320-token vocabulary (|log p| near log 320), and the KL is a p-weighted sum of "
    "their differences, so its error is absolute, near 1e-6, whatever the KL's value: the KL of two nearby views "
    "(1e-3) has no relative precision to test, an OPD loss of O(1) keeps rtol 1e-5.",
)  # fmt: skip
