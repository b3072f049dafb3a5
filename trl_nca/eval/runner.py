"""The one runner of paired evaluations, for dataset items and game episodes alike.

A *task* says what is evaluated (`PairedTask`): `trl_nca.eval.PairedEvaluator` for dataset items (each item generated
once without and once with the context, then scored), `trl_nca.eval.games.GameEvaluation` for game maps (each map
played once without and once with the experience). The runner does the rest, the same way for both:

- one provenance record (`run_provenance`): the model's identity and weights fingerprint, the tokenizer, the task's
  settings (context, scorer or game), the sampling settings, the library versions;
- one run key (`run_key`): a hash of that record without the library versions and the batch size (which changes no
  sample), stored in every record;
- one resume mechanism: with an output file, records are appended as they finish (`store.append_records`); a rerun
  loads them, refuses a file of another run (other key) or of changed items (other item fingerprint), and plays only
  the items not yet there, so an interrupted run ends with the records of an uninterrupted one;
- one generate-function type (`trl_nca.core.sampling.GenerateFn`), built from the backend with the run's sampling
  settings on its first call (a task that never calls it, such as an lm-eval task, builds no backend).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..console import progress_bar
from ..core.sampling import GenerateFn, GenerationBackend, GenerationSettings, HFBackend, generate_fn, policy_mode
from ..inputs import sha256_text
from .errors import EvalInputError
from .provenance import library_versions, model_identity
from .records import PairedRecord
from .store import append_records, load_records


@dataclass
class TaskItem:
    """One item of a task: its id and the sha256 of what its record depends on besides the run settings."""

    item_id: str
    fingerprint: str


class PairedTask(Protocol):
    """What the runner evaluates (see the module docstring)."""

    def describe(self) -> dict[str, Any]:
        """The task's part of the provenance record (context, scorer or game settings, chat template options)."""
        ...

    def prepare(self, tokenizer) -> Sequence[TaskItem]:
        """The items, in report order, with fingerprints for `tokenizer` (checked against records on resume)."""
        ...

    def play(
        self,
        items: Sequence[TaskItem],
        generate: GenerateFn,
        tokenizer,
        settings: GenerationSettings,
        on_records: Callable[[list[PairedRecord]], None],
    ) -> None:
        """Evaluate `items` with `generate` (built with `settings`, whose seed and batch size the task may use), passing
        records to `on_records` as soon as they are finished."""
        ...


def tokenizer_fingerprint(tokenizer) -> str | None:
    """sha256 of what shapes prompt tokens: the vocabulary (token -> id) and the chat template."""
    if tokenizer is None or not hasattr(tokenizer, "get_vocab"):
        return None
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return sha256_text(json.dumps([vocab, getattr(tokenizer, "chat_template", None)], default=str))


def run_provenance(
    task: PairedTask,
    model=None,
    tokenizer=None,
    *,
    generation: GenerationSettings,
    model_path: str | None = None,
    adapter: str | None = None,
) -> dict[str, Any]:
    """The provenance record of a run: model, tokenizer, the task's settings, sampling settings, library versions."""
    return {
        "model": model_identity(model, model_path, adapter),
        "tokenizer_sha256": tokenizer_fingerprint(tokenizer),
        **task.describe(),
        "generation": generation.to_dict(),
        "versions": library_versions(),
    }


def run_key(provenance: Mapping[str, Any]) -> str:
    """A short hash of what must match for records to be resumed: the provenance without the library versions and
    the batch size (samples do not depend on it, see `trl_nca.core.sampling`)."""
    keyed = {k: v for k, v in provenance.items() if k != "versions"}
    keyed["generation"] = {k: v for k, v in dict(keyed.get("generation") or {}).items() if k != "batch_size"}
    return sha256_text(json.dumps(keyed, sort_keys=True, default=str))[:16]


def plan_key(provenance: Mapping[str, Any]) -> str:
    """The part of `run_key` known before the model loads: the provenance without the model's identity (the task,
    its context, scorer and sampling, the tokenizer). A harness task's records carry it (`early_meta`), so a rerun
    with another context or task is refused before any model loads (`check_records_before_loading`)."""
    keyed = {k: v for k, v in provenance.items() if k not in ("versions", "model")}
    keyed["generation"] = {k: v for k, v in dict(keyed.get("generation") or {}).items() if k != "batch_size"}
    return sha256_text(json.dumps(keyed, sort_keys=True, default=str))[:16]


def early_meta(provenance: Mapping[str, Any]) -> dict[str, Any]:
    """What a record carries for `check_records_before_loading`: the `plan_key` and the model's and adapter's
    resolved paths."""
    identity = provenance.get("model") or {}
    return {
        "plan_key": plan_key(provenance),
        "model_paths": [identity.get("resolved_path"), identity.get("adapter_resolved_path")],
    }


