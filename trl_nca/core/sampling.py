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
import inspect
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch
from transformers import DynamicCache, LogitsProcessorList

from .checks import is_int
from .engines import engine_defaults, request_groups
from .prefix import sharing_problem
from .views import left_pad


logger = logging.getLogger(__name__)


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


def ends_with_eos(ids: torch.Tensor, mask: torch.Tensor, eos_token_id: int | Sequence[int] | None) -> torch.Tensor:
    """Per row of right-padded completions (`ids`, `mask`), whether it holds an end-of-sequence token (none when
    `eos_token_id` is None)."""
    mask = mask.bool()
    if eos_token_id is None or ids.shape[1] == 0:
        return torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    eos = torch.as_tensor(eos_token_id, device=ids.device).reshape(-1)
    return (torch.isin(ids, eos) & mask).any(1)


def _eos_ids(model, tokenizer) -> set[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}


MIN_PREFIX_TOKENS = 8
"""The shortest prefix `HFBackend` and the trainers' sampling run once for the whole batch: shorter ones save less
than the extra pass costs."""


class HFBackend:
    """Left-padded batched `model.generate` with `PerRowSampler` for sampling, each call's prefill shared where the
    rows allow it (`shared_prefill`).

    `share_prompts`: rows of one call that repeat a prompt (the k samples of an item's view, which
    `trl_nca.eval.PairedEvaluator` sends together) run that prompt once, and their keys and values are copied to each
    row that repeats it. `share_prefix`: the tokens every prompt of the call starts with (the chat template's opening,
    a system message, a context shared by the batch), when there are at least `min_prefix_tokens` of them, run once at
    batch size 1. Each row keeps its own seed and random stream, so the samples are those of the unshared call up to
    float rounding: the cached keys come from forwards of other batch shapes, which can flip a sample only where two
    candidates are within rounding of each other (as a change of batch size can; see the module docstring). Calls
    with nothing to share run unshared, and so does the prefix of a model it would not be exact for
    (`trl_nca.core.prefix.sharing_problem`, logged once).
    """

    name = "hf"

    def __init__(
        self,
        model,
        tokenizer,
        *,
        share_prompts: bool = True,
        share_prefix: bool = True,
        min_prefix_tokens: int = MIN_PREFIX_TOKENS,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.share_prompts = share_prompts
        self.share_prefix = share_prefix
        self.min_prefix_tokens = min_prefix_tokens
        self.prefill_rows_saved = 0  # prompt rows whose prefill was shared (for benchmarks and tests)
        self.prefix_tokens_shared = 0  # prompt tokens not run again thanks to a shared prefix (same)
        self._logged: set[str] = set()

    @torch.no_grad()
    def generate(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], settings: GenerationSettings
    ) -> list[Generated]:
        model, tokenizer = self.model, self.tokenizer
        eos_ids = _eos_ids(model, tokenizer)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids, default=0)
        device = next(model.parameters()).device
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
        prefill = None
        if self.share_prompts or self.share_prefix:
            tokens = (
                sharable_prefix_tokens(model, prompts, self._logged, self.min_prefix_tokens) if self.share_prefix else 0
            )
            prefill = shared_prefill(model, prompts, pad_id, tokens, share_repeats=self.share_prompts)
        if prefill is None:
            input_ids, attention_mask = (t.to(device) for t in left_pad(prompts, pad_id))
            extra = {}
        else:
            input_ids, attention_mask = prefill.input_ids, prefill.attention_mask
            extra = prefill.cache_inputs
            self.prefill_rows_saved += prefill.rows_saved
            self.prefix_tokens_shared += prefill.prefix_tokens * (prefill.prompts_run - 1)
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=config,
            logits_processor=processors,
            **extra,
        )
        completions = output[:, input_ids.shape[1] :].tolist()
        results = []
        for row in completions:
            end = next((i for i, t in enumerate(row) if t in eos_ids), None)
            tokens = row if end is None else row[: end + 1]
            truncated = end is None and len(tokens) >= settings.max_new_tokens
            results.append(Generated(tokens, tokenizer.decode(tokens, skip_special_tokens=True), truncated))
        return results


