"""The per-item JSONL store of paired records: append as items finish, reload (and repair) on resume."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..inputs import write_bytes_atomic
from .errors import EvalInputError
from .records import PairedRecord


logger = logging.getLogger(__name__)


def append_records(path: str | os.PathLike, records: Iterable[PairedRecord]) -> None:
    """Append records to a JSONL file, one per line, flushed and synced so an interruption loses at most one line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def load_records(
    path: str | os.PathLike,
    expected_run_key: str | None = None,
    *,
    repair: bool = False,
    same_run: Callable[[Mapping[str, Any]], bool] | None = None,
) -> dict[str, PairedRecord]:
    """Records of a JSONL file by item id; the file is only read unless `repair=True`.

    A half-written last line (what an interruption leaves behind) is left out with a warning. With `repair=True` (the
    evaluation runner, which appends to the file next) it is also cut off the file, and a complete last record missing
    its newline gets one, so the next append starts on a fresh line. A command that was only given the file to read
    (`trl-nca analyze`, reports) never changes it. A corrupt line elsewhere, or a record from a run with another
    `run_key`, raises `EvalInputError`, unless `same_run(meta)` says the record's other key is this run's under
    another spelling of its paths. Should an id appear twice, the first record wins.
    """
    path = Path(path)
    if not path.exists():
        return {}
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    tail = lines.pop()  # the bytes after the last newline: b"" for a cleanly written file
    records: dict[str, PairedRecord] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = _parse_record(line, number, path, expected_run_key, same_run)
        except (ValueError, KeyError, TypeError) as error:
            if isinstance(error, EvalInputError):
                raise
            reason = f"it has no {error.args[0]!r} field" if isinstance(error, KeyError) else str(error)
            raise EvalInputError(
                f"Line {number} of {path} is not a valid paired record: {reason}. Delete that line (its item is "
                "evaluated again), or use a new output folder."
            ) from error
        records.setdefault(record.item_id, record)
    if tail.strip():
        record = _last_line(raw, tail, len(lines) + 1, path, expected_run_key, same_run, repair)
        if record is not None:
            records.setdefault(record.item_id, record)
    return records


def _parse_record(line: bytes, number: int, path: Path, expected_run_key, same_run) -> PairedRecord:
    """One line of a records file as a record; one of another run (`expected_run_key`, `same_run`) is refused."""
    record = PairedRecord.from_dict(json.loads(line))
    key = record.meta.get("run_key")
    if (
        expected_run_key is not None
        and key is not None
        and key != expected_run_key
        and not (same_run is not None and same_run(record.meta))
    ):
        raise EvalInputError(
            f"{path} holds records of another run (line {number}: run key {key} != {expected_run_key}, i.e. a "
            "different model, context, scorer, sampling or game setting). Use a new output folder, or delete the file."
        )
    return record


def _last_line(raw: bytes, tail: bytes, number: int, path: Path, expected_run_key, same_run, repair: bool):
    """The record of a last line without its newline, or None when it is half-written (left out with a warning; with
    `repair`, cut off the file). With `repair`, a complete one gets its newline."""
    try:
        record = _parse_record(tail, number, path, expected_run_key, same_run)
    except EvalInputError:
        raise
    except (ValueError, KeyError, TypeError):
        if repair:
            logger.warning("Discarding the half-written last line of %s (interrupted run).", path)
            write_bytes_atomic(path, raw[: len(raw) - len(tail)])  # the file is whole, with or without it
        else:
            logger.warning("Leaving out the half-written last line %d of %s (interrupted run).", number, path)
        return None
    if repair:
        with path.open("ab") as f:
            f.write(b"\n")
    return record
