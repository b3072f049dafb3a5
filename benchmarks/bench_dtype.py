"""float32 against bfloat16 matmuls on this CPU, side by side, at the embedded SmolLM2-135M's projection shapes.

Whether bfloat16 pays on a CPU depends on native bfloat16 dot products (AVX-512 with `avx512_bf16`, or AMX); without
them torch converts and the matmuls run slower than float32. This prints, for each shape, interleaved repeats of the
two dtypes in one process and their time ratio, so the dtype of a long CPU run (e.g. examples/configs/results/fr-30.yaml)
can be judged on the machine that will run it.

    python benchmarks/bench_dtype.py [--rows 32] [--repeats 3] [--calls 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


# (in, out) of the embedded model's projections: hidden 576, MLP 1536, 3 key/value heads of 64
SHAPES = {
    "q_proj/o_proj": (576, 576),
    "k_proj/v_proj": (576, 192),
    "gate/up_proj": (576, 1536),
    "down_proj": (1536, 576),
}


def _flags() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            flags = next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    return ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags) or "none of them"


def timed(x: torch.Tensor, weight: torch.Tensor, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        torch.nn.functional.linear(x, weight)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32, help="token rows per matmul (a decoding step's batch)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    cli = parser.parse_args()
    torch.set_num_threads(cli.threads)
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, CPU flags: {_flags()}")
    print(f"{cli.rows} rows, {cli.calls} calls per timing, {cli.threads} thread(s); bfloat16 / float32 time ratio\n")
    print(
        "| shape | float32 s (median) | bfloat16 s (median) | ratio per repeat | median ratio |\n|---|---:|---:|---|---:|"
    )
    for name, (fan_in, fan_out) in SHAPES.items():
        x, weight = torch.randn(cli.rows, fan_in), torch.randn(fan_out, fan_in)
        pairs = []
        for _ in range(cli.repeats):  # interleaved: each repeat times float32, then bfloat16
            pairs.append((timed(x, weight, cli.calls), timed(x.bfloat16(), weight.bfloat16(), cli.calls)))
        ratios = [b / a for a, b in pairs]
        print(
            f"| {name} | {statistics.median(a for a, _ in pairs):.3f} | {statistics.median(b for _, b in pairs):.3f} "
            f"| {', '.join(f'{r:.2f}' for r in ratios)} | {statistics.median(ratios):.2f} |"
        )


if __name__ == "__main__":
    main()
