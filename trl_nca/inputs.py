"""Reading what users hand over: dataset files and Hub datasets, context files, the built-in data; hashes, versions
and the cache folder; writing outputs whole (`atomic_output`, `write_text_atomic`) and reading them back
(`read_json_output`), so a reader never sees half a file.

One loader serves `trl-nca train`, `trl-nca eval`, the recipes and user code, so a file is read, and a bad byte or line
reported, the same way everywhere. Bad input raises `InputError` (a `ValueError`) whose message names the file, the
line or the option, and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from importlib import metadata, resources
from pathlib import Path
from typing import Any


logger = logging.getLogger(__name__)


class InputError(ValueError):
    """Bad user input (a missing column, an unreadable file, an unknown model): the message names it and the fix."""


class OutputError(OSError):
    """An output that could not be written (a full disk, a folder that is a file): the message names it and the fix.
    The commands print it as one line, like an `InputError`."""


class RunStopped(Exception):
    """A run that stopped before its end for a reason outside its input (a worker process killed): the message names
    what was lost and how to resume. The commands print it as one line (exit status 1)."""


LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
BUILTIN_DATASETS = {"quickstart": "quickstart_mcq.jsonl"}
BUILTIN_CONTEXTS = {"medical": "medical_system_prompt.txt", "safety": "safety_system_prompt.txt"}


# --------------------------------------------------------------------------------------------------------------------
# Hashes and versions


def sha256_text(text: str) -> str:
    """Hex sha256 of a string's UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_SHA256_MEMO: dict[tuple[str, int, int, int], str] = {}


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, memoised per (path, inode, size, mtime) so a repeated check costs a `stat`."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _SHA256_MEMO:
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
        _SHA256_MEMO[key] = digest.hexdigest()
    return _SHA256_MEMO[key]


def package_version(distribution: str, module: str | None = None) -> str | None:
    """The installed version of a distribution (else the `__version__` of `module`, if given), or None."""
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


CACHE_ENV_VAR = "TRL_NCA_CACHE"


def default_cache_dir() -> Path:
    """The cache root (embedded model, model organism): `$TRL_NCA_CACHE` if set, else `$XDG_CACHE_HOME/trl_nca`, else
    `~/.cache/trl_nca`."""
    env = os.environ.get(CACHE_ENV_VAR)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "trl_nca"


# --------------------------------------------------------------------------------------------------------------------
# Contexts


def read_context(name_or_path: str) -> str:
    """Text of a built-in context ('medical', 'safety': the paper's system-prompt domains) or of a UTF-8 text file."""
    if name_or_path in BUILTIN_CONTEXTS:
        return resources.files("trl_nca.resources").joinpath(BUILTIN_CONTEXTS[name_or_path]).read_text().strip()
    path = Path(name_or_path)
    if not path.is_file():
        raise InputError(
            f"Context file {name_or_path!r} not found; give a text file or one of {sorted(BUILTIN_CONTEXTS)}."
        )
    text = _read_utf8(path, f"the context file {name_or_path!r}")
    if not text.strip():
        raise InputError(f"The context file {name_or_path!r} is empty; write the context into it.")
    return text.strip()


# --------------------------------------------------------------------------------------------------------------------
# Datasets


def _read_utf8(path: Path, what: str) -> str:
    """The whole file as text; a byte that is not UTF-8 is an error naming `what` and the line it is on."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise InputError(
            f"Line {line} of {what} is not UTF-8 text: byte 0x{raw[error.start]:02x}. Save the file as UTF-8."
        ) from None


read_utf8_text = _read_utf8  # the public name, for the commands' own files (e.g. `--config`)


def _decode_line(raw: bytes, path: Path, number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(
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
                raise InputError(
                    f"Line {number} of {path} is not valid JSON: {error.msg} (column {error.colno})."
                ) from error
            if not isinstance(row, dict):
                raise InputError(f"Line {number} of {path} is a JSON {type(row).__name__}, expected an object.")
            rows.append(row)
    return rows


def _read_json(path: Path) -> list[dict[str, Any]]:
    text = _read_utf8(path, str(path))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(
            f"{path} is not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})."
        ) from error
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        lengths = {len(v) for v in data.values()}
        if len(lengths) != 1:
            raise InputError(f"{path} holds columns of different lengths {sorted(lengths)}.")
        keys = list(data)
        return [dict(zip(keys, values)) for values in zip(*data.values())]
    if isinstance(data, list) and all(isinstance(row, dict) for row in data):
        return data
    raise InputError(f"{path} must hold a list of objects (one per item) or an object of equal-length columns.")


def read_json_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a local `.jsonl` (one object per line) or `.json` file; errors name the file and the line."""
    path = Path(path)
    return _read_jsonl(path) if path.suffix.lower() == ".jsonl" else _read_json(path)


