"""Sampling completions: the one generate-function type of trl-nca, and the backends that implement it.

`GenerateFn` is what the evaluation runner, the games and the trainer's rollouts call:

    generate(prompts, seeds) -> list[Generated]

`prompts` are token ids of chat prompts rendered with their generation prompt (`trl_nca.core.views.render_prompt_ids`),
`seeds` one random seed per prompt; each `Generated` holds the completion's token ids (through the end-of-turn token,
if the model ended its turn), its text (decoded without special tokens) and whether it hit the token budget. The
trainer's generate function samples with GKD's settings and the process random state (which a checkpoint restores)
and ignores the seeds; `generate_fn(backend, settings)` builds one from a backend that honours them.

Reproducibility contract. Every item gets its own seed (`item_seed(seed, item_id)`), used for both of its views. With
the Hugging Face backend, sampling is done by `PerRowSampler`: each row of a batch owns a `torch.Generator` seeded with
its item seed, and at every decoding step draws the same number of Gumbel variates from it, whatever else is in the
batch. Hence an item's sample depends only on (model, prompt, item seed, sampling settings, device type), not on the
batch size, the batch composition or the order of items, up to floating-point differences between the logits of a
padded batched forward and an unpadded one (which flip a sample only when two candidates are within rounding of each
other). The two views of an item share their random draws ("common random numbers"), which lowers the variance of the
paired comparison without biasing either view. The global RNGs (`random`, numpy, torch) are never used. Samples differ
between CPU and CUDA generators. The vLLM backend passes the item seed as the per-request seed, which vLLM also keeps
independent of batching, but its draws differ from the Hugging Face backend's.
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch

from .checks import is_int
from .views import left_pad


@contextmanager
def policy_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Run `model` in evaluation mode while it samples, then give every module back the mode it had.

    On-policy samples come from the policy, and the policy is the model without dropout: a student trained with
    dropout (LoRA's `lora_dropout`, TRL's default 0.05, kept when `disable_dropout=False`) would otherwise sample from a
    randomly thinned copy of itself, and each sample would use up dropout draws from the random stream. The modes are
    restored module by module, so a submodule kept in evaluation mode on purpose stays so."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training


@dataclass
class GenerationSettings:
    """Sampling settings shared by both views. Defaults follow the OPCD QA evaluation (T=1, top-p 0.95, top-k 20).

    `do_sample=False` or `temperature=0` means greedy decoding. `top_k=0` and `top_p=1` disable those filters.
    `batch_size` is the number of prompts per `generate` call (each view of a chunk of items is one call).
    """

    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 0.95
    top_k: int = 20
    do_sample: bool = True
    seed: int = 0
    batch_size: int = 8

    def __post_init__(self):
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got the {type(value).__name__} {value!r}.")
        for name in ("max_new_tokens", "top_k", "seed", "batch_size"):
            value = getattr(self, name)
            if not is_int(value):
                raise ValueError(f"{name} must be an integer, got the {type(value).__name__} {value!r}.")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}.")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}.")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}.")

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def item_seed(seed: int, item_id: str) -> int:
    """A 63-bit seed for one item, derived from the run seed and the item id (stable across runs and platforms)."""
    digest = hashlib.sha256(f"{seed}:{item_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass
class Generated:
    """One generated response: its token ids (through the end-of-turn token if any), text and truncation flag."""

    token_ids: list[int]
    text: str
    truncated: bool


GenerateFn = Callable[[Sequence[Sequence[int]], Sequence[int]], list[Generated]]
"""`generate(prompt token ids, one seed per prompt) -> one Generated per prompt` (see the module docstring)."""


class GenerationBackend(Protocol):
    """Generates one response per prompt; `seeds[i]` is the random seed of prompt i."""

    name: str

    def generate(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], settings: GenerationSettings
    ) -> list[Generated]: ...


class PerRowSampler:
    """A logits processor that samples each row with its own generator and returns a one-hot mask of the choice.

    Applies temperature, top-k then top-p (the smallest set of top candidates whose probability reaches `top_p`), and
    picks `argmax(logit + Gumbel noise)` over the candidates, which is an exact sample of the filtered softmax. Used
    with greedy `generate`, which then takes the marked token. Each row draws exactly `k` variates per step (`k` =
    top_k, or the vocabulary size), so its stream never depends on the other rows.
    """

    def __init__(self, seeds: Sequence[int], settings: GenerationSettings, device: torch.device | str):
        device = torch.device(device)
        self.generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
        self.temperature = settings.temperature
        self.top_k = settings.top_k
        self.top_p = settings.top_p

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        logits = scores.float() / self.temperature
        vocab = logits.shape[-1]
        k = self.top_k if 0 < self.top_k < vocab else vocab
        values, indices = torch.topk(logits, k, dim=-1)  # sorted, highest first
        if self.top_p < 1.0:
            probs = torch.softmax(values, dim=-1)
            mass_before = probs.cumsum(-1) - probs
            values = values.masked_fill(mass_before >= self.top_p, float("-inf"))
        noise = torch.stack([torch.empty(k, device=logits.device).exponential_(generator=g) for g in self.generators])
        choice = torch.argmax(values - noise.log(), dim=-1, keepdim=True)
        chosen = indices.gather(-1, choice)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(-1, chosen, 0.0)


def mask_through_eos(completion_ids: torch.Tensor, eos_token_id: int | Sequence[int] | None) -> torch.Tensor:
    """1 for every generated token up to and including the first end-of-sequence token of its row, 0 after it (all
    ones when `eos_token_id` is None: nothing stops early). `eos_token_id` may be a list of stop tokens."""
    if eos_token_id is None:
        return torch.ones_like(completion_ids)
    stops = torch.tensor(eos_token_id, device=completion_ids.device).reshape(-1)
    is_eos = torch.isin(completion_ids, stops).long()
    # tokens strictly after the first stop have at least one stop before them
    return (is_eos.cumsum(1) - is_eos == 0).long()


def _eos_ids(model, tokenizer) -> set[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}


class HFBackend:
    """Left-padded batched `model.generate` with `PerRowSampler` for sampling.

    `share_prompts`: rows of one call that repeat a prompt (the k samples of an item's view, which
    `trl_nca.eval.PairedEvaluator` sends together) share its prefill. Every distinct prompt but its last token runs
    once, its keys and values are copied to each row that repeats it (`Cache.reorder_cache`), and `generate` continues
    from that cache with the last prompt token. Each row keeps its own seed and random stream, so the samples are
    those of the unshared call up to float rounding: the cached keys come from a forward of another batch shape, which
    can flip a sample only where two candidates are within rounding of each other (as a change of batch size can; see
    the module docstring). Calls without a repeated prompt, models that take no cache, and one-token prompts run
    unshared.
    """

    name = "hf"

    def __init__(self, model, tokenizer, *, share_prompts: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.share_prompts = share_prompts
        self.prefill_rows_saved = 0  # prompt rows whose prefill was shared (for benchmarks and tests)

    @torch.no_grad()
    def generate(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], settings: GenerationSettings
    ) -> list[Generated]:
        from transformers import LogitsProcessorList

        model, tokenizer = self.model, self.tokenizer
        eos_ids = _eos_ids(model, tokenizer)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids, default=0)
        device = next(model.parameters()).device
        input_ids, attention_mask = left_pad(prompts, pad_id)
        config = copy.deepcopy(model.generation_config)
        config.max_new_tokens = settings.max_new_tokens
        config.max_length = None
        config.min_new_tokens = None
        config.do_sample = False
        config.num_beams = 1
        config.num_return_sequences = 1
        config.temperature = None
        config.top_p = None
        config.top_k = None
        config.pad_token_id = pad_id
        if config.eos_token_id is None and tokenizer.eos_token_id is not None:
            config.eos_token_id = tokenizer.eos_token_id
        processors = LogitsProcessorList()
        if not settings.greedy:
            processors.append(PerRowSampler(seeds, settings, device))
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        cache = self._shared_prefill(prompts, input_ids, attention_mask) if self.share_prompts else None
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=config,
            logits_processor=processors,
            **({} if cache is None else {_cache_argument(model): cache}),
        )
        completions = output[:, input_ids.shape[1] :].tolist()
        results = []
        for row in completions:
            end = next((i for i, t in enumerate(row) if t in eos_ids), None)
            tokens = row if end is None else row[: end + 1]
            truncated = end is None and len(tokens) >= settings.max_new_tokens
            results.append(Generated(tokens, tokenizer.decode(tokens, skip_special_tokens=True), truncated))
        return results

    def _shared_prefill(self, prompts, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """The cache of every row's prompt but its last token, computed once per distinct prompt and copied to the
        rows that repeat it; None when no prompt repeats or sharing does not apply (see the class docstring)."""
        first: dict[tuple[int, ...], int] = {}
        rows = [first.setdefault(tuple(p), i) for i, p in enumerate(prompts)]
        if len(first) == len(prompts) or input_ids.shape[1] < 2:
            return None
        argument = _cache_argument(self.model)
        if argument is None:
            return None
        from transformers import DynamicCache

        distinct = torch.tensor(sorted(first.values()), device=input_ids.device)
        ids, mask = input_ids[distinct, :-1], attention_mask[distinct, :-1]
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        cache = DynamicCache(config=self.model.config)
        self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
            **{argument: cache},
        )  # fmt: skip
        slot = {row: j for j, row in enumerate(sorted(first.values()))}
        cache.reorder_cache(torch.tensor([slot[r] for r in rows], device=input_ids.device))
        self.prefill_rows_saved += len(prompts) - len(first)
        return cache


def _cache_argument(model) -> str | None:
    """The name under which `model.forward` and `generate` take a key/value cache (`cache` in transformers >= 5.2x,
    `past_key_values` before), or None when the forward takes none or no position ids."""
    import inspect

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model passes them on
    params = inspect.signature(inner.forward).parameters
    if "position_ids" not in params:
        return None
    return "cache" if "cache" in params else "past_key_values" if "past_key_values" in params else None


class VLLMBackend:
    """Generation with vLLM (optional dependency); per-request seeds keep samples independent of batching.

    `llm` is a `vllm.LLM` or a model path; an `adapter` path is served through vLLM's LoRA support.
    """

    name = "vllm"

    def __init__(self, llm, tokenizer, adapter: str | None = None, **llm_kwargs):
        try:
            import vllm
        except ImportError as error:
            raise ImportError("The vLLM backend needs `pip install vllm`; use backend='hf' otherwise.") from error
        self._vllm = vllm
        if isinstance(llm, str):
            llm = vllm.LLM(model=llm, enable_lora=adapter is not None, **llm_kwargs)
        self.llm = llm
        self.tokenizer = tokenizer
        self.lora = None
        if adapter is not None:
            from vllm.lora.request import LoRARequest

            self.lora = LoRARequest("adapter", 1, adapter)

    def generate(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], settings: GenerationSettings
    ) -> list[Generated]:
        params = [
            self._vllm.SamplingParams(
                max_tokens=settings.max_new_tokens,
                temperature=0.0 if settings.greedy else settings.temperature,
                top_p=settings.top_p,
                top_k=settings.top_k if settings.top_k > 0 else -1,
                seed=int(seed) & 0x7FFFFFFF,
                skip_special_tokens=True,
            )
            for seed in seeds
        ]
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        outputs = self.llm.generate(requests, sampling_params=params, lora_request=self.lora, use_tqdm=False)
        results = []
        for out in outputs:
            completion = out.outputs[0]
            results.append(Generated(list(completion.token_ids), completion.text, completion.finish_reason == "length"))
        return results


def vllm_available() -> bool:
    """Whether the optional vLLM backend can be imported."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def check_generated(generated: Any, expected: int) -> list[Generated]:
    """The output of a generate function, checked: one `Generated` per prompt, token ids as integers."""
    if not isinstance(generated, Sequence) or len(generated) != expected:
        got = len(generated) if isinstance(generated, Sequence) else type(generated).__name__
        raise ValueError(f"`generate` must return one Generated per prompt: sent {expected}, got {got}.")
    for item in generated:
        if not isinstance(item, Generated):
            raise TypeError(
                f"`generate` must return `trl_nca.core.sampling.Generated` objects, got {type(item).__name__}."
            )
        if not all(is_int(t) for t in item.token_ids):
            raise TypeError("`generate` must return token ids as integers.")
    return list(generated)


def generate_fn(backend: GenerationBackend, settings: GenerationSettings) -> GenerateFn:
    """The `GenerateFn` of a backend with fixed sampling settings, calling it with at most `settings.batch_size`
    prompts at a time (samples do not depend on the batching; see the module docstring)."""

    def generate(prompts: Sequence[Sequence[int]], seeds: Sequence[int]) -> list[Generated]:
        if len(prompts) != len(seeds):
            raise ValueError(f"`generate` needs one seed per prompt: got {len(prompts)} prompts, {len(seeds)} seeds.")
        out: list[Generated] = []
        for start in range(0, len(prompts), settings.batch_size):
            chunk = slice(start, start + settings.batch_size)
            out += check_generated(backend.generate(prompts[chunk], list(seeds[chunk]), settings), len(prompts[chunk]))
        return out

    return generate
