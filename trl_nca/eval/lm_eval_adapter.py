"""The one module that calls lm-evaluation-harness (`trl-nca eval --tasks`, `trl_nca.eval.harness`).

Everything trl-nca asks of lm-eval goes through the functions below, and each uses lm-eval's public API only:

- `TaskManager(include_path=..., include_defaults=...)`, its `all_tasks` and `load([name])["tasks"]`: the task index
  and the tasks;
- a task's `config` (`TaskConfig.to_dict(keep_callable=True)`), `aggregation()`, `doc_to_text`, `doc_to_choice`,
  `doc_to_prefix`, `fewshot_context`, `set_fewshot_seed`, `eval_docs`, `dataset`, `task_name`, `get_config`,
  `dump_config`;
- `ConfigurableTask(config=...)`: the with-context view of a task is a task of its own, built once from the task's
  config with the context's change (its `description` or `doc_to_text`) and the documents already loaded (as its
  `custom_dataset`), never a config rewritten and restored;
- `simple_evaluate(model, tasks=[task], ..., log_samples=True)` and its logged samples;
- the model types: `lm_eval.models.huggingface.HFLM` around a loaded model, and `lm_eval.api.registry.get_model`.

No private name of lm-eval is used. The versions this module is tested with are `TESTED_VERSIONS`, the range of the
`harness` extra in pyproject.toml (tests/eval/test_lm_eval_adapter.py checks that the two agree and that the installed
version is one of them; `.ci/run` runs the harness tests once per version).

lm-eval's own log notices and progress bars are left out of a run's output unless `--verbose` (`quiet_lm_eval`).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import errors as hub

from ..console import verbose
from ..core.engines import engine_defaults, vllm_distribution_alias
from .errors import EvalInputError


HARNESS_INSTALL = 'pip install "trl-nca[harness]"'
TESTED_VERSIONS = ("0.4.12", "0.4.13")  # the range of the `harness` extra (pyproject.toml), each one tested


def import_lm_eval():
    """The `lm_eval` module, or one line naming the extra that installs it."""
    try:
        import lm_eval
        import lm_eval.tasks  # noqa: F401  (the task manager; fails too when a dependency of lm-eval is missing)
    except ImportError as error:
        raise EvalInputError(
            f"Harness tasks (--tasks) run lm-evaluation-harness, which is not installed ({error}). Install it with "
            f"`{HARNESS_INSTALL}`."
        ) from error
    return lm_eval


def lm_eval_version() -> str | None:
    try:
        return version("lm_eval")
    except PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------------------------- quiet output


class WithoutBars(io.TextIOBase):
    """A text stream that passes whole lines to `target` except a progress bar's (tqdm redraws a bar with `\\r`)."""

    def __init__(self, target):
        self.target, self.pending = target, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if line and "\r" not in line:
                self.target.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.target.flush()

    def isatty(self) -> bool:
        return False

    def finish(self) -> None:
        if self.pending and "\r" not in self.pending:
            self.target.write(self.pending)
        self.pending = ""


@contextlib.contextmanager
def quiet_lm_eval() -> Iterator[None]:
    """Within this block lm-eval's log notices (below errors) and its progress bars are not printed, unless
    `--verbose` (`trl_nca.console.verbose`); every other line on stderr passes."""
    if verbose():
        yield
        return
    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.ERROR)
    stream = WithoutBars(sys.stderr)
    try:
        with contextlib.redirect_stderr(stream):
            yield
    finally:
        stream.finish()
        logger.setLevel(level)


# ---------------------------------------------------------------------------------------------------- the task index

_MANAGERS: dict[tuple[tuple[str, ...], bool], Any] = {}


def task_index(paths: Sequence[str | os.PathLike], include_defaults: bool = True):
    """lm-eval's `TaskManager` for the task folders `paths` (and lm-eval's own tasks with `include_defaults`), one per
    process and arguments: building the index of lm-eval's own tasks takes seconds."""
    import_lm_eval()
    from lm_eval.tasks import TaskManager

    key = (tuple(str(Path(p).resolve()) for p in paths), include_defaults)
    if key not in _MANAGERS:
        with quiet_lm_eval():
            _MANAGERS[key] = TaskManager(
                include_path=[str(p) for p in paths] or None, include_defaults=include_defaults
            )
    return _MANAGERS[key]