def _unsupported(source: str, suffix: str) -> InputError:
    return InputError(
        f"Cannot read the dataset file {source!r}: unsupported file type {suffix or '(none)'}; use one of "
        f"{sorted(LOCAL_FORMATS)}."
    )


def _read_local_file(source: str, path: Path):
    """Rows of a local file: JSON files as a list of dicts (parsed here, so a bad line is reported with its number),
    Parquet and CSV through `datasets`."""
    if not path.exists():
        raise InputError(f"Dataset file {source!r} does not exist.")
    suffix = path.suffix.lower()
    if suffix not in LOCAL_FORMATS:
        raise _unsupported(source, suffix)
    if LOCAL_FORMATS[suffix] == "json":
        return read_json_rows(path)
    import datasets

    try:
        return datasets.load_dataset(LOCAL_FORMATS[suffix], data_files=str(path), split="train")
    except Exception as error:
        raise InputError(f"Could not parse {source!r} as {suffix[1:]}: {type(error).__name__}: {error}") from error


def _load_hub(source: str, split: str, config: str | None):
    import datasets

    try:
        return datasets.load_dataset(source, config, split=split)
    except ValueError as error:
        if "split" in str(error).lower():
            raise InputError(f"Dataset {source!r} has no split {split!r}: {error}") from error
        raise InputError(f"Could not load dataset {source!r}: {error}") from error
    except Exception as error:
        raise InputError(
            f"Could not load dataset {source!r} from the Hub ({type(error).__name__}: {error}). Check the name, or "
            "give a local .jsonl/.json/.parquet/.csv file."
        ) from error


def _looks_local(source: str) -> bool:
    return (
        source.startswith(("/", "./", "../", "~"))
        or Path(source).suffix.lower() in LOCAL_FORMATS
        or "\\" in source
        or Path(source).exists()
    )


def load_rows(source: str, split: str = "test", config: str | None = None):
    """Evaluation items: a local `.jsonl`/`.json` file (a list of dicts, every row kept as written), a `.parquet`/
    `.csv` file, a `save_to_disk` folder, or a Hub dataset split.

    `split` and `config` only apply to Hub datasets and `DatasetDict` folders.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        return _load_from_disk(path, split)
    if _looks_local(source):
        return _read_local_file(source, path)
    return _load_hub(source, split, config)


def _load_from_disk(path: Path, split: str):
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as error:
        raise InputError(f"{path} is a folder but not a dataset saved with `save_to_disk`: {error}") from error
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise InputError(f"The dataset in {path} has no split {split!r}; its splits are {sorted(loaded)}.")
        return loaded[split]
    return loaded


def _dataset_from_rows(rows: list[dict[str, Any]], name: str):
    """`datasets.Dataset.from_list(rows)`; a column whose rows hold values of different kinds (a string in one row, a
    list of chat messages in another), which Arrow cannot hold in one column, is an `InputError` naming both rows."""
    from datasets import Dataset

    try:
        return Dataset.from_list(rows)
    except Exception as error:  # pyarrow's ArrowInvalid / ArrowTypeError, or a TypeError
        first: dict[str, tuple[int, str]] = {}
        for index, row in enumerate(rows):
            for column, value in row.items():
                kind = "null" if value is None else type(value).__name__
                if kind == "null":
                    continue
                seen = first.setdefault(column, (index, kind))
                if seen[1] != kind:
                    raise InputError(
                        f"The dataset file {name!r} mixes kinds of values in column {column!r}: row {seen[0]} holds a "
                        f"{seen[1]}, row {index} a {kind}. Give the column one kind in every row (e.g. every prompt a "
                        "string, or every prompt a list of chat messages)."
                    ) from None
        raise InputError(
            f"Could not read the rows of {name!r} as a dataset ({type(error).__name__}: {error})."
        ) from None


def load_dataset_any(name: str, split: str, config: str | None = None):
    """A training `datasets.Dataset`: a built-in one ('quickstart'), a local file (by extension) or a Hub dataset.

    A local file has one split ('train'); asking it for another is an error, not a silent copy of the training rows.
    An empty dataset is an error naming it.
    """
    from datasets import Dataset

    suffix = Path(name).suffix.lower()
    local = name in BUILTIN_DATASETS or suffix in LOCAL_FORMATS
    if local and split not in (None, "train"):
        raise InputError(
            f"{name!r} is a single file, so it has one split ('train'); the split {split!r} would silently be the same "
            "rows. Put the other split in its own file (and train or evaluate from that file), or use a Hub dataset."
        )
    if name in BUILTIN_DATASETS:
        path = resources.files("trl_nca.resources").joinpath(BUILTIN_DATASETS[name])
        dataset = Dataset.from_list(read_json_rows(str(path)))
    elif Path(name).is_file() and suffix not in LOCAL_FORMATS:
        raise _unsupported(name, suffix)
    elif local:
        dataset = _read_local_file(name, Path(name))
        if isinstance(dataset, list):
            if not dataset:
                raise InputError(f"The dataset file {name!r} holds no rows; fill it, or give another file.")
            dataset = _dataset_from_rows(dataset, name)
    else:
        dataset = _load_hub(name, split, config)
    if len(dataset) == 0:
        raise InputError(f"The dataset {name!r} (split {split!r}) has no rows; check the name, the split and the file.")
    return dataset


# --------------------------------------------------------------------------------------------------------------------
# Weights files

MAX_SAFETENSORS_HEADER = 100_000_000  # bytes; safetensors itself refuses larger headers


def check_weight_files(folder: str | os.PathLike, what: str) -> None:
    """The safetensors files of a local model or adapter `folder` (what `save_pretrained` writes), checked whole
    before any weights load: each file must hold the bytes its header describes, and a shard index must name only
    shards that exist. Reads the headers only. A cut file (an interrupted download or copy, a full disk) is an
    `InputError` naming `what` (e.g. "Model 'base'"), the file and the fix; a name that is no local folder passes."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        return
    fix = "Download or copy the model again (or save it again with save_pretrained)."
    for index in sorted(folder.glob("*.safetensors.index.json")):
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError) as error:
            raise InputError(f"{what}: the shard index {index} cannot be read ({error}). {fix}") from None
        missing = sorted(name for name in shards if not (folder / name).is_file())
        if missing:
            raise InputError(
                f"{what}: the shard index {index} names {len(missing)} shard(s) that are not in {folder} "
                f"({', '.join(missing[:3])}). {fix}"
            )
    for path in sorted(folder.glob("*.safetensors")):
        problem = _safetensors_problem(path)
        if problem is not None:
            raise InputError(
                f"{what}: the weights file {path} {problem} (an interrupted download or copy, or a full disk). {fix}"
            )


