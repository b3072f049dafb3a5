#!/usr/bin/env bash
# The GPU check in one call (benchmarks/README.md): the wheels, then gpu_check.py's parts, each with its own timeout
# (environment; OPD, NCA and NCA under ZeRO-3 at Qwen3-8B's shape and real lengths; one sampled 8B-shaped step; the
# ZeRO-3 launch of examples/medmcqa.py), the JSON rewritten as each part ends.
#
#   bash benchmarks/gpu_check.sh [--out FILE] [--dry-run] [other options of benchmarks/gpu_check.py]
#
# The GPU machine has no trl, datasets or package index: the wheels that benchmarks/download_wheels.sh fetched into
# benchmarks/wheels/ (git-ignored, carried along with the checkout) are installed into a private folder first, without
# touching the machine's packages. No `set -e`: every step says what failed, and the import check in gpu_check.py
# names whatever is still missing.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=${GPU_CHECK_WHEELS:-benchmarks/wheels}
SITE=${GPU_CHECK_SITE:-/tmp/gpu_check_site}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # trl_nca from this checkout
# The install's time limit, from gpu_check.py (INSTALL_TIMEOUT_S: with the parts' timeouts it fits the one call)
INSTALL_TIMEOUT_S=$("$PYTHON" benchmarks/gpu_check.py --install-timeout 2>/dev/null || echo 20)
left() { echo $((INSTALL_TIMEOUT_S - SECONDS > 1 ? INSTALL_TIMEOUT_S - SECONDS : 1)); }
shopt -s nullglob
wheels=("$WHEELS"/*.whl)
if [ ${#wheels[@]} -gt 0 ]; then
    echo "gpu_check: installing ${#wheels[@]} wheels into $SITE (at most ${INSTALL_TIMEOUT_S} s): ${wheels[*]##*/}"
    if "$PYTHON" -m pip --version >/dev/null 2>&1; then
        install=("$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE")
        if ! timeout "$(left)" "${install[@]}" "${wheels[@]}"; then
            echo "gpu_check: pip could not install the wheels together in time (its error is above); one by one:" >&2
            for wheel in "${wheels[@]}"; do
                timeout "$(left)" "${install[@]}" "$wheel" || echo "gpu_check: could not install ${wheel##*/}" >&2
            done
        fi
    else  # every wheel fetched is pure Python: unpacking it into the folder installs it
        echo "gpu_check: no pip for $PYTHON; unpacking the wheels instead"
        for wheel in "${wheels[@]}"; do
            timeout "$(left)" "$PYTHON" -m zipfile -e "$wheel" "$SITE" || echo "gpu_check: could not unpack $wheel" >&2
        done
    fi
    echo "gpu_check: wheels installed in ${SECONDS} s"
    export PYTHONPATH="$PWD:$SITE${PYTHONPATH#"$PWD"}"  # the wheels before the machine's own packages
else
    echo "gpu_check: no wheels in $WHEELS: using the installed packages"
fi
if [ -f "$WHEELS/NOT_FETCHED.txt" ]; then
    sed 's/^/gpu_check: not fetched: /' "$WHEELS/NOT_FETCHED.txt"
fi
export TRL_EXPERIMENTAL_SILENCE=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
"$PYTHON" benchmarks/gpu_check.py --wheels "$WHEELS" "$@"
status=$?
echo "gpu_check: exit status $status"
exit $status
