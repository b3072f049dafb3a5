"""What every evaluation output records about how it was made: model identity, hashes and library versions."""

from __future__ import annotations

import hashlib
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any


ATTACHED_ADAPTER = "<PEFT adapter attached to the model instance>"


def sha256_text(text: str) -> str:
    """Hex sha256 of a string's UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _version(distribution: str, module: str | None = None) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        pass
    if module is not None:
        try:
            return getattr(__import__(module), "__version__", None)
        except ImportError:
            return None
    return None


def library_versions() -> dict[str, str | None]:
    """Versions of the libraries that shape the generations (None for one that is not installed)."""
    versions = {
        "python": platform.python_version(),
        "trl_nca": _version("trl-nca", "trl_nca") or "unknown",
        "trl": _version("trl", "trl"),
        "transformers": _version("transformers", "transformers"),
        "torch": _version("torch", "torch"),
        "peft": _version("peft", "peft"),
        "datasets": _version("datasets", "datasets"),
    }
    vllm = _version("vllm")
    if vllm is not None:
        versions["vllm"] = vllm
    return versions


def weights_fingerprint(model) -> str | None:
    """A cheap fingerprint of a torch model's weights: sha256 over every parameter's name, shape and 64 head and tail
    values. It tells checkpoints apart (training moves every trained tensor) without hashing gigabytes.
    """
    import torch

    named = getattr(model, "named_parameters", None)
    if named is None:
        return None
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, param in named():
            flat = param.detach().reshape(-1)
            if flat.numel() == 0:
                continue
            sample = torch.cat([flat[:64], flat[-64:]]).float().cpu()
            digest.update(f"{name}{tuple(param.shape)}".encode())
            digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:32]


def _resolve(path: str | None) -> str | None:
    if path is None:
        return None
    return str(Path(path).resolve()) if Path(path).exists() else path


def model_identity(model=None, path: str | None = None, adapter: str | None = None) -> dict[str, Any]:
    """Name, local path, Hub commit, adapter and a weights fingerprint of the evaluated model."""
    config = getattr(model, "config", None)
    name = path or getattr(config, "_name_or_path", None) or (type(model).__name__ if model is not None else None)
    peft_config = getattr(model, "peft_config", None)
    if adapter is None and peft_config:
        adapter = ATTACHED_ADAPTER
    identity = {
        "name_or_path": name,
        "resolved_path": _resolve(path),
        "commit": getattr(config, "_commit_hash", None),
        "adapter": adapter,
        "adapter_resolved_path": _resolve(adapter) if adapter not in (None, ATTACHED_ADAPTER) else None,
        "dtype": str(getattr(model, "dtype", None)) if model is not None else None,
        "fingerprint": weights_fingerprint(model) if model is not None else None,
    }
    if identity["adapter_resolved_path"] and Path(identity["adapter_resolved_path"], "adapter_config.json").exists():
        identity["adapter_config_sha256"] = sha256_file(Path(identity["adapter_resolved_path"], "adapter_config.json"))
    return identity
