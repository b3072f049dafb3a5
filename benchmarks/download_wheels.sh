#!/usr/bin/env bash
# Fetch, where PyPI is reachable, exactly what the lent GPU machine lacks for benchmarks/gpu_check.sh, as wheels for
# CPython 3.12 on x86-64 Linux, into benchmarks/wheels/ (git-ignored; carry it along with the checkout). The machine
# (GPU_MACHINE in gpu_check.py) has torch 2.11, transformers 5.17, accelerate 1.15, peft, pyarrow, pandas, xxhash,
# fsspec, huggingface-hub 1.33, tokenizers 0.23, safetensors 0.8 and numpy 2.5, and lacks:
#   trl 1.16.0      trl-nca's pin (trl>=1.16,<1.17); it requires transformers>=4.56.2, which the machine's 5.17 meets,
#                   so no transformers wheel travels
#   datasets 5.2.0  trl requires datasets>=4.7.0; the version tested here
#   dill 0.4.1, multiprocess 0.70.19   datasets requires dill<0.4.2 and multiprocess<0.70.20, absent there
#   deepspeed 0.19.8   PyPI has only its source: built here as a pure-Python wheel (`DS_BUILD_OPS=0 pip wheel
#                   --no-deps`: no op compiled; it detects CUDA at run time, and ZeRO-2/3 with the Trainer's torch
#                   optimizer compiles none; CPU-Adam offload would, so the offload config is not checked there)
#   deepspeed's requirements absent there: einops, hjson, msgpack, ninja, py-cpuinfo, pydantic with pydantic-core,
#                   annotated-types, typing-inspection, and typing-extensions>=4.16 (pydantic's floor), at the versions
#                   tested here
# After the download, gpu_check.py --plan-wheels checks every requirement of every wheel against the machine and the
# other wheels, and the script exits non-zero if one is not met or a wheel could not be fetched or built.
set -uo pipefail
cd "$(dirname "$0")"
DEST=wheels
PACKAGES=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
          einops==0.8.2 hjson==3.1.0 msgpack==1.2.4 ninja==1.13.2 py-cpuinfo==9.0.0 pydantic==2.13.4
          pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 typing-extensions==4.16.0)
DEEPSPEED=deepspeed==0.19.8
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
# deepspeed: PyPI has its source only; built without ops it is one pure-Python wheel (py3-none-any, about 2 MB)
if DS_BUILD_OPS=0 python3 -m pip wheel --quiet --no-deps --no-build-isolation -w "$DEST" "$DEEPSPEED"; then
    echo "download_wheels: $DEEPSPEED built as a pure-Python wheel"
else
    echo "$DEEPSPEED: could not build its pure-Python wheel (pip's error is above); ZeRO launches are not checked" \
         "on the GPU machine" | tee "$DEST/NOT_FETCHED.txt" >&2
    failed=1
fi
echo "download_wheels: checking the wheels against the GPU machine"
python3 gpu_check.py --plan-wheels "$DEST" || failed=1
ls -l "$DEST"
du -ch "$DEST"/* | tail -1
exit $failed
