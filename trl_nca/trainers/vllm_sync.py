"""The student's weights into TRL's colocated vLLM engine on vLLM's CPU build.

TRL (1.16) pushes the weights parameter by parameter into the engine's model (`VLLMGeneration.sync_weights`:
`model.load_weights([(name, param)])`), and each goes through the weight loader vLLM attached to the parameter when
it built the model. vLLM's CPU build repacks a linear layer's weight after loading it
(`UnquantizedLinearMethod.process_weights_after_loading` -> `dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`
in `vllm/model_executor/layers/utils.py`): the oneDNN kernel (float32 on x86, bfloat16 where the CPU has AVX-512
BF16 or AMX) or the AMX kernel keeps its own packed copy, and `layer.weight` becomes an empty plain `nn.Parameter`,
which has no weight loader. The next push then fails at `vllm/model_executor/layers/linear.py:1341` (0.31.0) with
`AttributeError: 'Parameter' object has no attribute 'weight_loader'`, after the layers before the first linear one
(the embedding) took the new weights. Where the kernel keeps the weight (bfloat16 on an AVX2-only CPU: oneDNN cannot
build that matmul and falls back to `torch.nn.functional.linear`), TRL's push works.

The route that works in both cases is vLLM's own reload, `GPUModelRunner.reload_weights(weights_iterator=...)` (the
CPU model runner inherits it): it puts every layer back as it was before processing, loads the new weights through
the original loaders and processes each layer again, so the packed kernels are rebuilt from the new weights. The
weights come from TRL's own walk over the student (`VLLMGeneration._iter_named_params`: PEFT merged, FSDP and
DeepSpeed gathered, vLLM's names).
"""

from __future__ import annotations


def reloads_weights(generation) -> bool:
    """Whether the student's weights go to this TRL `VLLMGeneration` through vLLM's reload: a colocated engine on
    vLLM's CPU build (elsewhere TRL's own push is kept)."""
    if generation is None or generation.mode != "colocate":
        return False
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def reload_colocated_weights(generation) -> None:
    """Put the student's current weights into the colocated engine of `generation` (see the module docstring)."""
    if generation.enable_sleep_mode:
        generation.llm.wake_up(tags=["weights"])
        generation._llm_weights_sleeping = False
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=generation._iter_named_params())
    generation.llm.reset_prefix_cache()