def known_names(manager) -> list[str]:
    """Every task, group and tag name the index knows."""
    return list(manager.all_tasks)


class _TaskYamlLoader(yaml.SafeLoader):
    """YAML as lm-eval's task files write it: any tag (`!function utils.load_docs`) read as its text."""


_TaskYamlLoader.add_multi_constructor("!", lambda loader, suffix, node: loader.construct_scalar(node))


def _read_task_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A task file and the files it includes (`include:`, relative to its folder), as lm-eval reads them; an error
    names the file that fails and why."""
    try:
        config = yaml.load(path.read_text(encoding="utf-8"), Loader=_TaskYamlLoader)  # noqa: S506 (SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ValueError(f"{path}: {' '.join(str(error).split())}") from error
    if not isinstance(config, dict):
        raise ValueError(f"{path}: a task file holds a mapping (task: NAME, ...), not a {type(config).__name__}")
    included = config.get("include")
    if included is not None:
        target = Path(str(included))
        target = target if target.is_absolute() else path.parent / target
        if not target.is_file():
            raise ValueError(f"{path}: its include: {included} names no file ({target} does not exist)")
        if target.resolve() not in seen:
            try:
                _read_task_yaml(target, (*seen, path.resolve()))
            except ValueError as error:
                raise ValueError(f"{path}: its include: {included}: {error}") from error
    return config


def unreadable_task_files(paths: Sequence[str | os.PathLike]) -> list[str]:
    """One line per task YAML under `paths` that lm-eval's index skips (it logs why at debug level only): a file that
    does not parse, holds no mapping, or includes a file that is missing. Each line names the file and its error."""
    problems = []
    for root in paths:
        for path in sorted(Path(root).glob("**/*.yaml")):
            try:
                _read_task_yaml(path)
            except ValueError as error:
                problems.append(str(error))
    return problems


def defining_files(problems: Sequence[str], name: str) -> list[str]:
    """The problems of `unreadable_task_files` whose file declares the task `name` (`task: name`)."""
    pattern = re.compile(rf"^\s*(task|group)\s*:\s*['\"]?{re.escape(name)}['\"]?\s*$", re.M)
    found = []
    for problem in problems:
        path = Path(problem.split(": ", 1)[0])
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if pattern.search(path.read_text(encoding="utf-8")):
                found.append(problem)
    return found


# ---------------------------------------------------------------------------------------------------- loading tasks


def _hub_error_kinds() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """The exception classes of a Hub that cannot be reached, and of a dataset the Hub does not have."""
    from datasets.exceptions import DatasetNotFoundError

    unreachable: list[type] = [ConnectionError, TimeoutError, hub.OfflineModeIsEnabled, hub.LocalEntryNotFoundError]
    for module, name in (
        ("httpx", "TransportError"),
        ("requests.exceptions", "ConnectionError"),
        ("requests.exceptions", "Timeout"),
    ):
        with contextlib.suppress(ImportError, AttributeError):  # the HTTP clients huggingface_hub and datasets use
            unreachable.append(getattr(importlib.import_module(module), name))
    return tuple(unreachable), (DatasetNotFoundError, hub.RepositoryNotFoundError)


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def hub_failure(error: BaseException) -> str | None:
    """`unreachable` when loading a task's documents failed because the Hub could not be reached (offline mode, the
    network), `absent` when the Hub has no such dataset, else None; by the exception's class and its causes."""
    unreachable, absent = _hub_error_kinds()
    chain = list(_chain(error))
    if any(isinstance(e, unreachable) for e in chain):
        return "unreachable"
    if any(isinstance(e, absent) for e in chain):
        return "absent"
    return None


