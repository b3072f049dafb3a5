"""Paired evaluation over lm-evaluation-harness tasks: each task run without and with the context, paired by `doc_id`.

lm-eval (`pip install "trl-nca[harness]"`, imported only when a harness task is asked for) builds every request, runs
the model and scores each document with the task's own metric; this module chooses what the with-context view adds to
the prompt, runs each view through lm-eval (`trl_nca.eval.lm_eval_adapter`, the one module that calls it) once per
sample, and joins the two runs' logged samples by `doc_id` into the library's `PairedRecord`s, so the metrics,
regimes, reports and resume of the paired evaluation apply unchanged (`trl_nca.eval.runner.run_paired`).

Each view is a task of its own, built once (lm-eval's `fewshot_context` puts the context where it goes):

- a fixed context with placement `system`: the task as it is, run with the context as lm-eval's `system_instruction`,
  which lm-eval puts first in the system message (the task's `description`, if any, follows it);
- a per-document context (a field of the task's documents) with placement `system`: the task built again with its
  `description` set to that field (lm-eval resolves it per document), followed by the task's own description, if any;
- placement `user`: the task built again with a `doc_to_text` that puts the evaluated document's question through the
  context template; few-shot examples keep their own text.

Prompts always go through the model's chat template (`apply_chat_template=True`): the context is a chat role's text.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..console import plural, say
from ..core.sampling import GenerationSettings
from ..core.views import ContextSpec, check_context
from ..inputs import sha256_text
from .errors import EvalInputError
from .harness_index import load_tasks, resolve_task_manager
from .lm_eval_adapter import (
    HARNESS_INSTALL,
    ModelToRun,
    RunSettings,
    averaged,
    build_lm,
    computed_metrics,
    filter_names,
    listed_metrics,
    lm_eval_version,
    multiple_inputs,
    render_prompt,
    run_task,
    task_variant,
)
from .records import PairedRecord, ViewOutcome
from .report import ModelRun, safe_name
from .runner import TaskItem, early_meta, run_paired, run_provenance


__all__ = [
    "HARNESS_INSTALL",
    "HarnessOptions",
    "HarnessTask",
    "evaluate_harness",
    "harness_tasks",
    "hf_lm",
]

SYSTEM_PROBE = "trl-nca system role probe 7f3a"  # a text no chat template adds by itself
VIEWS = {"x": "without", "xc": "with"}


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
        skip_empty_context: leave out the documents whose context field is empty (their two views would be one
            prompt), counted in the provenance and the report; without it such a document is refused.
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
    skip_empty_context: bool = False

    def __post_init__(self):
        for name in ("num_fewshot", "limit"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise EvalInputError(f"{name} must be at least 0, got {value}.")
        if self.samples_per_view < 1:
            raise EvalInputError(f"samples_per_view must be at least 1, got {self.samples_per_view}.")

    def run_settings(self, sample: int) -> RunSettings:
        """lm-eval's settings of sample `sample` of a view."""
        return RunSettings(
            num_fewshot=self.num_fewshot,
            fewshot_as_multiturn=self.fewshot_as_multiturn,
            gen_kwargs=self.gen_kwargs,
            seed=self.seed + sample,
            fewshot_seed=self.fewshot_seed,
        )


@dataclass(frozen=True)
class DocSample:
    """What lm-eval logged for one document in one run: the metric's value and the model's answer."""

    doc_id: int
    value: float
    prompt: str
    answer: str
    completion: str
    doc_hash: str


@dataclass(frozen=True)
class TaskView:
    """One view of a task: the lm-eval task that runs it and the system instruction it runs with."""

    task: Any
    system_instruction: str | None = None


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


