"""The paired evaluator of dataset items: every item generated once without and once with the context, then scored.

`PairedEvaluator` validates and prepares a dataset and is the dataset task of the evaluation runner
(`trl_nca.eval.runner`), which writes, resumes and identifies runs the same way for game episodes. Prompts are built
with `trl_nca.core.views` (`split_example`, `add_context`, `render_prompt_ids`), the same functions the trainer uses, so
the evaluation sees exactly the prompts of training. See `trl_nca.core.sampling` for what is guaranteed about the
samples.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..console import PROGRESS, duration, progress_level
from ..core.checks import is_int
from ..core.sampling import GenerateFn, GenerationBackend, GenerationSettings, VLLMBackend, item_seed
from ..core.views import ContextSpec, add_context, render_prompt_ids, split_example, text_bytes
from ..inputs import sha256_text
from .errors import EvalInputError
from .loading import load_model, load_tokenizer
from .records import PairedRecord, ViewOutcome
from .runner import run_paired, run_provenance
from .scorers import COMPANION_SCORERS, Scorer, get_scorer, safe_score


if TYPE_CHECKING:
    from datasets import Dataset


logger = logging.getLogger(__name__)


@dataclass
class EvalItem:
    """One prepared item: id, label, the prompt token ids of both views, and the hash of its context."""

    item_id: str
    index: int
    label: Any
    prompt_ids_x: list[int]
    prompt_ids_xc: list[int]
    context_sha256: str
    seed: int
    fingerprint: str = ""  # sha256 of what the item's records depend on: id, label, prompt token ids of both views


def column_names(dataset) -> list[str]:
    """Column names of a `datasets.Dataset` or the union of keys of a list of dicts."""
    if hasattr(dataset, "column_names"):
        return list(dataset.column_names)
    names: dict[str, None] = {}
    for row in dataset:
        names.update(dict.fromkeys(row))
    return list(names)


def _check_column(column: str, columns: Sequence[str], what: str, option: str) -> None:
    if column not in columns:
        raise EvalInputError(
            f"The dataset has no {what} column {column!r}; its columns are {sorted(columns)}. Set {option} to one of "
            "them."
        )


class PairedEvaluator:
    """Prepares a dataset once and evaluates models on it, paired without/with the context.

    Args:
        dataset: a `datasets.Dataset` or a list of dicts, with a `prompt` (string or messages) or `messages` column,
            or the column named by `prompt_column`.
        context: where the context comes from and where it goes (`trl_nca.core.views.ContextSpec`).
        scorer: a registry name (`"mcq"`, `"mcq_strict"`, `"yesno"`, `"exact"`, `"normalized"`), a `Scorer`, or a
            callable `fn(text, label)`.
        label_column: the column holding each item's label.
        id_column: the column holding unique item ids; None uses the row index.
        generation: sampling settings shared by both views.
        companion_scorers: extra scorers stored per view in `ViewOutcome.extra["scores"]`; None picks the default
            companions (the strict MCQ parser next to the reference one, and vice versa).
        prompt_column: the prompt column when it is neither `prompt` nor `messages`.
        limit: evaluate only the first `limit` rows.
        chat_template_kwargs: passed to `apply_chat_template` (e.g. `{"enable_thinking": False}`).
        context_source: how to describe the context's origin in the provenance (e.g. `"file:experience.txt"`);
            default `"text"` or `"column:<name>"`.
        samples_per_view: k, the samples per item and view. Sample j of both views uses the same seed
            (`sample_seed(item seed, j)`, the item seed itself for j = 0), so the views share their random numbers
            per sample index. The record's `x` and `xc` hold sample 0 (exactly the one-sample record); samples 1..k-1
            are in `extra["samples"]` of each view, and `trl_nca.eval.metrics` turns them into per-item success
            rates (docs/evaluation.md, "k samples per view"). At most `MAX_SAMPLES_PER_VIEW`.
        group_samples: send the k samples of an item's view in one generate call, so that `HFBackend` runs each
            prompt's prefill once (`play`); False sends one call per sample index (the order before issue 30). The
            samples are the same either way, up to float rounding.
    """

    def __init__(
        self,
        dataset: Dataset | Sequence[Mapping[str, Any]],
        *,
        context: ContextSpec,
        scorer: str | Scorer | Any = "mcq",
        label_column: str = "answer",
        id_column: str | None = None,
        generation: GenerationSettings | None = None,
        companion_scorers: Sequence[str | Scorer] | None = None,
        prompt_column: str | None = None,
        limit: int | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        context_source: str | None = None,
        samples_per_view: int = 1,
        group_samples: bool = True,
    ):
        if not is_int(samples_per_view) or samples_per_view < 1:
            raise EvalInputError(
                f"samples_per_view must be an integer >= 1 (samples per item and view), got {samples_per_view!r}."
            )
        if samples_per_view > MAX_SAMPLES_PER_VIEW:
            raise EvalInputError(
                f"samples_per_view {samples_per_view} is more than {MAX_SAMPLES_PER_VIEW}: each sample is one more "
                "generation per item and view, so the evaluation would not end in any useful time. Give at most "
                f"{MAX_SAMPLES_PER_VIEW} (docs/evaluation.md: a few samples per view already estimate the rates)."
            )
        self.samples_per_view = samples_per_view
        self.group_samples = group_samples
        self.context = context
        self.context_source = context_source
        self.scorer = get_scorer(scorer)
        if companion_scorers is None:
            companion_scorers = COMPANION_SCORERS.get(self.scorer.name, ())
        self.companions = [get_scorer(s) for s in companion_scorers]
        self.label_column = label_column
        self.id_column = id_column
        self.generation = generation or GenerationSettings()
        self.prompt_column = prompt_column
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        rows = dataset if limit is None else _first_items(dataset, limit)
        self.rows = [dict(r) for r in rows]
        self._limit = limit
        self._validate()
        self._items: list[EvalItem] | None = None
        self._tokenizer_id: int | None = None
        self._scorer_errors = 0  # scorer failures of the run in progress (counted per `play`)

    def _validate(self) -> None:
        columns = column_names(self.rows)
        if not self.rows:
            after = f" after limit={self._limit}" if self._limit is not None else ""
            raise EvalInputError(f"The evaluation dataset is empty{after}: there is nothing to evaluate.")
        _check_column(self.label_column, columns, "label", "the label column")
        if self.id_column is not None:
            _check_column(self.id_column, columns, "id", "the id column")
        if self.prompt_column is not None:
            _check_column(self.prompt_column, columns, "prompt", "the prompt column")
        elif "prompt" not in columns and "messages" not in columns:
            raise EvalInputError(
                f"The dataset has neither a `prompt` nor a `messages` column; its columns are {sorted(columns)}. "
                "Name the prompt column explicitly."
            )
        if self.context.text is None:
            _check_column(self.context.column, columns, "context", "the context column (or give a fixed context)")
        seen: dict[str, int] = {}
        for index, row in enumerate(self.rows):
            if self.id_column is not None and row.get(self.id_column) is None:
                raise EvalInputError(
                    f"Row {index} has no id in column {self.id_column!r} (missing or null). Give every row an id, or "
                    "leave out the id column to use row numbers."
                )
            item_id = self.item_id(row, index)
            if row.get(self.label_column) is None:
                raise EvalInputError(
                    f"Row {index} (item {item_id!r}) has no label in column {self.label_column!r} (missing or null). "
                    "Fill it in, or drop the row."
                )
            if self.prompt_column is not None and row.get(self.prompt_column) is None:
                raise EvalInputError(
                    f"Row {index} (item {item_id!r}) has no prompt in column {self.prompt_column!r} (missing or null). "
                    "Fill it in, or drop the row."
                )
            try:
                self._prompt_messages(row, where=f"row {index} (item {item_id!r})")
            except (KeyError, TypeError, ValueError) as error:
                raise EvalInputError(str(error).strip("\"'")) from error
            if item_id in seen:
                raise EvalInputError(
                    f"Item id {item_id!r} appears in rows {seen[item_id]} and {index}; ids must be unique."
                )
            seen[item_id] = index
            for scorer in [self.scorer, *self.companions]:
                try:
                    scorer.check_label(row[self.label_column])
                except (ValueError, TypeError) as error:
                    raise EvalInputError(
                        f"Scorer/dataset mismatch at item {item_id!r}: {error} (label column {self.label_column!r}). "
                        "Pick a scorer that fits the labels, or convert the labels."
                    ) from error
            try:
                self.context.context_of(row, index)
            except (KeyError, TypeError, ValueError) as error:
                raise EvalInputError(f"Item {item_id!r}: {error}") from error

    def item_id(self, row: Mapping[str, Any], index: int) -> str:
        return str(index) if self.id_column is None else str(row[self.id_column])

    def _prompt_messages(self, row: Mapping[str, Any], where: str = "an item"):
        if self.prompt_column in (None, "prompt", "messages"):
            example = row if self.prompt_column is None else {self.prompt_column: row.get(self.prompt_column)}
        else:
            example = {"prompt": row.get(self.prompt_column)}
        messages, _ = split_example(example, where)
        return messages

    def text_sizes(self) -> list[tuple[str, int, int]]:
        """Each item's id and the UTF-8 bytes of its messages' text without and with the context, read without a
        tokenizer (a bound on the token counts before any prompt is tokenised: `trl-nca eval`'s position check)."""
        sizes = []
        for index, row in enumerate(self.rows):
            messages = self._prompt_messages(row)
            with_context = add_context(messages, self.context.context_of(row, index), self.context)
            sizes.append((self.item_id(row, index), text_bytes(messages), text_bytes(with_context)))
        return sizes

    def items(self, tokenizer, cache: bool = True) -> list[EvalItem]:
        """The prepared items for `tokenizer` (built once per tokenizer; `cache=False` builds them without keeping
        them, for a check with a tokenizer the evaluation will not use)."""
        if cache and self._items is not None and self._tokenizer_id == id(tokenizer):
            return self._items
        items = []
        for index, row in enumerate(self.rows):
            item_id = self.item_id(row, index)
            messages = self._prompt_messages(row)
            context = self.context.context_of(row, index)
            item = EvalItem(
                item_id=item_id,
                index=index,
                label=row[self.label_column],
                prompt_ids_x=render_prompt_ids(tokenizer, messages, **self.chat_template_kwargs),
                prompt_ids_xc=render_prompt_ids(
                    tokenizer, add_context(messages, context, self.context), **self.chat_template_kwargs
                ),
                context_sha256=sha256_text(context),
                seed=item_seed(self.generation.seed, item_id),
            )
            item.fingerprint = item_fingerprint(item)
            items.append(item)
        if cache:
            self._items, self._tokenizer_id = items, id(tokenizer)
        return items

    def context_sha256(self) -> str:
        """One hash of all contexts: the fixed string's sha256, or a sha256 over (item id, context sha256) pairs."""
        if self.context.text is not None:
            return sha256_text(self.context.text)
        lines = [
            f"{self.item_id(row, i)}\t{sha256_text(self.context.context_of(row, i))}" for i, row in enumerate(self.rows)
        ]
        return sha256_text("\n".join(lines))

    def context_info(self) -> dict[str, Any]:
        return {
            "sha256": self.context_sha256(),
            "source": self.context_source
            or ("text" if self.context.text is not None else f"column:{self.context.column}"),
            "placement": self.context.placement,
            "template": self.context.template if self.context.placement == "user" else None,
            "separator": self.context.separator if self.context.placement == "system" else None,
        }

    def describe(self) -> dict[str, Any]:
        """The dataset task's part of the provenance record: context, scorers, columns, chat template options, and
        `samples_per_view` when it is above 1 (so one-sample runs keep their run key)."""
        described = {
            "context": self.context_info(),
            "scorer": self.scorer.name,
            "companion_scorers": [s.name for s in self.companions],
            "label_column": self.label_column,
            "id_column": self.id_column,
            "chat_template_kwargs": self.chat_template_kwargs,
        }
        if self.samples_per_view > 1:
            described["samples_per_view"] = self.samples_per_view
        return described

    def provenance(
        self, model=None, model_path: str | None = None, adapter: str | None = None, tokenizer=None
    ) -> dict[str, Any]:
        """What identifies a run (`trl_nca.eval.runner.run_provenance`): model/adapter, tokenizer, context hash,
        scorer, seeds and sampling settings, library versions."""
        return run_provenance(
            self, model, tokenizer, generation=self.generation, model_path=model_path, adapter=adapter
        )

    def prepare(self, tokenizer) -> list[EvalItem]:
        """The runner's name for `items`."""
        return self.items(tokenizer)

    def run(
        self,
        model,
        tokenizer,
        *,
        output_path: str | os.PathLike | None = None,
        backend: GenerationBackend | None = None,
        progress: bool = True,
        model_path: str | None = None,
        adapter: str | None = None,
        provenance: Mapping[str, Any] | None = None,
        desc: str = "paired eval",
    ) -> list[PairedRecord]:
        """Evaluate `model` on every item and return the records in dataset order (`trl_nca.eval.runner.run_paired`;
        `desc` names its progress bar).

        With `output_path`, each finished record is appended to that JSONL file right away, and on a rerun the items
        whose ids are already there are loaded instead of generated (no duplicates; a half-written last line from an
        interruption is discarded). A file written with different settings (model, context, scorer, sampling) or for
        items that changed is refused rather than mixed.
        """
        if provenance is None:
            provenance = self.provenance(model, model_path, adapter, tokenizer=tokenizer)
        return run_paired(
            self,
            model,
            tokenizer,
            generation=self.generation,
            output_path=output_path,
            backend=backend,
            provenance=provenance,
            progress=progress,
            desc=desc,
        )

    def play(
        self,
        items: Sequence[EvalItem],
        generate: GenerateFn,
        tokenizer,
        settings: GenerationSettings,
        on_records: Callable[[list[PairedRecord]], None],
    ) -> None:
        """Generate both views of `items` and pass each chunk's scored records on.

        With `group_samples` (the default), a chunk is `settings.batch_size // k` items (at least one) and each view of
        it is one generate call holding the k samples of every item next to each other, so a backend that shares the
        prefill of repeated prompts (`HFBackend`) runs each prompt once instead of k times; otherwise a chunk is
        `settings.batch_size` items and each view is one call per sample index. Either way sample j of both views of an
        item uses the seed `sample_seed(item seed, j)`, so the samples are the same (see `trl_nca.core.sampling`). After
        the first chunk (both views), the time the whole evaluation will take is estimated from it and logged.
        """
        self._scorer_errors = 0
        k = self.samples_per_view
        per_chunk = max(1, settings.batch_size // k) if self.group_samples else settings.batch_size
        chunks = [items[start : start + per_chunk] for start in range(0, len(items), per_chunk)]
        per_chunk_calls = 2 * (1 if self.group_samples else k)  # both views, every sample index
        clock = _FirstChunkClock(
            generate,
            per_chunk_calls,
            lambda seconds: self._log_estimate(len(items), len(chunks), per_chunk_calls, seconds, settings),
        )
        for chunk in chunks:
            if self.group_samples:
                seeds = [sample_seed(it.seed, j) for it in chunk for j in range(k)]
                flat_x = clock([it.prompt_ids_x for it in chunk for _ in range(k)], seeds)
                flat_xc = clock([it.prompt_ids_xc for it in chunk for _ in range(k)], seeds)
                gen_x = [flat_x[i * k : (i + 1) * k] for i in range(len(chunk))]
                gen_xc = [flat_xc[i * k : (i + 1) * k] for i in range(len(chunk))]
            else:
                samples_x, samples_xc = [], []
                for index in range(k):
                    seeds = [sample_seed(item.seed, index) for item in chunk]
                    samples_x.append(clock([it.prompt_ids_x for it in chunk], seeds))
                    samples_xc.append(clock([it.prompt_ids_xc for it in chunk], seeds))
                gen_x = [[s[i] for s in samples_x] for i in range(len(chunk))]
                gen_xc = [[s[i] for s in samples_xc] for i in range(len(chunk))]
            on_records([self._record(it, gen_x[i], gen_xc[i]) for i, it in enumerate(chunk)])
        if self._scorer_errors:
            logger.warning(
                "%d responses could not be scored because a scorer raised; each counts as wrong and as a format "
                "failure. The summary and report give the count per scorer and view.",
                self._scorer_errors,
            )

    def _log_estimate(
        self, n_items: int, chunks: int, chunk_calls: int, first_chunk_s: float, settings: GenerationSettings
    ) -> None:
        """Log what the evaluation in progress will generate and about how long it will take (`estimate_line`)."""
        if chunks > 1:
            logger.warning(
                estimate_line(
                    n_items, self.samples_per_view, settings.max_new_tokens, chunks, chunk_calls, first_chunk_s
                ),
                extra={PROGRESS: progress_level()},  # a progress line: named for its unit, left out by --quiet
            )

    def _outcome(self, item: EvalItem, generated, view: str) -> ViewOutcome:
        row = self.rows[item.index]
        main = safe_score(self.scorer, generated.text, item.label, row)
        scores = {}
        for scorer in [self.scorer, *self.companions]:
            s = main if scorer is self.scorer else safe_score(scorer, generated.text, item.label, row)
            scores[scorer.name] = {"answer": s.answer, "correct": s.correct, "format_failure": s.format_failure}
            if s.error:
                scores[scorer.name]["error"] = s.error
                self._note_scorer_error(scorer.name, item.item_id, view, s)
        return ViewOutcome(
            completion=generated.text,
            answer=main.answer,
            correct=main.correct,
            num_tokens=len(generated.token_ids),
            truncated=generated.truncated,
            format_failure=main.format_failure,
            extra={"scores": scores},
        )

    def _view(self, item: EvalItem, generated: Sequence[Any], view: str) -> ViewOutcome:
        """Sample 0's outcome, with samples 1..k-1 in `extra["samples"]` (k > 1 only)."""
        outcomes = [self._outcome(item, g, view) for g in generated]
        first = outcomes[0]
        if len(outcomes) > 1:
            first.extra["samples"] = [asdict(o) for o in outcomes[1:]]
        return first

    def _record(self, item: EvalItem, gen_x: Sequence[Any], gen_xc: Sequence[Any]) -> PairedRecord:
        """The scored record of one item from its samples of each view (a list of k); the runner adds the run's
        fields (fingerprint, model, sampling, run key)."""
        label = item.label if isinstance(item.label, (str, int, float, bool)) or item.label is None else str(item.label)
        meta = {
            "index": item.index,
            "label": label,
            "item_seed": item.seed,
            "context_sha256": item.context_sha256,
            "prompt_tokens_x": len(item.prompt_ids_x),
            "prompt_tokens_xc": len(item.prompt_ids_xc),
            "scorer": self.scorer.name,
        }
        if self.samples_per_view > 1:
            meta["samples_per_view"] = self.samples_per_view
        return PairedRecord(item.item_id, self._view(item, gen_x, "x"), self._view(item, gen_xc, "xc"), meta)

    def _note_scorer_error(self, scorer: str, item_id: str, view: str, score) -> None:
        """Count a scorer error; the first one of a run is logged with its traceback."""
        self._scorer_errors += 1
        if self._scorer_errors == 1:
            logger.warning(
                "Scorer %r failed on item %r (view %s): %s. The response counts as wrong and as a format failure; "
                "further scorer errors are only counted.\n%s",
                scorer,
                item_id,
                view,
                score.error,
                score.traceback or "(no traceback: the scorer returned an unusable value)",
            )


MAX_SAMPLES_PER_VIEW = 256
"""The most samples per item and view `PairedEvaluator` accepts. At 256 the per-item success rate resolves 1/256,
finer than any difference a few hundred items can show, and the fr-30 comparison (240 items, 7 models, 32 new tokens)
would already generate about 27 million tokens: days on a 2-core CPU. Larger values are refused before anything is
loaded; below the limit, the estimate line (`estimate_line`) tells what a value costs on the machine in use."""


def estimate_line(
    n_items: int, samples_per_view: int, max_new_tokens: int, chunks: int, chunk_calls: int, first_chunk_s: float
) -> str:
    """The estimate a paired evaluation logs after its first chunk of items: what it generates, and its duration
    extrapolated from that chunk's generate calls, both views of it (the view with the context has the longer
    prompts). Measured on this machine in this run; the first chunk includes one-time warm-up costs, so it errs
    long."""
    replies = n_items * 2 * samples_per_view
    return (
        f"Paired evaluation: {n_items} items x 2 views x {samples_per_view} sample(s) = {replies} replies of at most "
        f"{max_new_tokens} new tokens, in {chunks} chunks of {chunk_calls} generate calls (both views); the first "
        f"chunk took {first_chunk_s:.1f} s, so about {duration(first_chunk_s * chunks)} in all for this model "
        "(measured in this run, not a bound)."
    )


class _FirstChunkClock:
    """A generate function that times its first `calls` calls (the first chunk: both views) and reports their total
    seconds once, the rate behind the evaluation's estimate."""

    def __init__(self, generate: GenerateFn, calls: int, report: Callable[[float], None]):
        self.generate, self.left, self.report, self.seconds = generate, calls, report, 0.0

    def __call__(self, prompts, seeds):
        if self.left <= 0:
            return self.generate(prompts, seeds)
        start = time.perf_counter()
        out = self.generate(prompts, seeds)
        self.seconds += time.perf_counter() - start
        self.left -= 1
        if self.left == 0:
            self.report(self.seconds)
        return out


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample `index` of an item whose seed is `seed`: the item seed itself for sample 0 (the one-sample
    evaluation), a seed derived from it and the index otherwise; both views of a sample use it."""
    return seed if index == 0 else item_seed(seed, f"sample{index}")


def item_fingerprint(item: EvalItem) -> str:
    """sha256 of everything an item's record depends on besides the run settings: id, label, both prompts' tokens."""
    payload = [item.item_id, item.label, item.prompt_ids_x, item.prompt_ids_xc, item.context_sha256]
    return sha256_text(json.dumps(payload, sort_keys=True, default=str))


def _first_items(dataset, limit: int):
    if limit < 0:
        raise EvalInputError(f"limit must be non-negative, got {limit}.")
    if hasattr(dataset, "select"):
        return dataset.select(range(min(limit, len(dataset))))
    return list(dataset)[:limit]


def evaluate_paired(
    model,
    dataset,
    *,
    tokenizer=None,
    adapter: str | None = None,
    context: ContextSpec,
    scorer: str | Scorer | Any = "mcq",
    label_column: str = "answer",
    id_column: str | None = None,
    generation: GenerationSettings | None = None,
    output_path: str | os.PathLike | None = None,
    backend: str = "hf",
    progress: bool = True,
    **evaluator_kwargs,
) -> list[PairedRecord]:
    """One-call paired evaluation of a model (a path or an instance) on a dataset; see `PairedEvaluator`.

    A path is loaded with `load_model` (plus `adapter`); an instance needs `tokenizer`. `backend="vllm"` uses vLLM when
    it is installed (a path is then served by vLLM directly).
    """
    evaluator = PairedEvaluator(
        dataset,
        context=context,
        scorer=scorer,
        label_column=label_column,
        id_column=id_column,
        generation=generation,
        **evaluator_kwargs,
    )
    model_path = model if isinstance(model, str) else None
    if tokenizer is None:
        if model_path is None:
            raise ValueError("Pass the tokenizer when the model is an instance.")
        tokenizer = load_tokenizer(model_path)
    if backend == "vllm":
        engine = VLLMBackend(model, tokenizer, adapter=adapter)
        return evaluator.run(
            engine.llm,
            tokenizer,
            output_path=output_path,
            backend=engine,
            progress=progress,
            model_path=model_path,
            adapter=adapter,
        )
    if backend != "hf":
        raise ValueError(f"Unknown backend {backend!r}; use 'hf' or 'vllm'.")
    if model_path is not None:
        model = load_model(model_path, adapter)
    return evaluator.run(
        model, tokenizer, output_path=output_path, progress=progress, model_path=model_path, adapter=adapter
    )