def _safetensors_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file's layout (an 8-byte little-endian header size, a JSON header of that
    size, then the tensors' bytes at the header's `data_offsets`), or None when its size is the one described."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        start = handle.read(8)
        if len(start) < 8:
            return f"is cut short: it holds {size} bytes, less than a header"
        length = int.from_bytes(start, "little")
        if length > MAX_SAFETENSORS_HEADER or 8 + length > size:
            return f"is cut short: it holds {size:,} bytes, less than its {length:,}-byte header"
        try:
            header = json.loads(handle.read(length))
            ends = [int(entry["data_offsets"][1]) for key, entry in header.items() if key != "__metadata__"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "has a garbled header"
    expected = 8 + length + max(ends, default=0)
    if size < expected:
        return f"is cut short: it holds {size:,} bytes, but its header describes {expected:,}"
    return None


# --------------------------------------------------------------------------------------------------------------------
# Writing outputs whole

FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def full_disk_error(path: str | os.PathLike, error: OSError) -> OutputError:
    """The one-line error of a write that ran out of space (or quota)."""
    return OutputError(
        f"No space left to write {path} ({error.strerror or error}). Free some space (or choose an output folder on "
        "another disk) and run the same command again: finished work is kept and resumed.",
    )


UNWRITABLE_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)


def unwritable_error(path: str | os.PathLike, error: OSError) -> OutputError:
    """The one-line error of a write refused by the folder (made read-only or immutable during the run)."""
    return OutputError(
        f"Cannot write {path} ({error.strerror or error}): its folder became unwritable during the run. Make it "
        "writable again (or choose another output folder) and run the same command again: finished work is kept "
        "and resumed.",
    )


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """Write `path` whole or not at all: yields a temporary path in the same folder (same suffix, so writers that read
    the format from it, like matplotlib, still do), whose file is synced and renamed onto `path` when the block ends.

    An exception (an interrupt, a full disk) removes the temporary file and leaves any earlier `path` as it was; a
    full disk becomes an `OutputError` naming `path`.
    """
    path = Path(path)
    temporary = path.with_name(f".{path.stem}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}{path.suffix}")
    try:
        yield temporary
        descriptor = os.open(temporary, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, path)
    except OSError as error:
        if error.errno in FULL_DISK_ERRNOS and not isinstance(error, OutputError):
            raise full_disk_error(path, error) from error
        if error.errno in UNWRITABLE_ERRNOS and not isinstance(error, OutputError):
            raise unwritable_error(path, error) from error
        raise
    finally:
        with contextlib.suppress(OSError):  # a folder made read-only or full meanwhile: the first error is reported
            temporary.unlink()


