"""Pretrain the shipped model organisms and write them into `trl_nca/resources/organisms/`.

The organisms behind the main job and `docs/results.md` are shipped, so every machine evaluates the same weights
(pretraining repeats exactly on one machine only: other CPUs' vector kernels round differently). This script is the
command that rebuilds them; each organism is pretrained from its spec exactly as `organism_model_path` would, then its
weights are stored in float16 (1.6 MB each; the float32 reference is that float16 file read back) and listed in
`manifest.json` with their sha256, their final pretraining loss and the machine that built them.

    python scripts/build_organisms.py --dialect rules --seeds 0-7
    python scripts/build_organisms.py --dialect facts --seeds 0-9

A rebuild on another CPU gives other weights (and so other organisms): the shipped files are the reference.
"""

from __future__ import annotations

import argparse
import os
import sys


def seed_list(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds.extend(range(int(first), int(last or first) + 1))
    return seeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dialect",
        choices=("rules", "facts"),
        required=True,
        help="`rules`: the default organism (tasks organism_shift, organism_flip); `facts`: the dialect "
        "with fact lines (task organism_facts)",
    )
    parser.add_argument("--seeds", type=seed_list, required=True, help="organism seeds, e.g. 0-7 or 0,2,5")
    parser.add_argument("--out", default=None, help="folder (default: the package's resources/organisms)")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from trl_nca.models.organism import build_shipped, shipped_spec

    for seed in args.seeds:
        entry = build_shipped(shipped_spec(args.dialect, seed), out_dir=args.out)
        print(f"{entry['file']}: final loss {entry['final_loss']:.4f}, {entry['seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