def sharable_prefix_tokens(
    model, prompts: Sequence[Sequence[int]], logged: set[str], min_tokens: int = MIN_PREFIX_TOKENS
) -> int:
    """The prefix a sampling call of `model` on `prompts` runs once: `shared_prefix_tokens`, or 0 when it is shorter
    than `min_tokens` or the model cannot share it exactly (`trl_nca.core.prefix.sharing_problem`; the reason is
    logged once per kind, the kinds already logged kept in `logged`)."""
    tokens = shared_prefix_tokens(prompts)
    if tokens < max(1, min_tokens):
        return 0
    problem = sharing_problem(model)
    if problem is None:
        return tokens
    kind, reason = problem
    if kind not in logged:
        logged.add(kind)
        logger.warning("Sampling runs its prompts' shared prefix unshared: %s (logged once).", reason)
    return 0


def shared_prefix_tokens(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens that every prompt starts with, at most the shortest prompt minus two (each row keeps at least one token
    for the suffix pass and its last token for `generate`); 0 for fewer than two distinct prompts."""
    distinct = {tuple(p) for p in prompts}
    if len(distinct) < 2:
        return 0
    limit = min(len(p) for p in distinct) - 2
    first = next(iter(distinct))
    length = 0
    while length < limit and all(p[length] == first[length] for p in distinct):
        length += 1
    return length


@dataclass
class Prefill:
    """A batch of prompts laid out for `generate` after `shared_prefill`: each row is `[shared prefix | padding |
    the rest of its prompt]` (the padding between prefix and suffix is masked out, and positions count real tokens
    only, so every token has the position and sees the keys it has in the left-padded batch), and `cache` holds the
    keys and values of every column but the last, which `generate` runs first."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    cache: Any
    prefix_tokens: int  # P: tokens run once at batch size 1 (0: none)
    prompts_run: int  # distinct prompts whose suffix ran
    rows_saved: int  # rows whose prompt repeated another row's and was not run again
    cache_argument: str = "cache"  # the name `generate` takes the cache under (`past_key_values` before 5.2x)

    @property
    def cache_inputs(self) -> dict[str, Any]:
        """The cache as `generate`'s keyword argument."""
        return {self.cache_argument: self.cache}


@torch.no_grad()
def shared_prefill(
    model, prompts: Sequence[Sequence[int]], pad_id: int, prefix_tokens: int, *, share_repeats: bool = True
) -> Prefill | None:
    """Prefill `prompts` (token lists) with their first `prefix_tokens` tokens (which all of them share; see
    `shared_prefix_tokens`) run once at batch size 1, and, with `share_repeats`, each distinct prompt run once and its
    keys and values copied to every row that repeats it. Returns the layout and cache to continue with `generate`, or
    None when nothing is shared (no prefix and no repeated prompt) or the model's forward takes no cache.

    The prefix pass and the suffix pass are one forward each, whatever the rows (a caller under DeepSpeed ZeRO-3,
    where each forward is a collective, agrees on `prefix_tokens` across processes first: 0 everywhere, or > 0
    everywhere). Runs without gradient, as sampling does."""
    argument = _cache_argument(model)
    if argument is None or not prompts:
        return None
    device = next(model.parameters()).device
    first: dict[tuple[int, ...], int] = {}
    slots = [first.setdefault(tuple(p), len(first)) if share_repeats else i for i, p in enumerate(prompts)]
    distinct = list(first) if share_repeats else [tuple(p) for p in prompts]
    P = prefix_tokens
    if P == 0 and len(distinct) == len(prompts):
        return None
    if min(len(p) for p in distinct) < P + 2 or (P == 0 and max(len(p) for p in distinct) < 2):
        return None  # each row needs a suffix token (P > 0) or a cached token (P == 0) besides its last one
    head = list(distinct[0][:P])
    if any(list(p[:P]) != head for p in distinct):
        raise ValueError(f"shared_prefill: the prompts do not all start with the same {P} tokens.")
    cache = DynamicCache(config=model.config)
    if P > 0:
        ids = torch.tensor([head], device=device)
        model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            position_ids=torch.arange(P, device=device)[None, :],
            use_cache=True,
            logits_to_keep=1,
            **{argument: cache},
        )
        cache.batch_repeat_interleave(len(distinct))
    suffix_ids, suffix_mask = left_pad([p[P:-1] for p in distinct], pad_id)
    suffix_ids, suffix_mask = suffix_ids.to(device), suffix_mask.to(device)
    positions = (suffix_mask.cumsum(-1) - 1 + P).masked_fill(suffix_mask == 0, 0)
    model(
        input_ids=suffix_ids,
        attention_mask=torch.cat([suffix_mask.new_ones(len(distinct), P), suffix_mask], dim=1),
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
        **{argument: cache},
    )
    if share_repeats and len(distinct) < len(prompts):
        cache.reorder_cache(torch.tensor(slots, device=device))
    rows = torch.tensor(slots, device=device)
    last = torch.tensor([[p[-1]] for p in prompts], device=device)
    prefix = torch.tensor(head, device=device, dtype=torch.long).expand(len(prompts), P)
    input_ids = torch.cat([prefix, suffix_ids[rows], last], dim=1)
    attention_mask = torch.cat([suffix_mask.new_ones(len(prompts), P), suffix_mask[rows], torch.ones_like(last)], dim=1)
    return Prefill(input_ids, attention_mask, cache, P, len(distinct), len(prompts) - len(distinct), argument)


