"""Finding lm-evaluation-harness tasks by name: the shipped tasks, the user's task folders (`--include-path`) and
lm-eval's own, loaded through lm-eval's index (`trl_nca.eval.lm_eval_adapter`). An unknown name is one line that
names the local task file lm-eval could not read, or lm-eval's closest names."""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import resources
from ..console import plural
from .errors import EvalInputError
from .lm_eval_adapter import defining_files, known_names, load_task, task_index, unreadable_task_files


def bundled_tasks_folder() -> Path:
    """The folder of the harness tasks shipped with trl-nca (`island_facts_mc`), always searched."""
    return Path(resources.__file__).parent / "harness"


def task_folders(include_path: Sequence[str] | str | os.PathLike | None) -> list[Path]:
    """The shipped tasks' folder and the user's task folders (which come last: their tasks win over ours)."""
    paths = [include_path] if isinstance(include_path, (str, os.PathLike)) else list(include_path or [])
    for path in paths:
        if not Path(path).is_dir():
            raise EvalInputError(f"--include-path {path} is not a folder of task YAML files. Give the folder.")
    return [bundled_tasks_folder(), *(Path(p) for p in paths)]


def task_manager(include_path: Sequence[str] | str | None, include_defaults: bool = True):
    """lm-eval's task index of the shipped tasks, the folders `include_path` and (with `include_defaults`) lm-eval's
    own tasks."""
    return task_index(task_folders(include_path), include_defaults)


def resolve_task_manager(names: Sequence[str], include_path):
    """The manager that knows every name: the local folders alone when they hold all of them (fast), else lm-eval's
    own tasks too. An unknown name is one line: the local task file that declares it and why lm-eval could not read
    it, or else lm-eval's closest names and the local files it could not read."""
    local = task_manager(include_path, include_defaults=False)
    if all(name in known_names(local) for name in names):
        return local
    manager = task_manager(include_path)
    for name in names:
        if name not in known_names(manager):
            raise _unknown_task(name, manager, include_path)
    return manager


def _unknown_task(name: str, manager, include_path) -> EvalInputError:
    problems = unreadable_task_files(task_folders(include_path)[1:]) if include_path else []
    declaring = defining_files(problems, name)
    if declaring:
        return EvalInputError(
            f"Harness task {name!r} is declared in a task file lm-eval could not read, so lm-eval does not know it: "
            f"{declaring[0]}. Mend the file."
        )
    close = difflib.get_close_matches(name, known_names(manager), n=5, cutoff=0.5)
    hint = f" Closest lm-eval names: {', '.join(close)}." if close else ""
    where = f" or under --include-path {include_path}" if include_path else ""
    unread = (
        f" lm-eval skipped {plural(len(problems), 'task file')} it could not read there: {'; '.join(problems[:3])}."
        if problems
        else ""
    )
    return EvalInputError(
        f"Unknown harness task {name!r}: lm-eval has no task, group or tag of that name{where}.{hint}{unread} "
        "List them with `lm-eval ls tasks`, or give --include-path DIR for a local task YAML."
    )


def load_tasks(names: Sequence[str], include_path=None) -> dict[str, Any]:
    """lm-eval's task objects for `names` (groups and tags expand to their tasks), keyed by task name; their documents
    are loaded now, so a task whose data must come from an unreachable Hub is one line naming it."""
    manager = resolve_task_manager(names, include_path)
    tasks: dict[str, Any] = {}
    for name in names:
        tasks.update(load_task(manager, name))
    return tasks