def load_task(manager, name: str) -> dict[str, Any]:
    """lm-eval's tasks of `name` (a group or tag expands to its tasks), keyed by task name, their documents loaded;
    a task whose documents are on a Hub that cannot be reached, or not there, is one line naming it."""
    try:
        with quiet_lm_eval():
            return dict(manager.load([name])["tasks"])
    except Exception as error:  # lm-eval raises what `datasets` and the task's own code raise, of many types
        failure = hub_failure(error)
        if failure == "unreachable":
            raise EvalInputError(
                f"Harness task {name!r} reads its documents from the Hugging Face Hub, which cannot be reached here "
                f"({type(error).__name__}), and they are not in the datasets cache: its data must be local or cached. "
                "Run it once where the Hub is reachable, or point the task's dataset_path at local files "
                "(dataset_path: json, dataset_kwargs: {data_files: ...})."
            ) from error
        if failure == "absent":
            raise EvalInputError(
                f"Harness task {name!r} reads its documents from a Hugging Face Hub dataset that does not exist or is "
                f"not public ({error}). Check the task's dataset_path, or log in to the Hub for a gated dataset."
            ) from error
        raise EvalInputError(f"Harness task {name!r} could not be loaded by lm-eval: {error}") from error


# ---------------------------------------------------------------------------------------------------- one task


def computed_metrics(task) -> list[str]:
    """The per-document metrics the task computes, in its `metric_list`'s order."""
    return list(task.aggregation())


def listed_metrics(task) -> list[str]:
    return [m["metric"] for m in (task.config.metric_list or []) if isinstance(m.get("metric"), str)]


def filter_names(task) -> list[str]:
    """The task's filters as lm-eval names them in its results (`none` for a task without `filter_list`)."""
    listed = task.config.filter_list
    if isinstance(listed, list):
        names = [entry.get("name") for entry in listed if isinstance(entry, Mapping) and entry.get("name")]
        if names:
            return names
    return ["none"]


def averaged(task, metric: str) -> tuple[bool, str]:
    """Whether the task averages `metric` over documents (a 0/1 verdict per document can then decide a right answer),
    and the name of its aggregation."""
    from lm_eval.api.metrics import mean

    aggregation = task.aggregation().get(metric)
    return aggregation is mean, getattr(aggregation, "__name__", str(aggregation))


def multiple_inputs(task, doc: Mapping[str, Any]) -> bool:
    """Whether the task asks several inputs per document (Winogrande's style: `doc_to_text` gives a choice index)."""
    return not isinstance(task.doc_to_text(doc), str)


def task_variant(task, **changes) -> Any:
    """A task of its own built from `task`'s config with `changes` (lm-eval's `ConfigurableTask(config=...)`), on the
    documents `task` has already loaded: the with-context view of a task. Few-shot examples keep the original
    formatting (the config's `fewshot_config` holds it)."""
    from lm_eval.api.task import ConfigurableTask

    if not isinstance(task, ConfigurableTask):
        raise EvalInputError(
            f"Harness task {task.task_name!r} is a Python task class, not built from a config, so its prompt cannot "
            "take a per-document context or a context in the user turn. Give one fixed context (--context-text or "
            "--context-file) with --placement system."
        )
    config = task.config.to_dict(keep_callable=True)
    loaded = task.dataset
    config.update(changes, custom_dataset=lambda **_: loaded)
    with quiet_lm_eval():
        return ConfigurableTask(config=config)


def render_prompt(
    task,
    doc: Mapping[str, Any],
    *,
    num_fewshot: int,
    system_instruction: str | None,
    fewshot_seed: int,
    fewshot_as_multiturn: bool,
    chat: Callable[..., str],
) -> str:
    """The prompt lm-eval builds for `doc` (few-shot examples, system message, chat template `chat`), as one text."""
    task.set_fewshot_seed(seed=fewshot_seed)
    prompt = task.fewshot_context(
        doc,
        num_fewshot,
        system_instruction=system_instruction,
        apply_chat_template=True,
        fewshot_as_multiturn=fewshot_as_multiturn,
        chat_template=chat,
        gen_prefix=task.doc_to_prefix(doc),
    )
    return prompt if isinstance(prompt, str) else "\n".join(prompt)


@dataclass(frozen=True)
class RunSettings:
    """How one lm-eval run goes: each field is the `simple_evaluate` argument of the same meaning."""

    num_fewshot: int | None
    fewshot_as_multiturn: bool
    gen_kwargs: Mapping[str, Any] | None
    seed: int
    fewshot_seed: int


