"""Upgrade a folder of committed comparison slices from format 1 to format 2, in place (`trl_nca/recipes/slices.py`).

Format 2 adds to each slice the exact settings of its own run (`run_settings`: the comparison's config with the
method's overrides and the seed, as the plan of `--config` gives them) and `results_sha256`, the checksum over what it
measured. A format-1 slice recorded neither, so this script derives `run_settings` from the config the slices were
made with, after checking that each slice's header (settings, data, weights, versions), unit, method, organism and
seed equal that config's plan: a slice of another config is refused, and nothing is written unless every slice of the
folder passes. Slices already of format 2 are checked and left as they are (the script is idempotent); the outcomes,
curves and every other field are kept byte for byte, so the tables built from the slices do not change. Each slice it
upgrades says so in its field `upgraded` (this script and the config, from which `run_settings` were derived).

    python scripts/upgrade_slices.py docs/results/slices/fr-30 --config examples/configs/results/fr-30.yaml
    python scripts/upgrade_slices.py DIR --config CONFIG --check    # exit 1 if a slice of DIR is not of format 2

It builds the comparison's plan as `trl-nca compare --from_slices` does (the models must be at hand; nothing is
trained or evaluated, and the plan's output folder is a temporary one).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


def plan_of(config: str, output_dir: str):
    """The checked plan of `trl-nca compare --config CONFIG` (no model loads, no file written but in `output_dir`)."""
    from trl import ModelConfig, TrlParser

    from trl_nca.recipes import CompareArguments, plan_comparison
    from trl_nca.trainers.nca_config import NCAConfig

    parser = TrlParser((CompareArguments, NCAConfig, ModelConfig), prog="upgrade_slices")
    args, training_args, model_args = parser.parse_args_and_config(
        args=["--config", config, "--output_dir", output_dir, "--report_to", "none"]
    )
    args.slice, args.from_slices, args.slices_dir = None, False, None
    return plan_comparison(args, training_args, model_args)


def upgrade_note(config: str) -> str:
    """The `upgraded` field of a slice this script upgrades."""
    return (
        f"upgraded from format 1 by scripts/upgrade_slices.py with {config}: run_settings and results_sha256 were "
        "derived then from that config's plan, not recorded by the unit's run"
    )


def upgraded(plan, path: Path, header: dict, slices, config: str) -> dict | None:
    """The format-2 content of the format-1 slice `path` (None when it is of format 2 already and checks), or a
    `SliceError` naming what differs from the plan."""
    data = json.loads(path.read_text(encoding="utf-8"))
    unit = path.stem
    if unit not in slices.unit_names(plan):
        raise slices.SliceError(f"{path} is not a unit of this config's comparison ({slices.unit_names(plan)}).")
    if isinstance(data, dict) and data.get("format") == slices.SLICE_FORMAT:
        slices.check_slice(plan, slices.Slice.from_dict(data, path), unit, header)
        return None
    if not isinstance(data, dict) or data.get("format") != 1:
        raise slices.SliceError(f"{path} is no format-1 slice (format {data.get('format')!r}); run its slice again.")
    new = {}
    for key, value in data.items():
        new[key] = value
        if key == "seed":
            new["run_settings"] = slices._run_settings(plan, unit)
    new["format"] = slices.SLICE_FORMAT
    new["results_sha256"] = slices.results_sha256(new)
    new["upgraded"] = upgrade_note(config)
    slices.check_slice(plan, slices.Slice.from_dict(new, path), unit, header)  # the config is the one it was made with
    return new


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="the folder of the slices (e.g. docs/results/slices/fr-30)")
    parser.add_argument("--config", required=True, help="the comparison's config the slices were made with")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a slice is not of format 2")
    cli = parser.parse_args(argv)

    from trl_nca.inputs import write_text_atomic
    from trl_nca.recipes import slices

    folder = Path(cli.folder)
    paths = sorted(folder.glob("*.json"))
    if not paths:
        print(f"upgrade_slices: {folder} holds no slice files.", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as output_dir:
        plan = plan_of(cli.config, output_dir)
        header = slices.slice_header(plan)
        try:
            contents = {path: upgraded(plan, path, header, slices, cli.config) for path in paths}
        except slices.SliceError as error:
            print(f"upgrade_slices: {error} Nothing was written.", file=sys.stderr)
            return 1
    todo = {path: content for path, content in contents.items() if content is not None}
    for path in paths:
        print(
            f"{path}: {'to upgrade to' if path in todo and cli.check else 'upgraded to' if path in todo else 'already'}"
            f" format {slices.SLICE_FORMAT}"
        )
    if cli.check:
        return 1 if todo else 0
    for path, content in todo.items():
        write_text_atomic(path, json.dumps(content, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
