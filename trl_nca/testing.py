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
