"""Upgrade a folder of committed comparison slices from format 1 to format 2, in place (`trl_nca/recipes/slices.py`).

Format 2 adds to each slice the exact settings of its own run (`run_settings`: the comparison's config with the
method's overrides and the seed, as the plan of `--config` gives them) and `results_sha256`, the checksum over what it
measured. A format-1 slice recorded neither, so this script derives `run_settings` from the config the slices were
made with, and proves what it can before it writes:

- the config is that comparison's: it names this folder as its `slices_dir`, it was in the repository, as it is now,
  at the commit that added each format-1 slice, no other config there named this folder, and each slice's header
  (settings, data, weights, versions), unit, method, organism and seed equal its plan's (a config that names no
  folder or another one, that was edited since the slices were committed, or that shares the folder with another
  config is refused);
- each format-1 slice is as its run wrote it: committed, and its outcomes, curves and diagnostics equal to those of the
  commit that added it (a format-1 slice carries no checksum, so an outcome edited by hand, committed or not, would be
  sealed as measured: it is refused);
- every file can be written: a slice made immutable or read-only is refused before any is written.

A format-1 slice's method overrides were never recorded: each slice it upgrades says so in its field `upgraded` (this
script and the config, from which `run_settings` and `results_sha256` were derived). Nothing is written
unless every slice of the folder passes, and then all are written whole (each to a temporary file first, then renamed
into place). Slices already of format 2 are checked and left as they are (the script is idempotent); the outcomes,
curves and every other field are kept byte for byte, so the tables built from the slices do not change. Every refusal
is one line.

    python scripts/upgrade_slices.py docs/results/slices/fr-30 --config examples/configs/results/fr-30.yaml
    python scripts/upgrade_slices.py DIR --config CONFIG --check    # exit 1 if a slice of DIR is not of format 2

It builds the comparison's plan as `trl-nca compare --from_slices` does (the models must be at hand; nothing is
trained or evaluated, and the plan's output folder is a temporary one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path


class UpgradeError(Exception):
    """A reason to write nothing: one line naming the file and the fix."""


def plan_of(config: str, output_dir: str):
    """The checked plan of `trl-nca compare --config CONFIG` (no model loads, no file written but in `output_dir`) and
    its `slices_dir`."""
    from trl import ModelConfig, TrlParser

    from trl_nca.cli.config_files import CommandLineError, parse_command_line
    from trl_nca.recipes import CompareArguments, plan_comparison
    from trl_nca.trainers.nca_config import NCAConfig

    parser = TrlParser((CompareArguments, NCAConfig, ModelConfig), prog="upgrade_slices")
    try:
        args, training_args, model_args = parse_command_line(
            parser, ["--config", config, "--output_dir", output_dir, "--report_to", "none"]
        )
        slices_dir = args.slices_dir
        args.slice, args.from_slices, args.slices_dir = None, False, None
        return plan_comparison(args, training_args, model_args), slices_dir
    except (CommandLineError, ValueError, TypeError, OSError) as error:
        raise UpgradeError(f"--config {config!r}: {error}") from None


def _git(folder: Path, *args: str) -> str | None:
    """`git -C folder ARGS`'s output, or None where git fails (no repository, an unknown path or commit)."""
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else None


def _committed(path: Path) -> tuple[str, str] | None:
    """The commit that added `path` to its repository and the file's text there, or None (not in a repository's
    history)."""
    added = (_git(path.parent, "log", "--diff-filter=A", "--format=%H", "--", path.name) or "").split()
    if not added:
        return None
    text = _git(path.parent, "show", f"{added[-1]}:./{path.name}")
    return None if text is None else (added[-1], text)


def check_config_claims(config: str, slices_dir: str | None, folder: Path) -> None:
    """The config must name `folder` as its `slices_dir` (relative to the working folder or the repository's top)."""
    top = _git(folder, "rev-parse", "--show-toplevel")
    places = {Path(slices_dir).resolve()} if slices_dir else set()
    if slices_dir and top:
        places.add((Path(top.strip()) / slices_dir).resolve())
    if folder.resolve() not in places:
        named = f"names slices_dir {slices_dir!r}" if slices_dir else "names no slices_dir"
        raise UpgradeError(
            f"--config {config!r} {named}, not {str(folder)!r}: it is not the config these slices were made with (the "
            "config of a sliced comparison names its slices folder). Give that config."
        )