def _first_meta(path: str | os.PathLike) -> Mapping[str, Any] | None:
    """The meta of the first complete record of a records file (None when there is none; the runner's own load
    reports a damaged file)."""
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip() and line.endswith("\n"):
                    meta = json.loads(line).get("meta")
                    return meta if isinstance(meta, dict) else None
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        return None
    return None


def _differences(recorded: Mapping[str, Any], now: Mapping[str, Any], prefix: str = "") -> list[str]:
    """`a.b: X, now Y` for each setting that differs between two provenance records (versions and the model's
    identity left out)."""
    found = []
    for key in sorted(set(recorded) | set(now), key=str):
        if key in ("versions", "model", "batch_size") or key.endswith("_version"):
            continue
        a, b = recorded.get(key), now.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            found += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            found.append(f"{prefix}{key}: {a!r}, now {b!r}")
    return found


def _other_model(recorded: Sequence[Any], now: Sequence[Any]) -> bool:
    """Whether the records' model or adapter is another one than this run's, by their resolved paths: two paths that
    differ and were both recorded, the recorded one still on disk (a folder since moved is left to the check after
    loading, which compares the weights) or neither of them on disk (two Hub ids)."""
    for old, new in zip(recorded, now, strict=False):
        if old is None or new is None or old == new:
            continue
        if os.path.exists(old) or not os.path.exists(new):
            return True
    return False


def check_records_before_loading(
    path: str | os.PathLike, provenance: Mapping[str, Any], recorded: Mapping[str, Any] | None = None
) -> None:
    """Refuse, before any model loads, a records file of another run: records with another `plan_key` (another task,
    context, metric or sampling, or another tokenizer) or of another model (`_other_model`). `provenance` is this
    run's, built without the model (`run_provenance(task, None, tokenizer, ...)`); `recorded`, the provenance the
    report of the earlier run holds (its `summary.json`), names what differs. The same check runs again once the
    model has loaded, on the whole run key (`run_paired`)."""
    meta = _first_meta(path)
    if meta is None or "plan_key" not in meta:
        return
    identity = provenance.get("model") or {}
    now_paths = (identity.get("resolved_path"), identity.get("adapter_resolved_path"))
    if meta["plan_key"] == plan_key(provenance) and not _other_model(meta.get("model_paths") or (), now_paths):
        return
    differences = _differences(recorded or {}, provenance) if recorded else []
    if meta["plan_key"] == plan_key(provenance):
        what = f"of another model ({meta.get('model')!r}, adapter {meta.get('adapter')!r})"
    elif differences:
        what = f"made with other settings ({'; '.join(differences[:3])})"
        if any(d.startswith("context.sha256") for d in differences) and str(
            (provenance.get("context") or {}).get("source")
        ).startswith("column:"):
            what += ", or another --limit (a per-document context's digest covers the documents evaluated)"
    else:
        what = "made with another task, context, metric, --limit, sampling or tokenizer"
    raise EvalInputError(
        f"{path} holds the records of another run, {what}; they cannot be resumed or mixed with this run's. Use "
        "another --output-dir, or delete the file to evaluate from scratch."
    )


def _spellings(path: str | None, resolved: str | None) -> set[str | None]:
    """What `model_identity` may have recorded as the resolved form of `path`, written elsewhere or earlier: the
    resolved path of now, and `path` itself (as normalised when absolute: the folder it named, since moved)."""
    found = {resolved, path}
    if path is not None and os.path.isabs(path):
        found.add(os.path.normpath(path))
    return found


def respelled_run(provenance: Mapping[str, Any], key: str) -> Callable[[Mapping[str, Any]], bool]:
    """Whether a record's meta, with a run key other than `key`, comes from this very run with its model or adapter
    path spelled otherwise (`out/c0`, `$PWD/out/c0`, `out/../out/c0`, or the folder before it moved): the key of
    this provenance with the record's spellings, everything else (weights fingerprint, tokenizer, settings) as now."""
    memo: dict[tuple[Any, Any], set[str]] = {}
    identity = dict(provenance.get("model") or {})

    def keys(model: Any, adapter: Any) -> set[str]:
        found = set()
        for resolved in _spellings(model, identity.get("resolved_path")):
            for adapter_resolved in _spellings(adapter, identity.get("adapter_resolved_path")):
                if identity.get("adapter_resolved_path") is None:
                    adapter_resolved = None
                respelled = {
                    **identity,
                    "name_or_path": model,
                    "resolved_path": resolved,
                    "adapter": adapter,
                    "adapter_resolved_path": adapter_resolved,
                }
                found.add(run_key({**provenance, "model": respelled}))
        return found

    def same_run(meta: Mapping[str, Any]) -> bool:
        if identity.get("fingerprint") is None:  # nothing but the paths tells the models apart
            return False
        spelled = (meta.get("model"), meta.get("adapter"))
        if not all(isinstance(value, (str, type(None))) for value in spelled):
            return False
        if spelled not in memo:
            memo[spelled] = keys(*spelled)
        return meta.get("run_key") in memo[spelled]

    return same_run


