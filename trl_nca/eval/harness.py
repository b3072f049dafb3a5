"""Paired evaluation over lm-evaluation-harness tasks: each task run without and with the context, paired by `doc_id`.

lm-eval (`pip install trl-nca[harness]`, imported only when a harness task is asked for) builds every request, runs
the model and scores each document with the task's own metric; this module only chooses what the with-context view
adds to the prompt, runs `lm_eval.simple_evaluate` once per view (and sample), and joins the two runs' logged samples
by `doc_id` into the library's `PairedRecord`s, so the metrics, regimes, reports and resume of the paired evaluation
apply unchanged (`trl_nca.eval.runner.run_paired`).

Where the context goes, in lm-eval's own terms (`lm_eval.api.task.ConfigurableTask.fewshot_context`):

- a fixed context with placement `system`: `system_instruction`, which lm-eval puts first in the system message (the
  task's `description`, if any, follows it);
- a per-document context (a field of the task's documents) with placement `system`: the task's `description` becomes
  that field (lm-eval resolves it per document), followed by the task's own description, if any;
- placement `user`: the evaluated document's question (`doc_to_text`) is rewritten through the context template; few-
  shot examples keep their own text.

Prompts always go through the model's chat template (`apply_chat_template=True`): the context is a chat role's text.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..core.engines import engine_defaults, vllm_distribution_alias
from ..core.sampling import GenerationSettings
from ..core.views import ContextSpec, check_context
from ..inputs import sha256_text
from .errors import EvalInputError
from .records import PairedRecord, ViewOutcome
from .report import ModelRun, safe_name
from .runner import TaskItem, run_paired, run_provenance


logger = logging.getLogger(__name__)

HARNESS_INSTALL = "pip install trl-nca[harness]"
LOCAL_DATASET_BUILDERS = ("json", "csv", "parquet", "text", "arrow", "pandas")  # `dataset_path`s that read local files
SYSTEM_PROBE = "trl-nca system role probe 7f3a"  # a text no chat template adds by itself


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


@dataclass(frozen=True)
class HarnessOptions:
    """How the tasks run; each field is the lm-eval setting of the same meaning.

    Args:
        num_fewshot: few-shot examples per prompt (None: each task's own number).
        metric: the per-document 0/1 metric that decides correctness, `NAME` or `NAME,FILTER` as lm-eval reports it
            (None: the first metric of each task's `metric_list`, under its first filter).
        samples_per_view: with k > 1 each view runs k times (sample j of both views with the same seeds); for tasks
            that sample (`generate_until` with `do_sample`).
        seed: seed of python's, numpy's and torch's generators for each run (sample j: `seed + j`).
        fewshot_seed: seed of the few-shot sampler (lm-eval's default).
        gen_kwargs: overrides of the `generate_until` tasks' `generation_kwargs` (lm-eval's `--gen_kwargs`).
        batch_size: lm-eval's batch size.
        limit: the first N documents of each task only.
        chat_template_kwargs: extra chat template variables (lm-eval's `chat_template_args`).
    """

    num_fewshot: int | None = None
    metric: str | None = None
    samples_per_view: int = 1
    seed: int = 0
    fewshot_seed: int = 1234
    gen_kwargs: Mapping[str, Any] | None = None
    batch_size: int = 1
    limit: int | None = None
    fewshot_as_multiturn: bool = True
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        for name in ("num_fewshot", "limit"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise EvalInputError(f"{name} must be at least 0, got {value}.")
        if self.samples_per_view < 1:
            raise EvalInputError(f"samples_per_view must be at least 1, got {self.samples_per_view}.")


_MANAGERS: dict[tuple[tuple[str, ...], bool], Any] = {}


def bundled_tasks_folder() -> Path:
    """The folder of the harness tasks shipped with trl-nca (`island_facts_mc`), always searched."""
    from .. import resources

    return Path(resources.__file__).parent / "harness"


def task_manager(include_path: Sequence[str] | str | None, include_defaults: bool = True):
    """lm-eval's `TaskManager` for the local task folders `include_path` and the shipped tasks (one per process and
    arguments: building the index of lm-eval's own tasks takes seconds)."""
    import_lm_eval()
    from lm_eval.tasks import TaskManager

    paths = [include_path] if isinstance(include_path, (str, os.PathLike)) else list(include_path or [])
    for path in paths:
        if not Path(path).is_dir():
            raise EvalInputError(f"--include-path {path} is not a folder of task YAML files. Give the folder.")
    paths = [bundled_tasks_folder(), *paths]  # the user's folders come last: their tasks win over ours
    key = (tuple(str(Path(p).resolve()) for p in paths), include_defaults)
    if key not in _MANAGERS:
        _MANAGERS[key] = TaskManager(include_path=[str(p) for p in paths] or None, include_defaults=include_defaults)
    return _MANAGERS[key]


def resolve_task_manager(names: Sequence[str], include_path):
    """The manager that knows every name: the local folders alone when they hold all of them (fast), else lm-eval's
    own tasks too. An unknown name is one line with lm-eval's closest names."""
    local = task_manager(include_path, include_defaults=False)
    if all(name in local.all_tasks for name in names):
        return local
    manager = task_manager(include_path)
    for name in names:
        if name not in manager.all_tasks:
            close = difflib.get_close_matches(name, manager.all_tasks, n=5, cutoff=0.5)
            hint = f" Closest lm-eval names: {', '.join(close)}." if close else ""
            where = f" or under --include-path {include_path}" if include_path else ""
            raise EvalInputError(
                f"Unknown harness task {name!r}: lm-eval has no task, group or tag of that name{where}.{hint} "
                "List them with `lm-eval ls tasks`, or give --include-path DIR for a local task YAML."
            )
    return manager


def _is_hub_failure(error: BaseException) -> bool:
    """Whether loading a task's dataset failed because the Hub could not be reached (offline mode or the network)."""
    names = {cls.__name__ for cls in type(error).__mro__}
    hub_errors = {
        "ConnectionError",
        "OfflineModeIsEnabled",
        "DatasetNotFoundError",
        "LocalEntryNotFoundError",
        "HfHubHTTPError",
        "Timeout",
    }
    text = str(error)
    return bool(names & hub_errors) or "offline" in text.lower() or "Couldn't reach" in text


def load_tasks(names: Sequence[str], include_path=None) -> dict[str, Any]:
    """lm-eval's task objects for `names` (groups and tags expand to their tasks), keyed by task name; their documents
    are loaded now, so a task whose data must come from an unreachable Hub is one line naming it."""
    manager = resolve_task_manager(names, include_path)
    tasks: dict[str, Any] = {}
    for name in names:
        try:
            loaded = manager.load([name])
        except Exception as error:  # lm-eval raises what `datasets` raises, of many types
            if _is_hub_failure(error):
                raise EvalInputError(
                    f"Harness task {name!r} reads its documents from the Hugging Face Hub, which cannot be reached "
                    f"here ({type(error).__name__}), and they are not in the datasets cache: its data must be local "
                    "or cached. Run it once where the Hub is reachable, or point the task's dataset_path at local files "
                    "(dataset_path: json, dataset_kwargs: {data_files: ...})."
                ) from error
            raise EvalInputError(f"Harness task {name!r} could not be loaded by lm-eval: {error}") from error
        tasks.update(loaded["tasks"])
    return tasks


@dataclass(frozen=True)
class DocSample:
    """What lm-eval logged for one document in one run: the metric's value and the model's answer."""

    doc_id: int
    value: float
    prompt: str
    answer: str
    completion: str
    doc_hash: str


class HarnessTask:
    """One lm-eval task evaluated without and with a context: a `PairedTask` of the runner (`run_paired`).

    The checks (`check`) need no model: the metric, the context field, the system role of the chat template and the
    prompts' lengths against the model's positions. `run(model, tokenizer)` evaluates a loaded model (an lm-eval
    `LM`, e.g. `HFLM` or lm-eval's vLLM model, can be passed as `lm`); records are `PairedRecord`s whose views hold
    lm-eval's per-document metric value, answer and prompt.
    """

    def __init__(
        self, task, context: ContextSpec, options: HarnessOptions, *, manager=None, context_source: str | None = None
    ):
        self.task = task
        self.manager = manager  # the TaskManager that loaded it (else lm-eval indexes its tasks again on every run)
        self.name = task.task_name
        self.context = context
        self.context_source = context_source
        self.options = options
        self.output_type = task.get_config("output_type")
        self.metric, self.filter = self._metric_and_filter(options.metric)
        docs = list(task.eval_docs)
        count = len(docs) if options.limit is None else min(options.limit, len(docs))
        self.docs = docs[:count]
        if not self.docs:
            raise EvalInputError(f"Harness task {self.name!r} has no documents to evaluate.")
        self._check_context_field()

    # ------------------------------------------------------------------------------------------------ checks (no model)

    def _metric_and_filter(self, wanted: str | None) -> tuple[str, str]:
        from lm_eval.api.metrics import mean

        computed = list(getattr(self.task, "_metric_fn_list", {}))
        listed = [m["metric"] for m in (self.task.config.metric_list or []) if isinstance(m.get("metric"), str)]
        filters = [f.name for f in getattr(self.task, "_filters", [])] or ["none"]
        name, _, filter_name = (wanted or (listed or computed or [""])[0]).partition(",")
        if name not in computed:
            raise EvalInputError(
                f"Harness task {self.name!r} does not compute the metric {name!r}; it computes {computed}. Give one of "
                "them with --metric."
            )
        if filter_name and filter_name not in filters:
            raise EvalInputError(
                f"Harness task {self.name!r} has no filter {filter_name!r} (--metric {wanted}); its filters are "
                f"{filters}. Give --metric {name},FILTER with one of them, or --metric {name} for the first."
            )
        aggregation = self.task.aggregation().get(name)
        if aggregation is not mean:
            raise EvalInputError(
                f"The metric {name!r} of harness task {self.name!r} is aggregated by "
                f"{getattr(aggregation, '__name__', aggregation)}, not averaged over documents, so it is not a 0/1 "
                "verdict per document and no answer can be called right or wrong. Choose a 0/1 metric with --metric "
                "(e.g. acc or exact_match)."
            )
        return name, filter_name or filters[0]

    def _check_context_field(self) -> None:
        column = self.context.column if self.context.text is None else None
        if column is None:
            return
        lacking = [i for i, doc in enumerate(self.docs) if column not in doc]
        if lacking:
            fields = sorted(self.docs[lacking[0]])
            raise EvalInputError(
                f"--context-column {column!r}: the documents of harness task {self.name!r} have no field {column!r} "
                f"(doc_id {lacking[0]} has {fields}). Give one of those fields, or a fixed context with --context-text "
                "or --context-file."
            )
        for i, doc in enumerate(self.docs):
            try:
                check_context(doc[column], where=f"doc_id {i} of harness task {self.name!r} (field {column!r})")
            except (TypeError, ValueError) as error:
                raise EvalInputError(str(error)) from error

    def context_of(self, doc: Mapping[str, Any]) -> str:
        return self.context.text if self.context.text is not None else str(doc[self.context.column])

    def check(self, tokenizer, max_positions: int | None, model_name: str = "the model") -> None:
        """Everything checkable before the model loads: the chat template must keep a system message (with placement
        `system`), the with-context prompt must differ from the other and hold the context, and every document's
        prompt with the context, plus its longest answer, must fit `max_positions` (lm-eval would cut the prompt's
        start, the context first, without a word)."""
        if getattr(tokenizer, "chat_template", None) is None:
            raise EvalInputError(
                f"The tokenizer of {model_name} has no chat template, so the context cannot be given as a chat role. "
                "Evaluate an instruct model, or give --tokenizer one that has a chat template."
            )
        if self.context.placement == "system" and not system_role_kept(tokenizer, self.options.chat_template_kwargs):
            raise EvalInputError(
                f"The chat template of {model_name} has no system role: lm-eval would drop the system message with a "
                "warning, and the with-context view would silently equal the one without. Give --placement user (the "
                "context then goes into the user turn)."
            )
        budget = self._answer_budget(tokenizer)
        for doc_id, doc in enumerate(self.docs):
            prompt_x, prompt_xc = self.prompts(doc, tokenizer)
            context = self.context_of(doc)
            if prompt_xc == prompt_x or context not in prompt_xc:
                raise EvalInputError(
                    f"Harness task {self.name!r}, doc_id {doc_id}: the prompt with the context is not the prompt without "
                    "it plus the context (the chat template drops it). Try --placement "
                    f"{'user' if self.context.placement == 'system' else 'system'}."
                )
            if max_positions:
                length = len(tokenizer(prompt_xc, add_special_tokens=False)["input_ids"]) + budget(doc)
                if length > max_positions:
                    raise EvalInputError(
                        f"Harness task {self.name!r}, doc_id {doc_id}: its prompt with the context and its answer take "
                        f"{length} tokens, more than the {max_positions} positions of {model_name}: lm-eval would cut "
                        "the prompt's start (the context first). Shorten the context, lower --num-fewshot or the "
                        "task's max_gen_toks, or evaluate a model with more positions."
                    )

    def _answer_budget(self, tokenizer) -> Callable[[Mapping[str, Any]], int]:
        if self.output_type == "generate_until":
            max_gen = int(self.generation_kwargs().get("max_gen_toks", 256))  # HFLM's default
            return lambda doc: max_gen
        if self.output_type == "multiple_choice":

            def longest_choice(doc):
                choices = self.task.doc_to_choice(doc)
                return max(len(tokenizer(" " + str(c), add_special_tokens=False)["input_ids"]) for c in choices)

            return longest_choice
        return lambda doc: 0

    def generation_kwargs(self) -> dict[str, Any]:
        kwargs = dict(self.task.get_config("generation_kwargs") or {})
        kwargs.update(self.options.gen_kwargs or {})
        return kwargs

    def prompts(self, doc: Mapping[str, Any], tokenizer) -> tuple[str, str]:
        """The prompt of `doc` without and with the context, rendered by lm-eval with `tokenizer`'s chat template."""

        def chat(messages, add_generation_prompt=True):
            return tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=not add_generation_prompt,
                **dict(self.options.chat_template_kwargs),
            )

        rendered = []
        for view in ("x", "xc"):
            with self.view(view) as system_instruction:
                self.task.set_fewshot_seed(seed=self.options.fewshot_seed)
                prompt = self.task.fewshot_context(
                    doc,
                    self._num_fewshot(),
                    system_instruction=system_instruction,
                    apply_chat_template=True,
                    fewshot_as_multiturn=self.options.fewshot_as_multiturn,
                    chat_template=chat,
                    gen_prefix=self.task.resolve_field(doc, self.task.config.gen_prefix),
                )
            rendered.append(prompt if isinstance(prompt, str) else "\n".join(prompt))
        return rendered[0], rendered[1]

    def _num_fewshot(self) -> int:
        if self.options.num_fewshot is not None and self.task.get_config("num_fewshot") != 0:
            return self.options.num_fewshot
        return self.task.get_config("num_fewshot") or 0

    # ------------------------------------------------------------------------------------------------ the two views

    @contextmanager
    def view(self, view: str) -> Iterator[str | None]:
        """The task configured for `view` ('x': as defined; 'xc': with the context), yielding the system instruction
        to pass to lm-eval; the task's configuration is put back afterwards."""
        if view == "x":
            yield None
            return
        config = self.task.config
        if self.context.placement == "system" and self.context.text is not None:
            yield self.context.text
            return
        if self.context.placement == "system":
            key, original = "description", config.description
            column = self.context.column
            if not original:
                replacement: Any = column  # lm-eval reads a field named like the description straight from the doc
            else:
                own = "{{" + original + "}}" if original in self.docs[0] else original
                replacement = "{{" + column + "}}" + config.fewshot_delimiter + own
        else:
            key, original = "doc_to_text", config.doc_to_text
            task, template = self.task, self.context.template

            def replacement(doc):
                question = task.doc_to_text(doc, original)
                if not isinstance(question, str):
                    raise EvalInputError(
                        f"Harness task {self.name!r} has several inputs per document, so the context cannot be put in "
                        "its question; use --placement system."
                    )
                return template.format(context=self.context_of(doc), prompt=question)

        self.task.set_config(key, replacement)
        try:
            yield None
        finally:
            self.task.set_config(key, original)

    def _run_view(self, lm, view: str, doc_ids: Sequence[int], sample: int) -> dict[int, DocSample]:
        """One lm-eval run of `view` on `doc_ids`: its logged samples under the chosen filter, by doc_id."""
        lm_eval = import_lm_eval()
        full = list(range(len(self.docs)))
        subset: dict[str, Any] = {}
        if list(doc_ids) != full[: len(doc_ids)]:
            subset["samples"] = {self.name: list(doc_ids)}
        elif len(doc_ids) < len(self.task.eval_docs):
            subset["limit"] = len(doc_ids)
        seed = self.options.seed + sample
        with self.view(view) as system_instruction:
            results = lm_eval.simple_evaluate(
                model=lm,
                tasks=[self.task],
                task_manager=self.manager,
                num_fewshot=self.options.num_fewshot,
                system_instruction=system_instruction,
                apply_chat_template=True,
                fewshot_as_multiturn=self.options.fewshot_as_multiturn,
                gen_kwargs=dict(self.options.gen_kwargs or {}) or None,
                log_samples=True,
                bootstrap_iters=0,
                random_seed=seed,
                numpy_random_seed=seed,
                torch_random_seed=seed,
                fewshot_random_seed=self.options.fewshot_seed,
                **subset,
            )
        logged = [s for s in results["samples"][self.name] if s["filter"] == self.filter]
        return {int(s["doc_id"]): self._doc_sample(s) for s in logged}

    def _doc_sample(self, logged: Mapping[str, Any]) -> DocSample:
        value = float(logged[self.metric])
        if value not in (0.0, 1.0):
            raise EvalInputError(
                f"The metric {self.metric!r} of harness task {self.name!r} is {value} for doc_id {logged['doc_id']}, "
                "not 0 or 1, so no answer can be called right or wrong. Choose a 0/1 metric with --metric."
            )
        prompt = logged["arguments"][0][0] if logged["arguments"] else ""
        answer: Any = logged["filtered_resps"]
        completion = ""
        if self.output_type == "multiple_choice":
            scores = [float(r[0]) for r in logged["filtered_resps"]]
            chosen = max(range(len(scores)), key=scores.__getitem__)
            answer, completion = str(chosen), str(logged["arguments"][chosen][1])
        else:
            answer = answer[0] if isinstance(answer, list) and answer else answer
            raw = logged["resps"][0][0] if logged["resps"] and logged["resps"][0] else answer
            completion, answer = str(raw), str(answer)
        return DocSample(int(logged["doc_id"]), value, str(prompt), answer, completion, str(logged["doc_hash"]))

    def _outcome(self, sample: DocSample, tokenizer) -> ViewOutcome:
        generated = self.output_type == "generate_until"
        tokens = len(tokenizer(sample.completion, add_special_tokens=False)["input_ids"]) if generated else 0
        max_gen = int(self.generation_kwargs().get("max_gen_toks", 256)) if generated else None
        return ViewOutcome(
            completion=sample.completion,
            answer=sample.answer,
            correct=sample.value == 1.0,
            num_tokens=tokens,
            truncated=bool(generated and tokens >= max_gen),
            format_failure=False,
            extra={"doc_id": sample.doc_id, "metric": self.metric, "value": sample.value, "prompt": sample.prompt},
        )

    # ------------------------------------------------------------------------------------------------ PairedTask

    def describe(self) -> dict[str, Any]:
        """The task's part of the provenance record: the lm-eval task (name, version, config hash), the metric, the
        context and the options that shape the requests."""
        config = self.task.dump_config() if hasattr(self.task, "dump_config") else {}
        return {
            "context": self.context_info(),
            "scorer": f"lm-eval:{self.metric},{self.filter}",
            "harness": {
                "task": self.name,
                "output_type": self.output_type,
                "version": (config.get("metadata") or {}).get("version"),
                "config_sha256": sha256_text(json.dumps(config, sort_keys=True, default=str)),
                "num_fewshot": self._num_fewshot(),
                "fewshot_seed": self.options.fewshot_seed,
                "fewshot_as_multiturn": self.options.fewshot_as_multiturn,
                "generation_kwargs": self.generation_kwargs() if self.output_type == "generate_until" else None,
                "samples_per_view": self.options.samples_per_view,
                "chat_template_kwargs": dict(self.options.chat_template_kwargs),
                "lm_eval": _lm_eval_version(),
            },
        }

    def context_info(self) -> dict[str, Any]:
        if self.context.text is not None:
            digest = sha256_text(self.context.text)
        else:
            digest = sha256_text("\n".join(f"{i}\t{sha256_text(self.context_of(d))}" for i, d in enumerate(self.docs)))
        return {
            "sha256": digest,
            "source": self.context_source
            or ("text" if self.context.text is not None else f"column:{self.context.column}"),
            "placement": self.context.placement,
            "template": self.context.template if self.context.placement == "user" else None,
        }

    def settings(self) -> GenerationSettings:
        """The sampling settings the records carry: the task's generation kwargs (greedy for multiple choice)."""
        kwargs = self.generation_kwargs() if self.output_type == "generate_until" else {}
        sampled = bool(kwargs.get("do_sample", False))
        return GenerationSettings(
            max_new_tokens=int(kwargs.get("max_gen_toks", 256)) if kwargs else 1,
            temperature=float(kwargs.get("temperature", 1.0)) if sampled else 1.0,
            top_p=float(kwargs.get("top_p", 1.0)) if sampled else 1.0,
            top_k=int(kwargs.get("top_k", 0)) if sampled else 0,
            do_sample=sampled,
            seed=self.options.seed,
            batch_size=self.options.batch_size,
        )

    def prepare(self, tokenizer) -> list[TaskItem]:
        return [
            TaskItem(str(i), sha256_text(json.dumps(doc, sort_keys=True, default=str) + self.context_of(doc)))
            for i, doc in enumerate(self.docs)
        ]

    def bound(self, lm) -> _BoundHarnessTask:
        return _BoundHarnessTask(self, lm)

    def run(
        self,
        model,
        tokenizer,
        *,
        lm=None,
        output_path=None,
        provenance=None,
        model_path=None,
        adapter=None,
        progress: bool = False,
        desc: str | None = None,
    ) -> list[PairedRecord]:
        """Evaluate `model` (with `tokenizer`) on this task, both views; `lm` is the lm-eval model to run (default:
        `HFLM` wrapping `model`). Records are appended to `output_path` and resumed from it as `run_paired` does."""
        lm = lm if lm is not None else hf_lm(model, tokenizer, self.options)
        settings = self.settings()
        if provenance is None:
            provenance = run_provenance(
                self, model, tokenizer, generation=settings, model_path=model_path, adapter=adapter
            )
        return run_paired(
            self.bound(lm),
            model,
            tokenizer,
            generation=settings,
            output_path=output_path,
            provenance=provenance,
            progress=progress,
            desc=desc or self.name,
        )


@dataclass
class _BoundHarnessTask:
    """A `HarnessTask` with the lm-eval model that plays it: the runner's task (its generate function is not used,
    lm-eval's model generates)."""

    task: HarnessTask
    lm: Any

    def describe(self) -> dict[str, Any]:
        return self.task.describe()

    def prepare(self, tokenizer) -> list[TaskItem]:
        return self.task.prepare(tokenizer)

    def play(self, items, generate, tokenizer, settings, on_records) -> None:
        task = self.task
        doc_ids = [int(item.item_id) for item in items]
        k = task.options.samples_per_view
        runs = {view: [task._run_view(self.lm, view, doc_ids, j) for j in range(k)] for view in ("x", "xc")}
        for view, samples in runs.items():
            for j, by_doc in enumerate(samples):
                missing = sorted(set(doc_ids) - set(by_doc))
                if missing:
                    raise RuntimeError(
                        f"lm-eval returned no sample for doc_ids {missing[:5]} of task {task.name!r} (view {view}, "
                        f"sample {j}); the two views cannot be paired."
                    )
        records = []
        for doc_id in doc_ids:
            views = {}
            for view in ("x", "xc"):
                outcomes = [task._outcome(runs[view][j][doc_id], tokenizer) for j in range(k)]
                first = outcomes[0]
                if k > 1:  # samples 2..k as `view_samples` reads them (their prompts are the first one's)
                    first.extra["samples"] = [
                        asdict(replace(o, extra={key: v for key, v in o.extra.items() if key != "prompt"}))
                        for o in outcomes[1:]
                    ]
                views[view] = first
            doc_hash = runs["x"][0][doc_id].doc_hash
            records.append(
                PairedRecord(str(doc_id), views["x"], views["xc"], meta={"task": task.name, "doc_hash": doc_hash})
            )
        on_records(records)


def _lm_eval_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lm_eval")
    except PackageNotFoundError:
        return None


def system_role_kept(tokenizer, chat_template_kwargs: Mapping[str, Any] | None = None) -> bool:
    """Whether the chat template renders a system message's text (lm-eval drops the system message when the template
    raises on it)."""
    messages = [{"role": "system", "content": SYSTEM_PROBE}, {"role": "user", "content": "question"}]
    try:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **dict(chat_template_kwargs or {})
        )
    except Exception:  # jinja2's TemplateError, raised by templates that refuse a system role
        return False
    return SYSTEM_PROBE in text


def hf_lm(model, tokenizer, options: HarnessOptions):
    """lm-eval's `HFLM` around a loaded model (a PEFT model too) and its tokenizer."""
    import_lm_eval()
    from lm_eval.models.huggingface import HFLM

    return HFLM(
        pretrained=model,
        tokenizer=tokenizer,
        batch_size=options.batch_size,
        chat_template_args=dict(options.chat_template_kwargs) or None,
    )


def vllm_lm(path: str, *, adapter: str | None, dtype: str, options: HarnessOptions, tokenizer: str | None = None):
    """lm-eval's vLLM model type (`lm_eval.models.vllm_causallms.VLLM`) for a model path and a LoRA adapter. Its
    module asks for the distribution `vllm` by name, which vLLM's CPU build is not (`vllm_distribution_alias`)."""
    import_lm_eval()
    vllm_distribution_alias()
    from lm_eval.api.registry import get_model

    args: dict[str, Any] = {"pretrained": path, "dtype": dtype, "seed": options.seed, **engine_defaults()}
    if adapter:
        args["lora_local_path"] = adapter
    if tokenizer:
        args["tokenizer"] = tokenizer
    if options.chat_template_kwargs:
        args["chat_template_args"] = dict(options.chat_template_kwargs)
    return get_model("vllm").create_from_arg_obj(args, {"batch_size": options.batch_size})


def harness_tasks(
    names: Sequence[str],
    context: ContextSpec,
    options: HarnessOptions | None = None,
    *,
    include_path=None,
    context_source: str | None = None,
) -> list[HarnessTask]:
    """The `HarnessTask`s of lm-eval task names (groups expand to their tasks), checked without a model."""
    options = options or HarnessOptions()
    if not names:
        raise EvalInputError("Give at least one harness task name.")
    loaded = load_tasks(names, include_path)
    manager = resolve_task_manager(names, include_path)
    return [
        HarnessTask(task, context, options, manager=manager, context_source=context_source) for task in loaded.values()
    ]


def evaluate_harness(
    model,
    tokenizer,
    tasks: Sequence[str] | Sequence[HarnessTask],
    *,
    context: ContextSpec,
    adapter: str | None = None,
    include_path=None,
    options: HarnessOptions | None = None,
    output_dir: str | os.PathLike | None = None,
    model_name: str = "model",
    lm=None,
    check: bool = True,
    progress: bool = False,
    model_path: str | None = None,
    backend: str = "hf",
) -> list[ModelRun]:
    """Paired evaluation of a loaded model (a PEFT model with its adapter too; `adapter` names it in the provenance)
    on lm-eval tasks: one `ModelRun` named `MODEL/TASK` per task, ready for `write_report` or `compute_metrics`.

    `tasks` are lm-eval names (with `include_path` for local YAMLs) or `HarnessTask`s. With `output_dir`, each task's
    records go to `<output_dir>/<model>/<task>/records.jsonl` and a rerun resumes them. `lm` is the lm-eval model to
    run (default: `HFLM` around `model`; `backend` names it in the provenance, `model_path` names the model when
    `model` is None, as with lm-eval's vLLM model).
    """
    options = options or HarnessOptions()
    if tasks and isinstance(tasks[0], str):
        tasks = harness_tasks(list(tasks), context, options, include_path=include_path)
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if check:
        for task in tasks:
            task.check(tokenizer, limit, model_name)
    lm = lm if lm is not None else hf_lm(model, tokenizer, options)
    runs = []
    for task in tasks:
        name = f"{model_name}/{task.name}"
        path = None if output_dir is None else Path(output_dir) / safe_name(model_name) / safe_name(task.name)
        records_path = None if path is None else path / "records.jsonl"
        provenance = run_provenance(
            task, model, tokenizer, generation=task.settings(), model_path=model_path, adapter=adapter
        )
        provenance["backend"] = backend
        records = task.run(
            model, tokenizer, lm=lm, output_path=records_path, provenance=provenance, progress=progress, desc=name
        )
        runs.append(ModelRun(name, records, provenance=provenance, records_path=records_path and str(records_path)))
    return runs