def check_unedited(path: Path, data: dict, config: str) -> str:
    """A format-1 slice must be committed with its outcomes as the commit that added it holds them, and the config
    must have been there, as it is now, at that commit. Returns that commit."""
    from trl_nca.recipes import slices

    found = _committed(path)
    if found is None:
        raise UpgradeError(
            f"{path} is in no repository's history: a format-1 slice carries no checksum, so only the commit that "
            "added it shows that its outcomes are those its run measured. Run its slice again (format 2)."
        )
    commit, text = found
    try:
        then = json.loads(text)
    except ValueError:
        then = None
    if not isinstance(then, dict) or any(then.get(key) != data.get(key) for key in slices.RESULT_KEYS):
        raise UpgradeError(
            f"{path}: its outcomes, curves or diagnostics differ from those of the commit that added it ({commit[:12]}):"
            " they were edited after its run, and a format-1 slice has no checksum to tell. Restore them (git checkout "
            f"{commit[:12]} -- {path.name}), or run its slice again."
        )
    config_path = Path(config)
    if _git(config_path.parent, "show", f"{commit}:./{config_path.name}") != config_path.read_text(encoding="utf-8"):
        raise UpgradeError(
            f"--config {config!r} is not, as it is now, in the commit that added {path} ({commit[:12]}): it was added "
            "or edited after the slice was made, so its settings are not proven to be the slice's. Give the config as "
            "it was then (git show), or run the slice again."
        )
    claimants = configs_naming(path.parent, commit)
    if claimants != [config_path.resolve()]:
        names = ", ".join(str(claimant) for claimant in claimants)
        raise UpgradeError(
            f"At the commit that added {path} ({commit[:12]}), the configs naming its folder as their slices_dir are "
            f"{names or 'none'}: the slice's config is not the one --config {config!r} alone. Keep one config per "
            "slices folder, or run the slices again."
        )
    return commit


def configs_naming(folder: Path, commit: str) -> list[Path]:
    """The YAML configs of the repository at `commit` whose `slices_dir` is `folder` (relative to the top)."""
    import yaml

    top = Path((_git(folder, "rev-parse", "--show-toplevel") or "").strip())
    found = []
    for line in (_git(top, "grep", "-l", "-e", "slices_dir", commit, "--", "*.yaml", "*.yml") or "").splitlines():
        name = line.partition(":")[2]
        try:
            settings = yaml.safe_load(_git(top, "show", f"{commit}:{name}") or "")
        except yaml.YAMLError:
            continue
        named = settings.get("slices_dir") if isinstance(settings, dict) else None
        if isinstance(named, str) and (top / named).resolve() == folder.resolve():
            found.append((top / name).resolve())
    return sorted(found)


def upgrade_note(config: str) -> str:
    """The `upgraded` field of a slice this script upgrades."""
    return (
        f"upgraded from format 1 by scripts/upgrade_slices.py with {config}: run_settings and results_sha256 were "
        "derived then from that config's plan, not recorded by the unit's run"
    )


