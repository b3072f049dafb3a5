"""Loading an evaluation dataset from a local file or the Hub, with errors that say what is wrong and where."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import EvalInputError


LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _looks_local(source: str) -> bool:
    return (
        source.startswith(("/", "./", "../", "~"))
        or Path(source).suffix.lower() in LOCAL_FORMATS
        or "\\" in source
        or Path(source).exists()
    )


def _decode_line(raw: bytes, path: Path, number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise EvalInputError(
            f"Line {number} of {path} is not UTF-8 text: byte 0x{raw[error.start]:02x} at column {error.start + 1}. "
            "Save the file as UTF-8 (or fix that line)."
        ) from None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            line = _decode_line(raw, path, number)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise EvalInputError(
                    f"Line {number} of {path} is not valid JSON: {error.msg} (column {error.colno})."
                ) from error
            if not isinstance(row, dict):
                raise EvalInputError(f"Line {number} of {path} is a JSON {type(row).__name__}, expected an object.")
            rows.append(row)
    return rows


def _read_json(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise EvalInputError(
            f"Line {line} of {path} is not UTF-8 text: byte 0x{raw[error.start]:02x}. Save the file as UTF-8."
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise EvalInputError(
            f"{path} is not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})."
        ) from error
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        lengths = {len(v) for v in data.values()}
        if len(lengths) != 1:
            raise EvalInputError(f"{path} holds columns of different lengths {sorted(lengths)}.")
        keys = list(data)
        return [dict(zip(keys, values)) for values in zip(*data.values())]
    if isinstance(data, list) and all(isinstance(row, dict) for row in data):
        return data
    raise EvalInputError(f"{path} must hold a list of objects (one per item) or an object of equal-length columns.")


def read_json_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a local `.jsonl` (one object per line) or `.json` file; errors name the file and the line."""
    return _read_jsonl(path) if path.suffix.lower() == ".jsonl" else _read_json(path)


def load_eval_dataset(source: str, split: str = "test", config: str | None = None):
    """Rows of a local `.jsonl`/`.json`/`.parquet`/`.csv` file, a `save_to_disk` folder, or a Hub dataset split.

    Local JSON files are parsed here (so a bad line is reported with its number); the other formats go through
    `datasets`. `split` and `config` only apply to Hub datasets and `DatasetDict` folders.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        return _load_from_disk(path, split)
    if _looks_local(source):
        if not path.exists():
            raise EvalInputError(f"Dataset file {source!r} does not exist.")
        suffix = path.suffix.lower()
        if suffix not in LOCAL_FORMATS:
            raise EvalInputError(
                f"Cannot read {source!r}: unsupported file type {suffix or '(none)'}; use one of {sorted(LOCAL_FORMATS)}."
            )
        if suffix == ".jsonl":
            return _read_jsonl(path)
        if suffix == ".json":
            return _read_json(path)
        import datasets

        try:
            return datasets.load_dataset(LOCAL_FORMATS[suffix], data_files=str(path), split="train")
        except Exception as error:
            raise EvalInputError(
                f"Could not parse {source!r} as {suffix[1:]}: {type(error).__name__}: {error}"
            ) from error
    import datasets

    try:
        return datasets.load_dataset(source, config, split=split)
    except ValueError as error:
        if "split" in str(error).lower():
            raise EvalInputError(f"Dataset {source!r} has no split {split!r}: {error}") from error
        raise EvalInputError(f"Could not load dataset {source!r}: {error}") from error
    except Exception as error:
        raise EvalInputError(
            f"Could not load dataset {source!r} from the Hub ({type(error).__name__}: {error}). Check the name, or "
            "give a local .jsonl/.json/.parquet/.csv file."
        ) from error


def _load_from_disk(path: Path, split: str):
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as error:
        raise EvalInputError(f"{path} is a folder but not a dataset saved with `save_to_disk`: {error}") from error
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise EvalInputError(f"The dataset in {path} has no split {split!r}; its splits are {sorted(loaded)}.")
        return loaded[split]
    return loaded
