#!/usr/bin/env bash
# Fetch, where PyPI is reachable, exactly what the lent GPU machine lacks for benchmarks/gpu_check.sh, as wheels for
# CPython 3.12 on x86-64 Linux, into benchmarks/wheels/ (git-ignored; carry it along with the checkout). The machine
# (GPU_MACHINE in gpu_check.py) has torch 2.11, transformers 5.17, accelerate 1.15, peft, pyarrow, pandas, xxhash,
# fsspec, huggingface-hub 1.33, tokenizers 0.23, safetensors 0.8 and numpy 2.5, and lacks:
#   trl 1.16.0      trl-nca's pin (trl>=1.16,<1.17); it requires transformers>=4.56.2, which the machine's 5.17 meets,
#                   so no transformers wheel travels
#   datasets 5.2.0  trl requires datasets>=4.7.0; the version tested here
#   dill 0.4.1, multiprocess 0.70.19   datasets requires dill<0.4.2 and multiprocess<0.70.20, absent there
#   deepspeed       only a source distribution for the versions trl-nca supports: tried, and recorded as not fetched
# After the download, gpu_check.py --plan-wheels checks every requirement of every wheel against the machine and the
# other wheels, and the script exits non-zero if one is not met or a wheel could not be fetched.
set -uo pipefail
cd "$(dirname "$0")"
DEST=wheels
PACKAGES=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mkdir -p "$DEST"
rm -f "$DEST"/*.whl "$DEST"/NOT_FETCHED.txt  # one version of each package, or pip refuses the install
failed=0
for package in "${PACKAGES[@]}"; do
    if ! python3 -m pip download --quiet --no-deps "${PLATFORM[@]}" -d "$DEST" "$package"; then
        echo "download_wheels: could not fetch $package (pip's error is above)" >&2
        failed=1
    fi
done
# deepspeed: without a version floor pip would take 0.3.1.dev5 (2020), the newest binary wheel on PyPI
if python3 -m pip download --quiet --no-deps "${PLATFORM[@]}" -d "$DEST" "deepspeed>=0.17" 2>/dev/null; then
    echo "download_wheels: deepspeed fetched as a binary wheel"
else
    echo "deepspeed>=0.17: PyPI has no binary wheel for it (source distribution only), so it does not travel;" \
         "ZeRO launches are not checked on the GPU machine" | tee "$DEST/NOT_FETCHED.txt"
fi
echo "download_wheels: checking the wheels against the GPU machine"
python3 gpu_check.py --plan-wheels "$DEST" || failed=1
ls -l "$DEST"
du -ch "$DEST"/* | tail -1
exit $failed
