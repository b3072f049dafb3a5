"""What every evaluation output records about how it was made: model identity, hashes and library versions."""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path
from typing import Any

import torch

from ..core.engines import vllm_version
from ..inputs import package_version, sha256_file, sha256_text


__all__ = [
    "attached_adapter",
    "library_versions",
    "model_identity",
    "sha256_file",
    "sha256_text",
    "weights_fingerprint",
]


def library_versions() -> dict[str, str | None]:
    """Versions of the libraries that shape the generations (None for one that is not installed)."""
    versions = {
        "python": platform.python_version(),
        "trl_nca": package_version("trl-nca", "trl_nca") or "unknown",
        "trl": package_version("trl", "trl"),
        "transformers": package_version("transformers", "transformers"),
        "torch": package_version("torch", "torch"),
        "peft": package_version("peft", "peft"),
        "datasets": package_version("datasets", "datasets"),
    }
    vllm = vllm_version()
    if vllm is not None:
        versions["vllm"] = vllm
    return versions


def adapters_disabled(model) -> bool:
    """True inside a PEFT model's `disable_adapter()` block (its adapter layers are switched off)."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        return False
    modules = getattr(model, "modules", None)
    if modules is None:
        return False
    layers = [m for m in modules() if isinstance(m, BaseTunerLayer)]
    return bool(layers) and all(m.disable_adapters for m in layers)


def _canonical_parameter_name(name: str) -> str:
    """A parameter's name as in the plain model: without PEFT's `base_model.model.` prefix and `.base_layer`."""
    if name.startswith("base_model.model."):
        name = name[len("base_model.model.") :]
    return name.replace(".base_layer.", ".")


def weights_fingerprint(model) -> str | None:
    """A cheap fingerprint of the weights a torch model computes with: sha256 over every parameter's name, shape and
    64 head and tail values. It tells checkpoints apart (training moves every trained tensor) without hashing gigabytes.

    Adapter weights count while the adapter is active, and not inside `disable_adapter()`; names are taken without
    PEFT's wrapping, so a PEFT model with its adapter off has the fingerprint of its base model.
    """
    named = getattr(model, "named_parameters", None)
    if named is None:
        return None
    skip_adapters = adapters_disabled(model)
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, param in sorted(named(), key=lambda item: _canonical_parameter_name(item[0])):
            if skip_adapters and ".lora_" in name:
                continue
            flat = param.detach().reshape(-1)
            if flat.numel() == 0:
                continue
            sample = torch.cat([flat[:64], flat[-64:]]).float().cpu()
            digest.update(f"{_canonical_parameter_name(name)}{tuple(param.shape)}".encode())
            digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:32]


def attached_adapter(model) -> str | None:
    """A description of the PEFT adapter attached to a model instance: its type, rank, targets and config hash."""
    configs = getattr(model, "peft_config", None)
    if not configs:
        return None
    name = getattr(model, "active_adapter", None) or next(iter(configs))
    config = configs.get(name) if isinstance(name, str) else None
    if config is None:
        return "attached PEFT adapter"
    as_dict = config.to_dict() if hasattr(config, "to_dict") else vars(config)
    targets = as_dict.get("target_modules")
    targets = sorted(targets) if isinstance(targets, (set, list, tuple)) else targets
    digest = sha256_text(json.dumps(as_dict, sort_keys=True, default=str))[:12]
    state = "disabled" if adapters_disabled(model) else "active"
    return (
        f"attached {as_dict.get('peft_type', 'PEFT')} adapter {name!r} ({state}; r={as_dict.get('r')}, "
        f"alpha={as_dict.get('lora_alpha')}, targets={targets}; config sha256 {digest})"
    )


def _resolve(path: str | None) -> str | None:
    if path is None:
        return None
    return str(Path(path).resolve()) if Path(path).exists() else path


def model_identity(model=None, path: str | None = None, adapter: str | None = None) -> dict[str, Any]:
    """Name, local path, Hub commit, adapter and a weights fingerprint of the evaluated model."""
    config = getattr(model, "config", None)
    name = path or getattr(config, "_name_or_path", None) or (type(model).__name__ if model is not None else None)
    attached = attached_adapter(model) if adapter is None else None
    if attached is not None:
        adapter = attached
    identity = {
        "name_or_path": name,
        "resolved_path": _resolve(path),
        "commit": getattr(config, "_commit_hash", None),
        "adapter": adapter,
        "adapter_resolved_path": _resolve(adapter) if adapter is not None and attached is None else None,
        "dtype": str(getattr(model, "dtype", None)) if model is not None else None,
        "fingerprint": weights_fingerprint(model) if model is not None else None,
    }
    if identity["adapter_resolved_path"] and Path(identity["adapter_resolved_path"], "adapter_config.json").exists():
        identity["adapter_config_sha256"] = sha256_file(Path(identity["adapter_resolved_path"], "adapter_config.json"))
    return identity