def _cache_argument(model) -> str | None:
    """The name under which `model.forward` and `generate` take a key/value cache (`cache` in transformers >= 5.2x,
    `past_key_values` before), or None when the forward takes none or no position ids."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model passes them on
    params = inspect.signature(inner.forward).parameters
    if "position_ids" not in params:
        return None
    return "cache" if "cache" in params else "past_key_values" if "past_key_values" in params else None


class VLLMBackend:
    """Generation with vLLM (optional dependency); per-request seeds keep samples independent of batching.

    `llm` is a `vllm.LLM` or a model path (then built with `llm_kwargs`); an `adapter` path is served through vLLM's
    LoRA support. On vLLM's CPU build the requests go to the engine in groups that it prefills whole
    (`trl_nca.core.engines.request_groups`): a seeded request whose prompt it split would stop it.
    """

    name = "vllm"

    def __init__(self, llm, tokenizer, adapter: str | None = None, **llm_kwargs):
        try:
            import vllm
        except ImportError as error:
            raise ImportError("The vLLM backend needs `pip install vllm`; use backend='hf' otherwise.") from error
        self._vllm = vllm
        if isinstance(llm, str):
            llm = vllm.LLM(model=llm, enable_lora=adapter is not None, **{**engine_defaults(), **llm_kwargs})
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
        outputs = []
        for group in self._groups([len(p) for p in prompts], settings.max_new_tokens):
            outputs += self.llm.generate(
                [requests[i] for i in group],
                sampling_params=[params[i] for i in group],
                lora_request=self.lora,
                use_tqdm=False,
            )
        results = []
        for out in outputs:
            completion = out.outputs[0]
            tokens = list(completion.token_ids)
            # decoded as `HFBackend` decodes (vLLM's own text holds back a trailing incomplete UTF-8 character)
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            results.append(Generated(tokens, text, completion.finish_reason == "length"))
        return results

    def _groups(self, prompt_lengths: list[int], new_tokens: int) -> list[list[int]]:
        """All requests at once, or on the CPU build the groups its engine prefills whole."""
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return [list(range(len(prompt_lengths)))]
        config = self.llm.llm_engine.vllm_config
        scheduler, cache = config.scheduler_config, config.cache_config
        kv_tokens = (cache.num_gpu_blocks or 0) * cache.block_size
        return list(
            request_groups(
                prompt_lengths,
                max_tokens=scheduler.max_num_batched_tokens,
                max_requests=scheduler.max_num_seqs,
                kv_tokens=kv_tokens or None,
                new_tokens=new_tokens,
            )
        )


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
