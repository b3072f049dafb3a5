"""The shipped model organisms: weights every machine shares.

Pretraining an organism repeats exactly on one machine only (other CPUs' vector kernels round differently, and the
organism's 1000 steps amplify that), so the organisms behind the main job and `docs/results.md` ship with the package
as float16 safetensors in `trl_nca/resources/organisms/`, listed in `manifest.json` with their spec, sha256 and the
machine that pretrained them (`scripts/build_organisms.py` is the command that rebuilt them). This module reads that
folder; `trl_nca.models.organism.organism_model_path` turns an entry into a normal checkpoint in the cache and refuses
to use a cached folder whose weights differ from the reference.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path


RESOURCE_DIR = Path(__file__).resolve().parent.parent / "resources" / "organisms"
MANIFEST_NAME = "manifest.json"
SHIPPED_DTYPE = "float16"


def manifest_path(folder: str | os.PathLike | None = None) -> Path:
    return Path(folder or RESOURCE_DIR) / MANIFEST_NAME


def read_manifest(folder: str | os.PathLike | None = None) -> dict:
    """The manifest (`{"organisms": {name: entry}}`); empty when no organism ships."""
    path = manifest_path(folder)
    if not path.is_file():
        return {"organisms": {}}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(
            f"The organism manifest {path} is not valid JSON ({error}); reinstall trl-nca or rebuild the organisms "
            f"with scripts/build_organisms.py."
        ) from None


def write_manifest(manifest: dict, folder: str | os.PathLike | None = None) -> None:
    path = manifest_path(folder)
    _write_atomically(path, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())


def entry_for_key(key: str, folder: str | os.PathLike | None = None) -> dict | None:
    """The manifest entry of the organism whose spec has this key, or None when it is not shipped."""
    for entry in read_manifest(folder)["organisms"].values():
        if entry["key"] == key:
            return entry
    return None


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_digest(state: dict) -> str:
    """sha256 over the weights as float32, by name: equal for the shipped file read back and a checkpoint saved from
    it, whatever the stored dtype."""
    import torch

    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to(device="cpu", dtype=torch.float32).contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def load_reference(entry: dict, folder: str | os.PathLike | None = None) -> dict:
    """The shipped weights of `entry` as float32 tensors, after checking the file against its sha256."""
    import torch
    from safetensors.torch import load_file

    path = Path(folder or RESOURCE_DIR) / entry["file"]
    if not path.is_file():
        raise FileNotFoundError(
            f"The shipped organism file {path} is missing; reinstall trl-nca, or rebuild it with "
            f"`python scripts/build_organisms.py` (which gives another machine's organism)."
        )
    actual = file_sha256(path)
    if actual != entry["sha256"]:
        raise ValueError(
            f"The shipped organism file {path} does not match its sha256 in {MANIFEST_NAME} (expected "
            f"{entry['sha256'][:16]}..., found {actual[:16]}...): it was changed or damaged. Reinstall trl-nca, or "
            f"rebuild the organisms with `python scripts/build_organisms.py` (which also rewrites the manifest)."
        )
    return {name: tensor.to(torch.float32) for name, tensor in load_file(str(path)).items()}


def cpu_name() -> str:
    """This machine's CPU model and its widest vector unit, for the record of who built an organism."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = next((line for line in info.splitlines() if line.startswith("flags")), "")
    unit = "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "no AVX2"
    return f"{model or platform.machine()} ({unit})"


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