def read_slice_file(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise UpgradeError(
            f"{path} is cut or garbled ({error}): restore it from git, or run its slice again."
        ) from None
    if not isinstance(data, dict):
        raise UpgradeError(
            f"{path} holds a JSON {type(data).__name__}, not a slice: restore it, or run its slice again."
        )
    return data


def upgraded(plan, path: Path, header: dict, config: str) -> dict | None:
    """The format-2 content of the format-1 slice `path` (None when it is of format 2 already and checks), or an
    `UpgradeError` naming what cannot be proven or differs from the plan."""
    from trl_nca.recipes import slices

    data = read_slice_file(path)
    unit = path.stem
    if unit not in slices.unit_names(plan):
        raise UpgradeError(f"{path} is not a unit of this config's comparison ({slices.unit_names(plan)}).")
    try:
        if data.get("format") == slices.SLICE_FORMAT:
            slices.check_slice(plan, slices.Slice.from_dict(data, path), unit, header)
            return None
        if data.get("format") != 1:
            raise UpgradeError(f"{path} is no format-1 slice (format {data.get('format')!r}); run its slice again.")
        check_unedited(path, data, config)
        new = {}
        for key, value in data.items():
            new[key] = value
            if key == "seed":
                new["run_settings"] = slices._run_settings(plan, unit)
        new["format"] = slices.SLICE_FORMAT
        new["results_sha256"] = slices.results_sha256(new)
        new["upgraded"] = upgrade_note(config)
        slices.check_slice(plan, slices.Slice.from_dict(new, path), unit, header)  # the header is the plan's
    except slices.SliceError as error:
        raise UpgradeError(str(error)) from None
    return new


def check_writable(paths: list[Path]) -> None:
    """Each file can be replaced: its folder takes a new file, and the file itself opens for writing (an immutable
    or read-only file refuses)."""
    for path in paths:
        probe = path.with_name(f".{path.name}.probe-{uuid.uuid4().hex[:8]}")
        try:
            probe.touch()
            probe.unlink()
            with open(path, "ab"):
                pass
        except OSError as error:
            raise UpgradeError(
                f"{path} cannot be written ({error.strerror or error}): make it and its folder writable (chattr -i, "
                "chmod), then run the script again."
            ) from None


def write_all(contents: dict[Path, dict]) -> None:
    """Every file written whole, or none changed: each is written to a temporary file beside it first, then all are
    renamed into place."""
    temporary = {}
    try:
        for path, content in contents.items():
            temporary[path] = path.with_name(f".{path.stem}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}.json")
            temporary[path].write_text(json.dumps(content, indent=1) + "\n", encoding="utf-8")
        for path, written in temporary.items():
            os.replace(written, path)
    except OSError as error:
        raise UpgradeError(
            f"Writing the slices failed ({error}); the files not yet renamed are as they were."
        ) from None
    finally:
        for written in temporary.values():
            with contextlib.suppress(OSError):
                written.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="the folder of the slices (e.g. docs/results/slices/fr-30)")
    parser.add_argument("--config", required=True, help="the comparison's config the slices were made with")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a slice is not of format 2")
    parser.error = _usage_error  # one line, not argparse's usage before it
    try:
        cli = parser.parse_args(argv)
        todo, paths = _upgrades(Path(cli.folder), cli.config)
        for path in paths:
            state = "to upgrade to" if path in todo and cli.check else "upgraded to" if path in todo else "already"
            print(f"{path}: {state} format 2")
        if cli.check:
            return 1 if todo else 0
        write_all(todo)
    except UpgradeError as error:
        print(f"upgrade_slices: {error} Nothing was written.", file=sys.stderr)
        return 1
    return 0


def _usage_error(message: str):
    raise UpgradeError(f"{message} (python scripts/upgrade_slices.py SLICES_DIR --config CONFIG; see --help).")


def _upgrades(folder: Path, config: str) -> tuple[dict[Path, dict], list[Path]]:
    """Every slice of `folder` checked (`upgraded`), and the format-2 content of those to write, each writable."""
    from trl_nca.recipes import slices

    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not paths:
        raise UpgradeError(f"{folder} holds no slice files.")
    if not Path(config).is_file():
        raise UpgradeError(f"--config {config!r} is no file; give the YAML config the slices were made with.")
    with tempfile.TemporaryDirectory() as output_dir:
        plan, slices_dir = plan_of(config, output_dir)
        check_config_claims(config, slices_dir, folder)
        header = slices.slice_header(plan)
        contents = {path: upgraded(plan, path, header, config) for path in paths}
    todo = {path: content for path, content in contents.items() if content is not None}
    check_writable(list(todo))
    return todo, paths


if __name__ == "__main__":
    sys.exit(main())
