#!/usr/bin/env bash
# OPD vs NCA on one GPU at Qwen3-1.7B and Llama-3.1-8B shapes (random weights): a table on stdout and a JSON file.
#
#   bash benchmarks/gpu_check.sh [--out FILE] [--smoke] [other options of benchmarks/gpu_check.py]
#
# Where trl or datasets are missing (the GPU machine), the wheels in benchmarks/wheels/ are installed into a private
# folder first: fetch them beforehand with `bash benchmarks/download_wheels.sh` where PyPI is reachable.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import trl, datasets" 2>/dev/null; then
    shopt -s nullglob
    wheels=(benchmarks/wheels/*.whl)
    if [ ${#wheels[@]} -eq 0 ]; then
        echo "gpu_check: trl or datasets is not installed and benchmarks/wheels/ has no wheels;" \
             "run 'bash benchmarks/download_wheels.sh' where PyPI is reachable and bring that folder along." >&2
        exit 2
    fi
    site=${GPU_CHECK_SITE:-/tmp/gpu_check_site}
    echo "gpu_check: installing ${#wheels[@]} wheels from benchmarks/wheels/ into $site"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${wheels[@]}"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # trl_nca from this checkout
export TRL_EXPERIMENTAL_SILENCE=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1
exec "$PYTHON" benchmarks/gpu_check.py "$@"