class HarnessTask:
    """One lm-eval task evaluated without and with a context: a `PairedTask` of the runner (`run_paired`).

    The checks (`check`) need no model: the metric, the context field, the system role of the chat template and the
    prompts' lengths against the model's positions. `run(model, tokenizer)` evaluates a loaded model (an lm-eval
    `LM`, e.g. `HFLM` or lm-eval's vLLM model, can be passed as `lm`); records are `PairedRecord`s whose views hold
    lm-eval's per-document metric value, answer and prompt. `docs` maps each evaluated document's `doc_id` to it.
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
        if not count:
            raise EvalInputError(f"Harness task {self.name!r} has no documents to evaluate.")
        self.docs: dict[int, Mapping[str, Any]] = dict(enumerate(docs[:count]))
        self.skipped = self._check_context_field()
        for doc_id in self.skipped:
            del self.docs[doc_id]
        if not self.docs:
            raise EvalInputError(
                f"Harness task {self.name!r}: every document's context field {self.context.column!r} is empty, so "
                "nothing is left to evaluate. Give another field (--context-column) or a fixed context."
            )
        self.num_fewshot = self._num_fewshot()
        self.config_sha256 = sha256_text(json.dumps(task.dump_config(), sort_keys=True, default=str))
        self.version = (task.dump_config().get("metadata") or {}).get("version")
        self.gen_kwargs = {**dict(task.get_config("generation_kwargs") or {}), **dict(options.gen_kwargs or {})}
        self.views = {"x": TaskView(task), "xc": self._context_view()}

    # ------------------------------------------------------------------------------------------------ checks (no model)

    def _metric_and_filter(self, wanted: str | None) -> tuple[str, str]:
        computed = computed_metrics(self.task)
        filters = filter_names(self.task)
        name, _, filter_name = (wanted or (listed_metrics(self.task) or computed or [""])[0]).partition(",")
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
        is_mean, aggregation = averaged(self.task, name)
        if not is_mean:
            raise EvalInputError(
                f"The metric {name!r} of harness task {self.name!r} is aggregated by {aggregation}, not averaged over "
                "documents, so it is not a 0/1 verdict per document and no answer can be called right or wrong. "
                "Choose a 0/1 metric with --metric (e.g. acc or exact_match)."
            )
        return name, filter_name or filters[0]

    def _check_context_field(self) -> list[int]:
        """The doc_ids whose context field is empty (left out with `skip_empty_context`, else refused)."""
        column = self.context.column if self.context.text is None else None
        if column is None:
            return []
        lacking = [i for i, doc in self.docs.items() if column not in doc]
        if lacking:
            fields = sorted(self.docs[lacking[0]])
            raise EvalInputError(
                f"--context-column {column!r}: the documents of harness task {self.name!r} have no field {column!r} "
                f"(doc_id {lacking[0]} has {fields}). Give one of those fields, or a fixed context with --context-text "
                "or --context-file."
            )
        empty = [i for i, doc in self.docs.items() if _empty(doc[column])]
        if empty and not self.options.skip_empty_context:
            raise EvalInputError(
                f"Harness task {self.name!r}: the context field {column!r} of {plural(len(empty), 'document')} is "
                f"empty (doc_ids {empty[:5]}{' ...' if len(empty) > 5 else ''}), so its prompts with and without the "
                "context would be the same and it could show neither harm nor help. Give --skip-empty-context to leave "
                "such documents out (counted in the report), or fill the field."
            )
        for i, doc in self.docs.items():
            if i not in empty:
                try:
                    check_context(doc[column], where=f"doc_id {i} of harness task {self.name!r} (field {column!r})")
                except (TypeError, ValueError) as error:
                    raise EvalInputError(str(error)) from error
        return empty

    def _context_view(self) -> TaskView:
        """The with-context view: the same task with a system instruction, or a task built with the context."""
        if self.context.placement == "system" and self.context.text is not None:
            return TaskView(self.task, self.context.text)
        config = self.task.config
        if self.context.placement == "system":
            column, own = self.context.column, config.description
            if not own:
                description = column  # lm-eval reads a field named like the description straight from the document
            else:
                own = "{{" + own + "}}" if own in next(iter(self.docs.values())) else own
                description = "{{" + column + "}}" + config.fewshot_delimiter + own
            return TaskView(task_variant(self.task, description=description))
        if multiple_inputs(self.task, next(iter(self.docs.values()))):
            raise EvalInputError(
                f"Harness task {self.name!r} has several inputs per document, so the context cannot be put in its "
                "question; use --placement system."
            )
        question, template, context_of = self.task.doc_to_text, self.context.template, self.context_of
        return TaskView(
            task_variant(
                self.task, doc_to_text=lambda doc: template.format(context=context_of(doc), prompt=question(doc))
            )
        )

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
        for doc_id, doc in self.docs.items():
            prompt_x, prompt_xc = self.prompts(doc, tokenizer)
            if prompt_xc == prompt_x or self.context_of(doc) not in prompt_xc:
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
            max_gen = int(self.gen_kwargs.get("max_gen_toks", 256))  # HFLM's default
            return lambda doc: max_gen
        if self.output_type == "multiple_choice":

            def longest_choice(doc):
                choices = self.task.doc_to_choice(doc)
                return max(len(tokenizer(" " + str(c), add_special_tokens=False)["input_ids"]) for c in choices)

            return longest_choice
        return lambda doc: 0

    def generation_kwargs(self) -> dict[str, Any]:
        """The task's `generation_kwargs` with the run's overrides."""
        return dict(self.gen_kwargs)

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

        x, xc = (
            render_prompt(
                view.task,
                doc,
                num_fewshot=self.num_fewshot,
                system_instruction=view.system_instruction,
                fewshot_seed=self.options.fewshot_seed,
                fewshot_as_multiturn=self.options.fewshot_as_multiturn,
                chat=chat,
            )
            for view in (self.views["x"], self.views["xc"])
        )
        return x, xc

    def _num_fewshot(self) -> int:
        if self.options.num_fewshot is not None and self.task.get_config("num_fewshot") != 0:
            return self.options.num_fewshot
        return self.task.get_config("num_fewshot") or 0

    # ------------------------------------------------------------------------------------------------ the two views

    def run_view(self, lm, view: str, doc_ids: Sequence[int], sample: int) -> dict[int, DocSample]:
        """One lm-eval run of `view` ('x' or 'xc') on `doc_ids`: its logged samples under the chosen filter, by
        doc_id."""
        chosen = self.views[view]
        logged = run_task(
            lm,
            chosen.task,
            self.manager,
            doc_ids=doc_ids,
            system_instruction=chosen.system_instruction,
            settings=self.options.run_settings(sample),
        )
        return {int(s["doc_id"]): self._doc_sample(s) for s in logged if s["filter"] == self.filter}

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

    @property
    def generates(self) -> bool:
        """Whether the task's answers are generated (`generate_until`), not scored by log-likelihood."""
        return self.output_type == "generate_until"

    def outcome(self, sample: DocSample, tokenizer) -> ViewOutcome:
        """The runner's outcome of one document in one view: correct by the metric, with the answer and prompt."""
        tokens = len(tokenizer(sample.completion, add_special_tokens=False)["input_ids"]) if self.generates else 0
        max_gen = int(self.gen_kwargs.get("max_gen_toks", 256)) if self.generates else None
        return ViewOutcome(
            completion=sample.completion,
            answer=sample.answer,
            correct=sample.value == 1.0,
            num_tokens=tokens,
            truncated=bool(self.generates and tokens >= max_gen),
            format_failure=False,
            extra={"doc_id": sample.doc_id, "metric": self.metric, "value": sample.value, "prompt": sample.prompt},
        )

    # ------------------------------------------------------------------------------------------------ PairedTask

    def describe(self) -> dict[str, Any]:
        """The task's part of the provenance record: the lm-eval task (name, version, config hash), the metric, the
        context and the options that shape the requests. A log-likelihood task says it generates nothing."""
        return {
            "context": self.context_info(),
            "scorer": f"lm-eval:{self.metric},{self.filter}",
            "generates": self.generates,
            "harness": {
                "task": self.name,
                "output_type": self.output_type,
                "version": self.version,
                "config_sha256": self.config_sha256,
                "num_fewshot": self.num_fewshot,
                "fewshot_seed": self.options.fewshot_seed,
                "fewshot_as_multiturn": self.options.fewshot_as_multiturn,
                "generation_kwargs": self.generation_kwargs() if self.generates else None,
                "samples_per_view": self.options.samples_per_view,
                "chat_template_kwargs": dict(self.options.chat_template_kwargs),
                "lm_eval": lm_eval_version(),
            },
        }

    def context_info(self) -> dict[str, Any]:
        if self.context.text is not None:
            digest = sha256_text(self.context.text)
        else:
            digest = sha256_text("\n".join(f"{i}\t{sha256_text(self.context_of(d))}" for i, d in self.docs.items()))
        info = {
            "sha256": digest,
            "source": self.context_source
            or ("text" if self.context.text is not None else f"column:{self.context.column}"),
            "placement": self.context.placement,
            "template": self.context.template if self.context.placement == "user" else None,
        }
        if self.skipped:
            info["skipped_empty"] = {"count": len(self.skipped), "doc_ids": self.skipped}
        return info

    def settings(self) -> GenerationSettings:
        """The sampling settings the records carry: the task's generation kwargs (greedy for multiple choice)."""
        kwargs = self.generation_kwargs() if self.generates else {}
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
            for i, doc in self.docs.items()
        ]

    def bound(self, lm, desc: str | None = None, provenance: Mapping[str, Any] | None = None) -> _BoundHarnessTask:
        """The runner's task: this task played by lm-eval's model `lm`; its records carry the `early_meta` of
        `provenance` (the run's, as `run_paired` gets it)."""
        return _BoundHarnessTask(self, lm, desc or self.name, early_meta(provenance or {}))

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
            self.bound(lm, desc, provenance),
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
    """A `HarnessTask` with the lm-eval model that plays it: the runner's task. lm-eval's model answers, so the
    runner's generate function is never called (and so never built: `trl_nca.eval.runner.run_paired`). A task's
    records are passed on once both views of every document left to do have run."""

    task: HarnessTask
    lm: Any
    desc: str
    meta: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return self.task.describe()

    def prepare(self, tokenizer) -> list[TaskItem]:
        return self.task.prepare(tokenizer)

    def play(self, items, generate, tokenizer, settings, on_records) -> None:
        task, k = self.task, self.task.options.samples_per_view
        doc_ids = [int(item.item_id) for item in items]
        runs: dict[str, list[dict[int, DocSample]]] = {view: [] for view in VIEWS}
        for view, label in VIEWS.items():
            for j in range(k):
                by_doc = task.run_view(self.lm, view, doc_ids, j)
                missing = sorted(set(doc_ids) - set(by_doc))
                if missing:
                    raise RuntimeError(
                        f"lm-eval returned no sample for doc_ids {missing[:5]} of task {task.name!r} (view {view}, "
                        f"sample {j}); the two views cannot be paired."
                    )
                runs[view].append(by_doc)
                sample = f", sample {j + 1} of {k}" if k > 1 else ""
                say(f"{self.desc}: {plural(len(doc_ids), 'document')} done {label} the context{sample}", level="units")
        on_records([self._record(doc_id, runs, tokenizer) for doc_id in doc_ids])

    def _record(self, doc_id: int, runs, tokenizer) -> PairedRecord:
        task, k = self.task, self.task.options.samples_per_view
        views = {}
        for view in VIEWS:
            outcomes = [task.outcome(runs[view][j][doc_id], tokenizer) for j in range(k)]
            first = outcomes[0]
            if k > 1:  # samples 2..k as `view_samples` reads them (their prompts are the first one's)
                first.extra["samples"] = [
                    asdict(replace(o, extra={key: v for key, v in o.extra.items() if key != "prompt"}))
                    for o in outcomes[1:]
                ]
            views[view] = first
        doc_hash = runs["x"][0][doc_id].doc_hash
        meta = {"task": task.name, "doc_hash": doc_hash, **self.meta}
        return PairedRecord(str(doc_id), views["x"], views["xc"], meta=meta)


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
    spec = ModelToRun(
        model, tokenizer, batch_size=options.batch_size, chat_template_kwargs=options.chat_template_kwargs
    )
    return build_lm("hf", spec)


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


def harness_run_folder(output_dir: str | os.PathLike, model_name: str, task_name: str) -> Path:
    """Where the records of a model on a task go: `<output_dir>/<model>/<task>/`."""
    return Path(output_dir) / safe_name(model_name) / safe_name(task_name)


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
        records_path = (
            None if output_dir is None else harness_run_folder(output_dir, model_name, task.name) / "records.jsonl"
        )
        provenance = run_provenance(
            task, model, tokenizer, generation=task.settings(), model_path=model_path, adapter=adapter
        )
        provenance["backend"] = backend
        records = task.run(
            model, tokenizer, lm=lm, output_path=records_path, provenance=provenance, progress=progress, desc=name
        )
        runs.append(ModelRun(name, records, provenance=provenance, records_path=records_path and str(records_path)))
    return runs