def run_task(lm, task, manager, *, doc_ids: Sequence[int], system_instruction: str | None, settings: RunSettings):
    """One `simple_evaluate` of `task` with lm-eval's model `lm` on the documents `doc_ids` (a prefix of the task's
    documents as lm-eval's `limit`, any other set as its `samples`), the chat template applied: its logged samples."""
    lm_eval = import_lm_eval()
    ordered = sorted(int(i) for i in doc_ids)  # lm-eval maps a `samples` list back to doc_ids in ascending order
    subset: dict[str, Any] = {}
    if ordered != list(range(len(ordered))):
        subset["samples"] = {task.task_name: ordered}
    elif len(ordered) < len(task.eval_docs):
        subset["limit"] = len(ordered)
    with quiet_lm_eval():
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=[task],
            task_manager=manager,
            num_fewshot=settings.num_fewshot,
            system_instruction=system_instruction,
            apply_chat_template=True,
            fewshot_as_multiturn=settings.fewshot_as_multiturn,
            gen_kwargs=dict(settings.gen_kwargs or {}) or None,
            log_samples=True,
            bootstrap_iters=0,
            random_seed=settings.seed,
            numpy_random_seed=settings.seed,
            torch_random_seed=settings.seed,
            fewshot_random_seed=settings.fewshot_seed,
            **subset,
        )
    return results["samples"][task.task_name]


# ---------------------------------------------------------------------------------------------------- model types


@dataclass(frozen=True)
class ModelToRun:
    """What an lm-eval model type needs: the loaded model and tokenizer (a backend that loads its own gets None for
    the model), the model's path and adapter, and the run's settings."""

    model: Any
    tokenizer: Any
    path: str | None = None
    adapter: str | None = None
    dtype: str = "auto"
    tokenizer_path: str | None = None
    seed: int = 0
    batch_size: int = 1
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LMBackend:
    """One `--backend` of `trl-nca eval --tasks`: `build` makes lm-eval's model from a `ModelToRun`; `loads_model`
    says whether trl-nca loads the weights with Transformers first (and passes them), or the backend loads its own."""

    name: str
    build: Callable[[ModelToRun], Any]
    loads_model: bool
    help: str


LM_BACKENDS: dict[str, LMBackend] = {}


def register_lm_backend(backend: LMBackend) -> LMBackend:
    """Add a `--backend` for harness tasks (a name already taken is refused)."""
    if backend.name in LM_BACKENDS:
        raise ValueError(f"The harness backend {backend.name!r} is already registered.")
    LM_BACKENDS[backend.name] = backend
    return backend


def build_lm(backend: str, spec: ModelToRun):
    """lm-eval's model of `backend` for `spec` (its notices left out of the output, as every lm-eval call's)."""
    if backend not in LM_BACKENDS:
        raise EvalInputError(f"--backend {backend!r} cannot run harness tasks; use one of {sorted(LM_BACKENDS)}.")
    import_lm_eval()
    with quiet_lm_eval():
        return LM_BACKENDS[backend].build(spec)


def _hf_lm(spec: ModelToRun):
    from lm_eval.models.huggingface import HFLM

    return HFLM(
        pretrained=spec.model,
        tokenizer=spec.tokenizer,
        batch_size=spec.batch_size,
        chat_template_args=dict(spec.chat_template_kwargs) or None,
    )


def _vllm_lm(spec: ModelToRun):
    """lm-eval's vLLM model type. Its module asks for the distribution `vllm` by name, which vLLM's CPU build is not
    (`vllm_distribution_alias`); engines built on the CPU build run eager (`engine_defaults`)."""
    vllm_distribution_alias()
    from lm_eval.api.registry import get_model

    args: dict[str, Any] = {"pretrained": spec.path, "dtype": spec.dtype, "seed": spec.seed, **engine_defaults()}
    if spec.adapter:
        args["lora_local_path"] = spec.adapter
    if spec.tokenizer_path:
        args["tokenizer"] = spec.tokenizer_path
    if spec.chat_template_kwargs:
        args["chat_template_args"] = dict(spec.chat_template_kwargs)
    return get_model("vllm").create_from_arg_obj(args, {"batch_size": spec.batch_size})


register_lm_backend(LMBackend("hf", _hf_lm, True, "the model loaded with Transformers, in lm-eval's HFLM"))
register_lm_backend(LMBackend("vllm", _vllm_lm, False, "lm-eval's vLLM model type, given the model's path"))