def write_text_atomic(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    """`Path(path).write_text(text)`, written whole or not at all (`atomic_output`)."""
    with atomic_output(path) as temporary:
        temporary.write_text(text, encoding=encoding)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """`Path(path).write_bytes(data)`, written whole or not at all (`atomic_output`)."""
    with atomic_output(path) as temporary:
        temporary.write_bytes(data)


def read_json_output(path: str | os.PathLike, fix: str) -> Any:
    """A JSON file an earlier run wrote; a cut or garbled one (an interrupted write or a full disk, before trl-nca
    wrote its files whole) is an `InputError` naming the file and `fix`, what to do about it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(
            f"{path} is cut or garbled ({getattr(error, 'msg', error)}), e.g. by an interrupted run or a full disk. "
            f"{fix}"
        ) from None


# --------------------------------------------------------------------------------------------------------------------
# One writer per output folder

LOCK_FILE = ".trl-nca.lock"


class FolderInUseError(InputError):
    """Another live process holds the output folder's lock; the message names the folder and that process."""


LOCK_DESCRIPTORS: set[int] = set()
"""The descriptors of the locks this process holds: a forked worker closes its copies (`close_inherited_locks`)."""


def close_inherited_locks() -> None:
    """In a forked worker: close the copies of the parent's lock descriptors, so that the lock ends with the parent
    (an `flock` lasts while any copy of its descriptor is open)."""
    for descriptor in list(LOCK_DESCRIPTORS):
        with contextlib.suppress(OSError):
            os.close(descriptor)
    LOCK_DESCRIPTORS.clear()


def _process_start(pid: int) -> str | None:
    """When the process `pid` started (Linux: clock ticks since boot, `/proc/PID/stat` field 22), or None where that
    cannot be read: with the pid, it names one process, never a later one the pid is reused for."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces and brackets
    return fields[19] if len(fields) > 19 else None


def _lock_record(command: str) -> str:
    """What a lock file says of its holder: "pid N, COMMAND" and, where it can be read, "; started T"."""
    start = _process_start(os.getpid())
    return f"pid {os.getpid()}, {command}" + ("" if start is None else f"; started {start}")


def _holder_is_gone(holder: str) -> bool:
    """Whether the process a lock file names ("pid N, command; started T") is no longer running on this machine: no
    process has that pid, or the one that has it started at another time (the pid was reused)."""
    record, _, started = holder.partition("; started ")
    words = record.replace(",", " ").split()
    if len(words) < 2 or words[0] != "pid" or not words[1].isdigit():
        return False
    try:
        os.kill(int(words[1]), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, owned by another user
        pass
    now = _process_start(int(words[1]))
    return bool(started.strip()) and now is not None and now != started.strip()


LOCK_RECORD_WAIT_S = 2.0
"""How long a refused process waits for the holder's record: the holder writes it just after taking the lock, so a
process refused in between would otherwise find the file empty."""


def _lock_holder(path: Path) -> str:
    """The record of the lock file `path`, waiting up to `LOCK_RECORD_WAIT_S` for its holder to write it."""
    deadline = time.monotonic() + LOCK_RECORD_WAIT_S
    while True:
        with contextlib.suppress(OSError):
            text = path.read_text(encoding="utf-8").strip()
            if text:
                return text
        if time.monotonic() >= deadline:
            return "pid unknown"
        time.sleep(0.02)


@contextlib.contextmanager
def output_folder_lock(folder: str | os.PathLike, command: str, option: str = "output_dir") -> Iterator[Path]:
    """Hold `folder`'s lock for as long as the block runs: one writer per output folder.

    The lock is an OS lock (`fcntl.flock`) on `folder/.trl-nca.lock`, so it ends with its process, however it ends (a
    SIGKILLed run leaves no stale lock). A second process asking for it meanwhile gets `FolderInUseError` at once,
    naming the folder and the holder's pid and command. The lock file records its holder's pid and start time: a
    process that still holds the lock although the run named there is gone (its pid ended, or now belongs to a process
    started later) holds a stale one, which is taken over with a line. On exit the lock file is removed, and so is
    `folder` when this call created it and it is still empty (a run refused by a later check leaves nothing behind).
    `option` is how the command names the folder in its messages (`--output-dir` for eval and analyze).
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{option} {str(folder)!r} is a file, not a folder; give a folder path (new or existing).")
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(
            f"Cannot create the output folder {str(folder)!r}: {error.strerror or error}. Give a folder in a place "
            "you can write to."
        ) from None

    def in_use(holder: str) -> FolderInUseError:
        return FolderInUseError(
            f"{folder} is in use by another trl-nca run ({holder.partition('; started ')[0]}); one run writes into a "
            "folder at a time. Wait for it to end, or give another output_dir."
        )

    try:
        with _held_lock(folder / LOCK_FILE, folder, command, in_use) as path:
            yield path
    finally:
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty


@contextlib.contextmanager
def output_file_lock(path: str | os.PathLike, command: str, option: str) -> Iterator[Path]:
    """Hold the lock of the output file `path` for as long as the block runs: one writer per output file (for a
    command whose output is a file, like `trl-nca experience --output`). `path` is checked first
    (`check_output_file`); the lock is `output_folder_lock`'s, on `.NAME.trl-nca.lock` next to the file, so other
    files of the same folder stay free. Yields the checked path."""
    path = check_output_file(path, option)

    def in_use(holder: str) -> FolderInUseError:
        return FolderInUseError(
            f"{path} is being written by another trl-nca run ({holder.partition('; started ')[0]}); one run writes a "
            f"file at a time. Wait for it to end, or give another {option}."
        )

    with _held_lock(path.with_name(f".{path.name}{LOCK_FILE}"), path.parent, command, in_use):
        yield path


@contextlib.contextmanager
def _held_lock(path: Path, folder: Path, command: str, in_use: Callable[[str], FolderInUseError]) -> Iterator[Path]:
    """The OS lock (`fcntl.flock`) on the file `path` in `folder`, taken at once or refused with `FolderInUseError`
    (the error `in_use(holder)`); the file is removed when the block ends."""
    import fcntl

    if path.is_dir():
        raise InputError(
            f"{path} is a folder, but trl-nca keeps the lock of {folder} in a file of that name. Remove that folder "
            "(trl-nca never makes one there) and run the same command again."
        )
    while True:
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            if error.errno in FULL_DISK_ERRNOS:
                raise full_disk_error(path, error) from None
            raise InputError(
                f"Cannot write into the output folder {str(folder)!r}: {error.strerror or error}. Give a folder you "
                "can write to (or make this one writable)."
            ) from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            holder = _lock_holder(path)
            if not _holder_is_gone(holder):
                raise in_use(holder) from None
            # the lock's process is gone but a process it started still holds the lock (a worker of an older trl-nca
            # outliving its parent): the lock is stale, taken over on a fresh file
            logger.warning(
                "%s was held by %s, which is no longer running; taking the lock over.",
                path,
                holder.partition("; started ")[0],
            )
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        try:  # the holder before us may have removed the file between our open and our lock: lock the file now there
            same = os.fstat(descriptor).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(descriptor)
    try:
        with contextlib.suppress(OSError):  # the record of the holder: a full disk keeps the lock all the same
            os.ftruncate(descriptor, 0)
            os.write(descriptor, f"{_lock_record(command)}\n".encode())
        LOCK_DESCRIPTORS.add(descriptor)
        yield path
    finally:
        LOCK_DESCRIPTORS.discard(descriptor)
        # a folder made read-only, immutable or full during the run: the lock ends with its descriptor anyway, and
        # the error that ended the run is the one reported (a leftover file is no stale lock: nobody holds it)
        with contextlib.suppress(OSError):
            path.unlink()
        with contextlib.suppress(OSError):
            os.close(descriptor)


def check_output_file(path: str | os.PathLike, option: str) -> Path:
    """An output file the command will write at its end, checked before any work: not a folder, and its folder
    creatable and writable (a file is created there and removed). Returns the path; a problem is an `InputError`
    naming `option` (e.g. '--output') and the fix."""
    path = Path(path)
    if path.is_dir():
        raise InputError(
            f"{option} {str(path)!r} is a folder; give the path of a file to write (e.g. {path / 'out.txt'})."
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.with_name(f".{path.name}.probe-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        probe.touch()
        probe.unlink()
    except OSError as error:
        if error.errno in FULL_DISK_ERRNOS:
            raise full_disk_error(path, error) from None
        raise InputError(
            f"{option} {str(path)!r} cannot be written: {error.strerror or error} in {str(path.parent)!r}. Give a path "
            "in a folder you can write to."
        ) from None
    return path