def check_resumed_items(done: Mapping[str, PairedRecord], items: Sequence[TaskItem], path) -> None:
    """Refuse to resume records whose item has changed (another prompt, label or tokenizer under the same id)."""
    if any("item_sha256" not in record.meta for record in done.values()):
        raise EvalInputError(
            f"{path} holds records without item fingerprints (written by an older trl-nca), so they cannot be checked "
            "against the dataset. Use a new output folder, or delete the file to evaluate from scratch."
        )
    changed = [
        item.item_id
        for item in items
        if item.item_id in done and done[item.item_id].meta.get("item_sha256") != item.fingerprint
    ]
    if changed:
        raise EvalInputError(
            f"{path} holds records of {len(changed)} item(s) whose prompt, label or tokenization differ from the "
            f"dataset now (ids {changed[:5]}{' ...' if len(changed) > 5 else ''}): the dataset changed since they were "
            "written. Use a new output folder, or delete the file to evaluate the new items from scratch."
        )


def run_paired(
    task: PairedTask,
    model,
    tokenizer,
    *,
    generation: GenerationSettings,
    output_path: str | os.PathLike | None = None,
    backend: GenerationBackend | None = None,
    provenance: Mapping[str, Any] | None = None,
    model_path: str | None = None,
    adapter: str | None = None,
    progress: bool = False,
    desc: str = "paired eval",
) -> list[PairedRecord]:
    """Evaluate `model` on every item of `task` and return the records in the task's order (see the module docstring).

    `backend` generates (default: `HFBackend(model, tokenizer)`); `provenance` replaces the record `run_provenance`
    would build (the run key is computed from it). The model is in eval mode meanwhile and put back as it was.
    """
    items = list(task.prepare(tokenizer))
    prov = (
        dict(provenance)
        if provenance is not None
        else run_provenance(task, model, tokenizer, generation=generation, model_path=model_path, adapter=adapter)
    )
    key = run_key(prov)
    done: dict[str, PairedRecord] = {}
    if output_path is not None:
        done = load_records(output_path, expected_run_key=key, repair=True, same_run=respelled_run(prov, key))
        check_resumed_items(done, items, output_path)
    todo = [item for item in items if item.item_id not in done]
    fingerprints = {item.item_id: item.fingerprint for item in items}
    common_meta = _run_meta(prov, generation, key)
    generate = _BuiltOnFirstCall(
        lambda: generate_fn(backend if backend is not None else HFBackend(model, tokenizer), generation)
    )
    # the policy samples (no dropout); every module gets its own mode back (a vLLM engine has none)
    with policy_mode(model) if isinstance(model, torch.nn.Module) else nullcontext():
        with _progress(len(todo), progress, desc=f"{desc} ({len(done)} done)") as bar:

            def on_records(records: list[PairedRecord]) -> None:
                for record in records:  # the task's own meta wins (a game's `seed` is the map's)
                    record.meta = {**common_meta, **record.meta, "item_sha256": fingerprints[record.item_id]}
                    record.meta["run_key"] = key
                if output_path is not None:
                    append_records(output_path, records)
                done.update((r.item_id, r) for r in records)
                bar.update(len(records))

            if todo:
                task.play(todo, generate, tokenizer, generation, on_records)
    return [done[item.item_id] for item in items]


class _BuiltOnFirstCall:
    """The run's generate function, built (with its backend) on its first call: a task whose answers come from
    elsewhere (an lm-eval task runs lm-eval's model) builds none."""

    def __init__(self, build: Callable[[], GenerateFn]):
        self._build, self._generate = build, None

    @property
    def built(self) -> bool:
        return self._generate is not None

    def __call__(self, prompts, seeds):
        if self._generate is None:
            self._generate = self._build()
        return self._generate(prompts, seeds)


def _run_meta(prov: Mapping[str, Any], generation: GenerationSettings, key: str) -> dict[str, Any]:
    """The meta every record of a run carries: the model, adapter, seed, sampling, versions and run key."""
    identity = prov.get("model") or {}
    return {
        "model": identity.get("name_or_path"),
        "adapter": identity.get("adapter"),
        "seed": generation.seed,
        # what shapes the samples; the batch size does not, and records of any batch size are interchangeable
        "sampling": {k: v for k, v in generation.to_dict().items() if k != "batch_size"},
        "versions": prov.get("versions"),
        "run_key": key,
    }


class _NullBar:
    def update(self, n: int) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def _progress(total: int, enabled: bool, desc: str):
    if not enabled:
        return _NullBar()

    return progress_bar(total, desc, "item")  # drawn on a terminal only (trl_nca.console.on_terminal)
