#!/usr/bin/env bash
# Fetch the wheels that benchmarks/gpu_check.sh installs on a GPU machine without trl and datasets and without a
# package index: the versions this project is tested with, for CPython 3.12 on x86-64 Linux (override with
# PY_VERSION=3.11 etc.). Run it where PyPI is reachable, before the GPU session. The wheels (about 16 MB) land in
# benchmarks/wheels/, which git ignores: bring that folder along with the checkout.
set -euo pipefail
cd "$(dirname "$0")"
PY_VERSION=${PY_VERSION:-3.12}
# transformers and peft: the versions tested here rather than the machine's; regex: transformers checks its version at import
PACKAGES=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 transformers==5.24.0 peft==0.21.2 regex==2026.5.9)
mkdir -p wheels
rm -f wheels/*.whl  # one version of each package, or pip refuses the install
for package in "${PACKAGES[@]}"; do
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d wheels "$package"
done
ls -l wheels
