"""Train plain OPD and NCA students from the same initial weights on a built-in task, then compare them paired.

The recipe behind `trl-nca compare` and the README's main job:

1. generate the task (`trl_nca.tasks.get_task`): training rows, held-out rows, the context and the scorer;
2. for every training seed and every method (a name plus `NCAConfig` overrides, e.g. `opd:nca_beta=0`,
   `nca:nca_beta=0.5`), train a LoRA student by self-distillation from the same base weights and save its adapter;
3. evaluate the base model and every student on the held-out rows, once without and once with the context, with the
   same per-item seeds and sampling settings (`trl_nca.eval.PairedEvaluator`);
4. write the per-model paired report, a table of mean and spread over seeds, figures (accuracy per view as in the
   paper's Figure 1, training curves, accuracy along training) and a one-sentence reading of the table.

Before any of this, `plan_comparison` checks every setting (counts, seeds, method names and values, the task, an
existing output folder) without loading a model or writing a file; `execute` then runs the plan.

Every step is resumable: a finished run leaves `done.json` (with the settings that shaped the student) next to its
adapter and is not trained again, and the evaluation records are appended item by item and reloaded on a rerun. A
rerun whose settings differ from those recorded (`settings.json` for the comparison, `done.json` per student) is
refused, naming each setting and both values; more seeds or methods may be added. Statistics over runs
(`trl_nca.recipes.statistics`) go into `comparison.json`, `comparison.md` and `harm.png`.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import math
import re
import time
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..core.checks import format_pct, is_int
from ..inputs import InputError, read_json_output, sha256_text, write_text_atomic
from ..tasks import BuiltinTask, get_task, task_names
from ..trainers.script_options import check_dtype
from .budgets import check_token_budgets
from .outcomes import read_per_organism
from .ranges import canonical, json_default, read_against_ranges
from .statistics import COLUMN_NAMES


logger = logging.getLogger(__name__)

SUMMARY_KEYS = ("acc_x", "acc_xc", "delta", "harm", "help", "both_correct", "length_change")


@dataclass
class CompareArguments:
    """Options of `trl-nca compare`; training options are those of `NCAConfig`, model and LoRA options those of
    `trl.ModelConfig` (`model_name_or_path`, `use_peft`, `lora_r`, `lora_target_modules`, ...)."""

    task: str = field(
        default="reply_in_french",
        metadata={"help": f"Built-in task (trl_nca.tasks): one of {', '.join(task_names())}."},
    )
    task_seed: int = field(default=0, metadata={"help": "Seed that generates the task's items."})
    seeds: list[int] = field(default_factory=lambda: [0], metadata={"help": "Training seeds; each method runs once "
                             "per seed (and per organism) from the same initial weights."})  # fmt: skip
    organism_seeds: list[int] | None = field(
        default=None,
        metadata={"help": "With model_name_or_path: organism (or organism-quick), the seeds of independently "
                  "pretrained organisms (each pretrained once and cached); every method and training seed runs on "
                  "each. Default: the one organism of the alias."},
    )  # fmt: skip
    methods: list[str] = field(
        default_factory=lambda: ["opd:nca_beta=0", "nca:nca_beta=0.5"],
        metadata={"help": "Methods as NAME:FIELD=VALUE[,FIELD=VALUE...] overrides of the training config, e.g. "
                  "'opd:nca_beta=0' 'nca:nca_beta=0.5'. The key `trainer` picks the trainer: nca (NCATrainer, the "
                  "default) or sdft (TRL's SDFTTrainer, whose overrides are SDFTConfig fields), e.g. "
                  "'sdft:trainer=sdft'."},
    )  # fmt: skip
    baseline: str | None = field(
        default=None,
        metadata={"help": "The method every other one is paired against in the statistics (default: the first)."},
    )
    num_train: int | None = field(default=None, metadata={"help": "Train on the first N training rows only."})
    eval_items: int | None = field(default=None, metadata={"help": "Evaluate on the first N held-out rows only."})
    eval_batch_size: int = field(default=32, metadata={"help": "Prompts per generate call in the evaluation."})
    eval_max_new_tokens: int | None = field(
        default=None, metadata={"help": "Reply budget of the evaluation (default: the training max_new_tokens)."}
    )
    eval_temperature: float = field(default=1.0, metadata={"help": "Evaluation sampling temperature (OPCD: 1.0)."})
    eval_top_p: float = field(default=0.95, metadata={"help": "Evaluation top-p (OPCD QA: 0.95)."})
    eval_top_k: int = field(default=20, metadata={"help": "Evaluation top-k (OPCD QA: 20)."})
    eval_seed: int = field(default=0, metadata={"help": "Seed of the per-item evaluation random streams."})
    eval_samples_per_view: int = field(
        default=1,
        metadata={
            "help": "Samples per item and view in the evaluation of the base and the students (docs/evaluation.md: "
            "k samples per view); the tracking along training (track_every) uses one."
        },
    )
    track_every: int = field(
        default=0,
        metadata={"help": "Every N optimizer steps, evaluate both views on `track_items` held-out rows (0: never)."},
    )
    track_items: int = field(default=32, metadata={"help": "Held-out rows evaluated along training."})
    monitor_opd: bool = field(
        default=True,
        metadata={"help": "Log nca_loss and view_kl for nca_beta=0 runs too (one extra forward, no gradient)."},
    )
    organism_min_base_acc_xc: float | None = field(
        default=None,
        metadata={"help": "An exclusion rule fixed in advance: an organism whose base Acc_xc (a fraction, e.g. 0.9) is "
                  "below this is excluded after the bases are evaluated, before any student trains, and reported. "
                  "Default: no rule."},
    )  # fmt: skip
    organism_limit: int | None = field(
        default=None,
        metadata={"help": "Run the first N organisms of `organism_seeds` (in the order listed) that pass the exclusion "
                  "rule; the others are reported as not run. Default: all that pass."},
    )  # fmt: skip
    workers: int = field(
        default=1,
        metadata={"help": "Students trained and evaluated at once, each in a process of its own with one CPU thread "
                  "(a CPU with N free cores runs N). The records and tables equal a sequential run's; only the "
                  "measured times differ."},
    )  # fmt: skip


@dataclass
class Method:
    """A named set of `NCAConfig` overrides."""

    name: str
    overrides: dict[str, Any]


METHOD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# fields the comparison sets itself for every run (the task's context, the run's folder and seed)
RECIPE_FIELDS = ("output_dir", "seed", "save_strategy", "context_text", "context_column", "context_placement",
                 "context_template", "context_separator")  # fmt: skip
# NCAConfig fields that cannot change a trained student (where logs and checkpoints go, how progress is shown)
NON_SHAPING_FIELDS = ("output_dir", "logging_dir", "logging_steps", "logging_strategy", "logging_first_step",
                      "logging_nan_inf_filter", "log_level", "log_level_replica", "log_on_each_node", "report_to",
                      "run_name", "project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id",
                      "disable_tqdm", "push_to_hub", "hub_model_id", "hub_strategy", "hub_token", "hub_private_repo",
                      "hub_always_push", "hub_revision", "save_strategy", "save_steps", "save_total_limit",
                      "save_only_model", "save_on_each_node", "resume_from_checkpoint", "skip_memory_metrics",
                      "dataloader_num_workers", "dataloader_persistent_workers", "dataloader_prefetch_factor",
                      "dataloader_pin_memory", "ddp_timeout", "local_rank")  # fmt: skip


class CompareInputError(InputError):
    """Bad input to `trl-nca compare`, found before anything is written or any model is loaded."""


def parse_method(spec: str) -> Method:
    """`"nca:nca_beta=0.5,top_k=64"` -> Method("nca", {"nca_beta": 0.5, "top_k": 64}); values are read as YAML, then
    converted to the field's type by `check_methods` as the command line converts top-level options."""
    name, sep, rest = spec.partition(":")
    if not sep or not name.strip():
        raise CompareInputError(
            f"Method {spec!r} must look like NAME:FIELD=VALUE[,FIELD=VALUE...], e.g. 'opd:nca_beta=0' or "
            "'nca:nca_beta=0.5'."
        )
    overrides: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise CompareInputError(f"In method {spec!r}, {item!r} is not FIELD=VALUE.")
        if key.strip() in overrides:
            raise CompareInputError(f"Method {spec!r} sets {key.strip()!r} twice; set it once.")
        try:
            overrides[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as error:
            raise CompareInputError(
                f"In method {spec!r}, the value of {key.strip()!r} is not valid YAML: {error}"
            ) from error
    return Method(name.strip(), overrides)


def _field_converters(config_class) -> dict[str, Any]:
    """The command line's converter and choices of each field (as `TrlParser` reads top-level options)."""
    from transformers import HfArgumentParser

    parser = HfArgumentParser(config_class)
    return {action.dest: action for action in parser._actions if action.dest != "help"}


def _convert(method: str, key: str, value: Any, action) -> Any:
    if action is None:
        return value
    kind = getattr(action.type, "__name__", "value")
    example = f"Write e.g. {key}={action.default!r}." if action.default is not None else ""
    if value is None:
        if action.default is not None:
            raise CompareInputError(f"Method {method!r}: {key}=null is not allowed; {key} takes a {kind}. {example}")
        return value
    if isinstance(value, list) and action.nargs in ("+", "*"):
        return [_convert(method, key, item, argparse.Namespace(**{**vars(action), "nargs": None})) for item in value]
    if isinstance(value, (list, dict)):
        if action.type in (int, float, bool) or action.choices or action.nargs in ("+", "*"):
            raise CompareInputError(f"Method {method!r}: {key}={value!r} is not a {kind}. {example}")
        return value
    if action.type is None:
        return value
    text = str(value).lower() if isinstance(value, bool) else str(value)
    try:
        converted = action.type(text)
    except (ValueError, TypeError, argparse.ArgumentTypeError) as error:
        kind = getattr(action.type, "__name__", "value")
        raise CompareInputError(
            f"Method {method!r}: {key}={value!r} is not a valid {kind} ({error}). Write e.g. {key}={action.default!r}."
        ) from error
    if action.choices and converted not in action.choices:
        raise CompareInputError(f"Method {method!r}: {key}={value!r} is not one of {list(action.choices)}.")
    return converted


def check_methods(methods: Sequence[Method], config) -> list[Method]:
    """Refuse colliding or ill-formed methods and return them with their values converted to the fields' types."""
    if not methods:
        raise CompareInputError("Give at least one method (`methods`), e.g. ['opd:nca_beta=0', 'nca:nca_beta=0.5'].")
    names = [m.name for m in methods]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise CompareInputError(f"Method names must be unique; {repeated} appear more than once in {names}.")
    from . import sdft

    checked = []
    for method in methods:
        if method.name.lower() == "base":
            raise CompareInputError(
                "'base' is the untrained model's row in every comparison; name the method otherwise."
            )
        if not METHOD_NAME.match(method.name):
            raise CompareInputError(
                f"Method name {method.name!r} names a folder and a table row: use letters, digits, '.', '_' and '-' "
                "(starting with a letter or digit), e.g. 'nca-0.5'."
            )
        try:  # the reserved key `trainer` selects the trainer: nca (NCAConfig overrides) or sdft (SDFTConfig ones)
            trainer = sdft.trainer_of(method.name, method.overrides)
        except sdft.SDFTInputError as error:
            raise CompareInputError(str(error)) from None
        given = {k: v for k, v in method.overrides.items() if k != sdft.TRAINER_KEY}
        config_class = sdft.config_class() if trainer == "sdft" else type(config)
        recipe_fields = sdft.SDFT_RECIPE_FIELDS if trainer == "sdft" else RECIPE_FIELDS
        unknown = sorted(set(given) - {f.name for f in dataclasses.fields(config_class)})
        if unknown:
            hint = " (trainer=sdft takes SDFTConfig fields, e.g. distillation_alpha=0.5)" if trainer == "sdft" else ""
            raise CompareInputError(
                f"Method {method.name!r} sets {unknown}, which are not {config_class.__name__} fields{hint}."
            )
        reserved = sorted(set(given) & set(recipe_fields))
        if reserved:
            hint = " List the training seeds in `seeds`." if "seed" in reserved else ""
            shared = "; for SDFT also the samples per step and the sampling" if trainer == "sdft" else ""
            raise CompareInputError(
                f"Method {method.name!r} sets {reserved}, which the comparison sets for every run itself (the run's "
                f"seed, folder and the task's context{shared}).{hint}"
            )
        actions = _field_converters(config_class)
        overrides = {k: _convert(method.name, k, v, actions.get(k)) for k, v in given.items()}
        if trainer == "sdft":  # recorded with the method (`trainer=nca` is the default, left out)
            overrides = {sdft.TRAINER_KEY: "sdft", **overrides}
        checked.append(Method(method.name, overrides))
    return checked


def _check_sdft_task(methods: Sequence[Method], task: BuiltinTask, train_rows) -> None:
    """A `trainer=sdft` method needs a context on every training row, placed in the user turn (`recipes/sdft.py`)."""
    from . import sdft

    if any(m.overrides.get(sdft.TRAINER_KEY) == "sdft" for m in methods):
        try:
            sdft.check_task(task, train_rows)
        except sdft.SDFTInputError as error:
            raise CompareInputError(str(error)) from None


def _check_count(name: str, value: Any, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not is_int(value) or value < minimum:
        what = f"an integer >= {minimum}" + (" (or null for all)" if optional else "")
        raise CompareInputError(f"`{name}` must be {what}, got {value!r}.")


# seeds are numpy's and torch's random seeds: whole numbers in [0, 2**32)
MAX_SEED = 2**32 - 1


def _check_seed(name: str, seed: Any) -> None:
    if not is_int(seed) or not 0 <= seed <= MAX_SEED:
        raise CompareInputError(
            f"`{name}` holds {seed!r} ({type(seed).__name__}); every seed must be a whole number from 0 to {MAX_SEED}, "
            "e.g. [0, 1, 2]."
        )


def _check_seed_list(name: str, seeds: Any) -> None:
    if seeds is None or (isinstance(seeds, (list, tuple)) and len(seeds) == 0):
        raise CompareInputError(f"Give at least one seed in `{name}`, e.g. [0, 1, 2].")
    if not isinstance(seeds, (list, tuple)):
        raise CompareInputError(f"`{name}` must be a list of seeds, e.g. [0, 1, 2], got {seeds!r}.")
    for seed in seeds:
        _check_seed(name, seed)
    repeated = sorted({s for s in seeds if list(seeds).count(s) > 1})
    if repeated:
        raise CompareInputError(
            f"`{name}` repeats {repeated}: each seed names one run (a repeat would train the same student twice). List "
            "each seed once."
        )


def _annotation_types(annotation: Any) -> tuple[tuple[type, ...], type | None, bool]:
    """(the accepted types, the element type of a list, whether None is accepted) of a field's type hint such as
    `int`, `float`, `str | None` or `list[int] | None` (those of `CompareArguments`)."""
    parts = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (
        annotation,)  # fmt: skip
    optional = type(None) in parts
    (kind,) = [part for part in parts if part is not type(None)]
    if typing.get_origin(kind) is list:
        return (list,), typing.get_args(kind)[0], optional
    return ((int, float) if kind is float else (kind,)), None, optional


def check_types(args: CompareArguments) -> None:
    """Every option of `args` has its declared type. The lists of a YAML config are not converted as the command
    line converts them (nor is anything given in Python), so `organism_seeds: [1.5]` or `seeds: ["a"]` are refused
    here, naming the option."""
    hints = typing.get_type_hints(type(args))
    for spec in dataclasses.fields(args):
        value = getattr(args, spec.name)
        kinds, element, optional = _annotation_types(hints[spec.name])
        if value is None and optional:
            continue
        wrong = isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds)
        if not wrong and element is not None:
            wrong = any(
                isinstance(item, bool) or not isinstance(item, (int, float) if element is float else element)
                for item in value
            )
        if wrong:
            words = {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}
            expected = f"a list of {words[element].split(' ', 1)[1]}s" if element is not None else words[kinds[-1]]
            raise CompareInputError(
                f"`{spec.name}` must be {expected}{' (or null)' if optional else ''}, got {value!r}. {spec.metadata['help']}"
            )


def check_arguments(args: CompareArguments, task: BuiltinTask) -> None:
    """Every count and seed list of `args`, against the task's sizes; raises `CompareInputError`."""
    _check_seed_list("seeds", args.seeds)
    _check_seed("task_seed", args.task_seed)
    _check_seed("eval_seed", args.eval_seed)
    if args.organism_seeds is not None:
        _check_seed_list("organism_seeds", args.organism_seeds)
    _check_count("num_train", args.num_train, 1, optional=True)
    _check_count("eval_items", args.eval_items, 1, optional=True)
    _check_count("eval_batch_size", args.eval_batch_size, 1)
    _check_count("eval_max_new_tokens", args.eval_max_new_tokens, 1, optional=True)
    _check_count("eval_samples_per_view", args.eval_samples_per_view, 1)
    _check_count("track_every", args.track_every, 0)
    _check_count("track_items", args.track_items, 1)
    _check_count("workers", args.workers, 1)
    _check_count("organism_limit", args.organism_limit, 1, optional=True)
    rule = args.organism_min_base_acc_xc
    if rule is not None or args.organism_limit is not None:
        if args.organism_seeds is None:
            raise CompareInputError(
                "`organism_min_base_acc_xc` and `organism_limit` choose among organisms: list them in `organism_seeds`."
            )
    if rule is not None and (isinstance(rule, bool) or not isinstance(rule, (int, float)) or not 0 < rule <= 1):
        raise CompareInputError(
            f"`organism_min_base_acc_xc: {rule!r}` would exclude every organism or none: give a fraction in (0, 1], "
            "e.g. 0.9 for a base Acc_xc of at least 90%, or leave it unset."
        )
    for name, value, available in (("num_train", args.num_train, len(task.train)),
                                   ("eval_items", args.eval_items, len(task.test))):  # fmt: skip
        if value is not None and value > available:
            raise CompareInputError(
                f"`{name}: {value}` asks for more rows than task {task.name!r} has ({available}); give at most "
                f"{available}, or null for all."
            )
    evaluated = len(task.test) if args.eval_items is None else args.eval_items
    if args.track_every > 0 and args.track_items > evaluated:
        raise CompareInputError(
            f"`track_items: {args.track_items}` is more than the {evaluated} held-out rows evaluated; give at most "
            f"{evaluated}."
        )


def run_config(config, task: BuiltinTask, method: Method, seed: int, output_dir: Path, monitor_opd: bool):
    """The training config of one run: the shared config with the task's context, the method's overrides, the seed
    and the run's folder (for a `trainer=sdft` method, the `SDFTConfig` built from them: `recipes/sdft.py`)."""
    from . import sdft

    if method.overrides.get(sdft.TRAINER_KEY) == "sdft":
        return sdft.sdft_config(config, task, method.overrides, seed, output_dir)
    context = task.context
    overrides = {
        "output_dir": str(output_dir),
        "seed": seed,
        "save_strategy": "no",
        "context_text": context.text,
        "context_column": context.column or "context",
        "context_placement": context.placement,
        "context_template": context.template,
        "context_separator": context.separator,
        **method.overrides,
    }
    beta = overrides.get("nca_beta", config.nca_beta)
    if monitor_opd and isinstance(beta, (int, float)) and beta == 0:
        overrides.setdefault("nca_monitor", True)
    return dataclasses.replace(config, **overrides)


def _load_base(model_path: str, model_init_kwargs: dict[str, Any]):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, **model_init_kwargs)


def _dataset(rows: Sequence[dict[str, Any]]):
    from datasets import Dataset

    return Dataset.from_list(list(rows))


def train_run(
    task: BuiltinTask, config, model_path: str, model_init_kwargs, tokenizer, peft_config, train_rows, tracker=None
):
    """Train one student; returns the trainer (its model holds the trained adapter)."""
    from ..trainers.nca_trainer import NCATrainer
    from . import sdft

    model = _load_base(model_path, model_init_kwargs)
    trainer_class = NCATrainer
    if sdft.is_sdft_config(config):
        trainer_class = sdft.sdft_trainer  # TRL's SDFTTrainer on the task's rows as prompt + privileged_context
        train_rows = sdft.sdft_rows(task, train_rows)
    trainer = trainer_class(
        model=model,
        args=config,
        train_dataset=_dataset(train_rows),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[tracker] if tracker is not None else None,
    )
    if tracker is not None:
        tracker.bind(trainer)
    trainer.train()
    return trainer


CURVE_KEYS = ("loss", "opd_loss", "nca_loss", "view_kl", "nca_beta")


def compact_history(log_history: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """The per-step training logs as one list per logged term (`step` plus `CURVE_KEYS`), for figures and JSON."""
    rows = [entry for entry in log_history if "loss" in entry and "step" in entry]
    curves = {"step": [entry["step"] for entry in rows]}
    for key in CURVE_KEYS:
        if any(key in entry for entry in rows):
            curves[key] = [None if entry.get(key) is None else float(f"{entry[key]:.6g}") for entry in rows]
    return curves


def _finite(value: Any) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def diagnostic_rates(task: BuiltinTask, records) -> dict[str, float]:
    """For each diagnostic of the task (a name and a row column, e.g. the organism's twice-applied answer), the
    fraction of responses per view that equal that column after normalisation: `{name}_x` and `{name}_xc` (over all
    k samples of each view with k samples per view)."""
    from ..eval.metrics import view_samples
    from ..eval.scorers import normalize_text

    diagnostics = task.info.get("diagnostics") or {}
    if not diagnostics or not records:
        return {}
    rows = {row["id"]: row for row in task.test}
    rates = {}
    for name, column in diagnostics.items():
        for view in ("x", "xc"):
            hits = [
                normalize_text(sample.completion) == normalize_text(str(rows[r.item_id][column]))
                for r in records
                for sample in view_samples(getattr(r, view))
            ]
            rates[f"{name}_{view}"] = sum(hits) / len(hits)
    return rates


def aggregate(
    summaries: dict[str, list[dict[str, Any]]], keys: Sequence[str] = SUMMARY_KEYS
) -> dict[str, dict[str, Any]]:
    """Mean, sample standard deviation, min and max over seeds of each summary metric, per method."""
    out = {}
    for method, per_seed in summaries.items():
        stats: dict[str, Any] = {"n_seeds": len(per_seed), "regimes": [m.get("regime") for m in per_seed]}
        for key in keys:
            values = [v for v in (_finite(m.get(key)) for m in per_seed) if v is not None]
            if not values:
                stats[key] = None
                continue
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
            stats[key] = {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": len(values)}
        out[method] = stats
    return out


def _pct(stat: dict[str, Any] | None, spread: bool = True) -> str:
    if stat is None:
        return "n/a"
    text = format_pct(stat["mean"])
    if spread and stat["n"] > 1:
        text += f" ± {format_pct(stat['std'])}"
    return text


def render_table(
    aggregated: dict[str, dict[str, Any]], per_seed: dict[str, list[dict[str, Any]]], keys: Sequence[str] = SUMMARY_KEYS
) -> str:
    """Markdown (rates in %): mean ± sample standard deviation over seeds per method, then one row per seed (labelled
    `org{o}/{seed}` when the runs span several organisms)."""
    names = [COLUMN_NAMES.get(k, k) for k in keys]
    header = "| Model | seeds | " + " | ".join(names) + " | Regime |"
    rule = "|" + "---|" * (len(keys) + 3)
    lines = [header, rule]
    for method, stats in aggregated.items():
        cells = [method, str(stats["n_seeds"])] + [_pct(stats[k]) for k in keys]
        cells.append(", ".join(r or "n/a" for r in stats["regimes"]))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Per seed:", "", header.replace("seeds", "seed"), rule]
    for method, rows in per_seed.items():
        for row in rows:
            run = "-" if row.get("seed") is None else str(row["seed"])
            if row.get("organism") is not None:  # several organisms: organism o, training seed s
                run = f"org{row['organism']}" + ("" if row.get("seed") is None else f"/{row['seed']}")
            cells = [method, run]
            cells += [_pct({"mean": row[k], "n": 1}) if _finite(row.get(k)) is not None else "n/a" for k in keys]
            lines.append("| " + " | ".join(cells + [row.get("regime") or "n/a"]) + " |")
    return "\n".join(lines)


def conclusion(task: str, aggregated: dict[str, dict[str, Any]]) -> str:
    """One sentence stating what the table shows for the base, the plain OPD and the NCA students."""

    def num(method: str, key: str) -> str:
        stat = aggregated.get(method, {}).get(key)
        return "n/a" if stat is None else f"{100 * stat['mean']:.0f}%"

    parts = [f"On {task}, the base model answers {num('base', 'acc_x')} without and {num('base', 'acc_xc')} with the "
             "context"]  # fmt: skip
    for method in aggregated:
        if method == "base":
            continue
        regimes = ", ".join(r or "n/a" for r in aggregated[method]["regimes"])
        parts.append(
            f"{method} reaches {num(method, 'acc_x')} without and {num(method, 'acc_xc')} with it (harm "
            f"{num(method, 'harm')}, length change {num(method, 'length_change')}, regime {regimes})"
        )
    return "; ".join(parts) + "."


def _jsonable(value: Any) -> Any:
    """`value` as JSON values; a set becomes a sorted list (its own order changes with every process's hash seed)."""
    return json.loads(json.dumps(value, sort_keys=True, default=json_default))


def training_settings(config, skip: Sequence[str] = ()) -> dict[str, Any]:
    """The `NCAConfig` fields that shape a student (every field but `NON_SHAPING_FIELDS` and `skip`), as JSON values."""
    skipped = {*NON_SHAPING_FIELDS, *skip}
    return _jsonable({k: v for k, v in config.to_dict().items() if k not in skipped})


def _peft_settings(peft_config) -> dict[str, Any]:
    data = peft_config.to_dict() if hasattr(peft_config, "to_dict") else dataclasses.asdict(peft_config)
    return _jsonable({k: v for k, v in data.items() if k not in ("base_model_name_or_path", "revision")})


def _differences(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(setting, old value, new value) for every setting that differs, nested dicts flattened as `a.b`."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = canonical(old.get(key, "<not set>")), new.get(key, "<not set>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append((f"{prefix}{key}", a, b))
    return out


def _refuse_mismatch(
    what: str, path: Path, old: Mapping[str, Any], new: Mapping[str, Any],
    why: str = "Resuming would mix them into one table.",
) -> None:  # fmt: skip
    """Refuse a resume whose settings `new` differ from the recorded `old` (in `path`), listing the first differences;
    `why` says what resuming would do (`trl-nca train` uses it too)."""
    diffs = _differences(old, new)
    if not diffs:
        return
    listed = "; ".join(f"`{k}` was {a!r}, now {b!r}" for k, a, b in diffs[:5])
    more = f" (and {len(diffs) - 5} more)" if len(diffs) > 5 else ""
    raise CompareInputError(
        f"{path} holds {what} made with other settings: {listed}{more}. {why} Use a new output_dir, or set them back."
    )


refuse_changed_settings = _refuse_mismatch  # the public name, for the other commands


@dataclass
class Run:
    """One student of the plan: method, organism (None: the one base model), training seed, folder, settings."""

    name: str
    method: Method
    organism: int | None
    seed: int
    folder: Path
    config: Any
    settings: dict[str, Any]


@dataclass
class Plan:
    """A checked comparison: everything `execute` needs, built without writing a file or loading a model."""

    args: CompareArguments
    task: BuiltinTask
    methods: list[Method]
    baseline: str
    root: Path
    model_paths: dict[int | None, str]
    model_init_kwargs: dict[str, Any]
    peft_config: Any
    train_rows: list[dict[str, Any]]
    test_rows: list[dict[str, Any]]
    evaluator: Any
    settings: dict[str, Any]
    runs: list[Run]

    def base_folder(self, organism: int | None) -> Path:
        return self.root / "base" if organism is None else self.root / f"org{organism}" / "base"

    def base_name(self, organism: int | None) -> str:
        return "base" if organism is None else f"base/org{organism}"


def _organism_spec(alias: str, seed: int):
    from ..models.organism import spec_for_alias

    return dataclasses.replace(spec_for_alias(alias), seed=seed)


def _model_paths(model_name: str, organism_seeds: Sequence[int] | None) -> dict[int | None, str]:
    """Resolve the model (pretraining an organism the first time it is asked for): the last step of the plan."""
    from ..models.names import resolve_model_name_or_path
    from ..models.organism import organism_model_path, use_one_cpu_thread

    if organism_seeds is None:
        return {None: resolve_model_name_or_path(model_name)}
    use_one_cpu_thread()
    return {seed: organism_model_path(_organism_spec(model_name, seed)) for seed in organism_seeds}


def plan_comparison(args: CompareArguments, config, model_args) -> Plan:
    """Check every setting of a comparison, and an existing output folder against it; write and load nothing.

    Raises `CompareInputError` (or the `ValueError` of an invalid config value) naming the problem. The last step
    resolves the model, which pretrains the organism the first time it is asked for (into its cache, not the output).
    """
    check_types(args)
    if args.task not in task_names():
        raise CompareInputError(f"`task: {args.task}` is not a built-in task; choose one of {task_names()}.")
    _check_seed("task_seed", args.task_seed)
    task = get_task(args.task, seed=args.task_seed)
    check_arguments(args, task)
    methods = check_methods([parse_method(m) for m in args.methods], config)
    names = [m.name for m in methods]
    baseline = args.baseline or names[0]
    if baseline not in names:
        raise CompareInputError(f"`baseline: {baseline}` is not one of the methods {names}.")
    model_name = model_args.model_name_or_path or "embedded"
    peft_config = _checked_peft_config(args, model_args, model_name)
    model_init_kwargs = {"dtype": model_args.dtype or "float32", **(config.model_init_kwargs or {})}
    try:
        check_dtype(model_init_kwargs)
    except ValueError as error:
        raise CompareInputError(str(error)) from None
    train_rows = task.train if args.num_train is None else task.train[: args.num_train]
    _check_sdft_task(methods, task, train_rows)
    test_rows = task.test if args.eval_items is None else task.test[: args.eval_items]
    evaluator = _evaluator(args, config, task, test_rows)
    root = Path(config.output_dir)
    if root.exists() and not root.is_dir():
        raise CompareInputError(
            f"output_dir {str(root)!r} is a file, not a folder; give a folder path (new or existing)."
        )
    # what shaped every student (the method's overrides and the seeds are per run) and what shaped the evaluation
    student = {
        "task": task.name,
        "task_seed": args.task_seed,
        "train_rows": len(train_rows),
        "train_rows_sha256": sha256_text(json.dumps(train_rows, sort_keys=True, default=str)),
        "model": model_name,
        "model_init_kwargs": _jsonable(model_init_kwargs),
        "peft": _peft_settings(peft_config),
        "monitor_opd": args.monitor_opd,
        "track_every": args.track_every,
        "track_items": args.track_items,
    }
    evaluation = {k: v for k, v in evaluator.generation.to_dict().items() if k != "batch_size"}
    evaluation["samples_per_view"] = args.eval_samples_per_view
    # the shared training config; each run's seed and the task's context are the comparison's own (per run)
    settings = {"student": student, "training": training_settings(config, RECIPE_FIELDS), "evaluation": evaluation}
    runs = _planned_runs(args, config, task, methods, root, student)
    _check_output_folder(root, settings, runs, len(test_rows))
    _check_task_fits_model(task, model_name)  # an organism by its alias, before it is pretrained
    model_paths = _model_paths(model_name, args.organism_seeds)
    _check_task_fits_model(task, model_name, model_paths)
    check_token_budgets({m.name: run_config(config, task, m, 0, root, False) for m in methods}, train_rows, evaluator, model_paths)  # fmt: skip
    settings["model_paths"] = {str(organism): path for organism, path in model_paths.items()}
    _check_model_paths(root / "settings.json", settings["model_paths"])
    return Plan(args, task, methods, baseline, root, model_paths, model_init_kwargs, peft_config, list(train_rows),
                list(test_rows), evaluator, settings, runs)  # fmt: skip


# the most of a task's prompt and context tokens a model may not know (a byte-level tokenizer knows every text; a
# word-level one, like the organism's, knows its own language only)
MAX_UNKNOWN_FRACTION = 0.01


def _check_task_fits_model(task: BuiltinTask, model_name: str, model_paths: Mapping[Any, str] | None = None) -> None:
    """Refuse a task whose prompts and context the model's tokenizer mostly cannot represent (every unknown word
    becomes the same unknown token in both views). Without `model_paths`, only an organism alias is checked (its
    tokenizer needs no pretraining); with them, the tokenizer of every other model."""
    from ..models.organism import ORGANISM_ALIASES, make_tokenizer, spec_for_alias

    alias = model_name.strip().lower()
    if (alias in ORGANISM_ALIASES) == (model_paths is not None):
        return
    if model_paths is None:
        tokenizer = make_tokenizer(spec_for_alias(alias).facts)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(next(iter(model_paths.values())))
    fraction = task.unknown_token_fraction(tokenizer)
    if fraction <= MAX_UNKNOWN_FRACTION:
        return
    fitting = [
        name for name in task_names() if get_task(name).unknown_token_fraction(tokenizer) <= MAX_UNKNOWN_FRACTION
    ]
    raise CompareInputError(
        f"Task {task.name!r} does not fit model {model_name!r}: {100 * fraction:.0f}% of its prompt and context tokens "
        f"are unknown to the model's tokenizer (each becomes {tokenizer.unk_token!r}), so the students would learn "
        f"nothing of the task. Choose a task in the model's language ({', '.join(fitting) or 'none of the built-in tasks'}) "
        "or another model."
    )


def _checked_peft_config(args: CompareArguments, model_args, model_name: str):
    """The students' LoRA config; `organism_seeds` only with the organism."""
    from trl import get_peft_config

    from ..models.organism import ORGANISM_ALIASES

    if args.organism_seeds is not None and model_name.strip().lower() not in ORGANISM_ALIASES:
        raise CompareInputError(
            f"`organism_seeds` pretrains one organism per seed, so it needs model_name_or_path: organism (or "
            f"organism-quick), not {model_name!r}. Drop organism_seeds, or use the organism."
        )
    peft_config = get_peft_config(model_args)
    if peft_config is None:
        raise CompareInputError("The comparison trains LoRA students (self-distillation from the adapter-off model): "
                                "set use_peft: true.")  # fmt: skip
    check_lora_sizes(model_args, CompareInputError)
    return peft_config


def check_lora_sizes(model_args, error=ValueError) -> None:
    """`lora_r` and `lora_alpha` of a `trl.ModelConfig` with `use_peft`: positive integers (peft accepts r=0 in its
    config and fails only when the adapter is built, after the base model was loaded and evaluated)."""
    for name in ("lora_r", "lora_alpha"):
        value = getattr(model_args, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise error(f"{name} must be an integer >= 1 (the LoRA rank and its scale), got {value!r}.")


def _evaluator(args: CompareArguments, config, task: BuiltinTask, test_rows):
    """The paired evaluator of the base models and the students, with the comparison's sampling settings."""
    from ..eval import GenerationSettings, PairedEvaluator

    generation = GenerationSettings(
        max_new_tokens=args.eval_max_new_tokens or config.max_new_tokens,
        temperature=args.eval_temperature,
        top_p=args.eval_top_p,
        top_k=args.eval_top_k,
        seed=args.eval_seed,
        batch_size=args.eval_batch_size,
    )
    return PairedEvaluator(
        test_rows, context=task.context, scorer=task.scorer, id_column="id", generation=generation,
        samples_per_view=args.eval_samples_per_view,
    )  # fmt: skip


def _planned_runs(args, config, task, methods, root: Path, student: dict[str, Any]) -> list[Run]:
    """One run per method, organism seed and training seed, each with its folder, checked config and settings."""
    organisms: list[int | None] = list(args.organism_seeds) if args.organism_seeds is not None else [None]
    runs = []
    for method in methods:
        for organism in organisms:
            for seed in args.seeds:
                folder = root / method.name / f"seed{seed}" if organism is None else (
                    root / f"org{organism}" / method.name / f"seed{seed}")  # fmt: skip
                name = f"{method.name}/seed{seed}" if organism is None else f"{method.name}/org{organism}/seed{seed}"
                try:  # validates the values
                    run_args = run_config(config, task, method, seed, folder, args.monitor_opd)
                except (ValueError, TypeError) as error:
                    raise CompareInputError(f"Method {method.name!r}: {error}") from error
                run_settings = {**student, "organism_seed": organism, "training": training_settings(run_args)}
                runs.append(Run(name, method, organism, seed, folder, run_args, run_settings))
    return runs


SETTINGS_FIX = (
    "Delete it and run the same command again (the comparison writes it anew from its settings), or use a new "
    "output_dir."
)


def _done_fix(run: Run) -> str:
    return f"Delete the folder {run.folder} (its student is trained again) and run the same command again."


def _check_output_folder(root: Path, settings: dict[str, Any], runs: Sequence[Run], eval_items: int) -> None:
    """An existing output folder must hold this comparison: its settings, its number of evaluated items (in
    `task.json`) and every finished student's settings."""
    saved = root / "settings.json"
    task_file = root / "task.json"
    if task_file.exists():
        old_items = read_json_output(task_file, SETTINGS_FIX).get("num_test", eval_items)
        if old_items != eval_items:
            raise CompareInputError(
                f"{task_file} holds a comparison evaluated on {old_items} held-out items, now {eval_items} (`eval_items`)"
                ". Resuming would mix them into one table. Use a new output_dir, or set them back."
            )
    if saved.exists():  # the resolved model paths are compared after resolving (`_check_model_paths`)
        old = {k: v for k, v in read_json_output(saved, SETTINGS_FIX).items() if k != "model_paths"}
        _refuse_mismatch("a comparison", saved, old, settings)
    for run in runs:
        done = run.folder / "done.json"
        if not done.exists():
            continue
        old = read_json_output(done, _done_fix(run)).get("settings")
        if old is None:
            raise CompareInputError(
                f"{done} was written by an older trl-nca without the settings of its student, so it cannot be checked "
                "against this comparison. Use a new output_dir."
            )
        _refuse_mismatch(f"the student {run.name}", done, old, run.settings)
    if not saved.exists() and any((run.folder / "done.json").exists() for run in runs):
        raise CompareInputError(f"{root} holds finished students but no settings.json; use a new output_dir.")


def _check_model_paths(saved: Path, model_paths: dict[str, str]) -> None:
    """The models the names resolve to (e.g. the organism of another trl-nca version) must be those of the saved
    comparison, where both have them."""
    if saved.exists():
        old = read_json_output(saved, SETTINGS_FIX).get("model_paths", {})
        common = sorted(set(old) & set(model_paths))
        _refuse_mismatch("a comparison", saved, {"model_paths": {k: old[k] for k in common}},
                         {"model_paths": {k: model_paths[k] for k in common}})  # fmt: skip


def run_comparison(args: CompareArguments, config, model_args) -> dict[str, Any]:
    """Check (`plan_comparison`), then train, evaluate and report (`execute`); see the module docstring. Returns the
    summary written to `comparison.json`."""
    return execute(plan_comparison(args, config, model_args))


@dataclass
class Evaluated:
    """What `execute` has evaluated so far: every model's records (`runs`), which method, organism and seed each
    run is (`identity`), and each student's training time, compact log history and tracking rows."""

    runs: list[Any] = field(default_factory=list)
    identity: dict[str, tuple[str, int | None, int | None]] = field(default_factory=dict)
    train_seconds: dict[str, float] = field(default_factory=dict)
    histories: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    tracking: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    exclusion: dict[str, dict[str, Any]] = field(default_factory=dict)


def execute(plan: Plan) -> dict[str, Any]:
    """Train, evaluate and report a checked comparison; returns the summary written to `comparison.json`."""
    start = time.perf_counter()
    _write_plan(plan)
    evaluated = Evaluated()
    tokenizers = _evaluate_bases(plan, evaluated)
    plan = _apply_exclusion(plan, evaluated)
    if plan.args.workers > 1:
        _students_in_workers(plan, tokenizers)
    for run in plan.runs:  # after the workers, each student is loaded back with its records
        _evaluate_student(plan, run, tokenizers[run.organism], evaluated)
    return _report(plan, evaluated, start)


def _apply_exclusion(plan: Plan, evaluated: Evaluated) -> Plan:
    """The exclusion rule and the organism limit of the plan, applied to the evaluated bases: the plan without the
    runs (and base rows) of the organisms left out; each organism's verdict goes to `evaluated.exclusion`."""
    args = plan.args
    if args.organism_min_base_acc_xc is None and args.organism_limit is None:
        return plan
    from ..eval.report import summarize_run

    kept: list[int | None] = []
    for run in list(evaluated.runs):
        _, organism, _ = evaluated.identity[run.name]
        acc_xc = summarize_run(run, n_bootstrap=0)["metrics"].get("acc_xc")
        rule = args.organism_min_base_acc_xc
        if rule is not None and (acc_xc is None or acc_xc < rule):
            verdict = f"excluded: base Acc_xc {100 * (acc_xc or 0):.1f}% < {100 * rule:.1f}%"
        elif args.organism_limit is not None and len(kept) >= args.organism_limit:
            verdict = f"not run: the first {args.organism_limit} organisms that pass are run"
        else:
            kept.append(organism)
            verdict = "included"
        evaluated.exclusion[str(organism)] = {"base_acc_xc": acc_xc, "verdict": verdict}
        logger.warning("Organism %s: %s.", organism, verdict)
    if not kept:
        verdicts = "; ".join(f"organism {o}: {v['verdict']}" for o, v in evaluated.exclusion.items())
        raise CompareInputError(
            f"The exclusion rule `organism_min_base_acc_xc: {args.organism_min_base_acc_xc}` excluded every organism "
            f"({verdicts}); nothing is left to "
            "compare. Pretrain organisms that pass it, or fix the rule before any run."
        )
    evaluated.runs = [r for r in evaluated.runs if evaluated.identity[r.name][1] in kept]
    return dataclasses.replace(plan, runs=[run for run in plan.runs if run.organism in kept])


_WORKER_PLAN: tuple[Plan, dict[int | None, Any]] | None = None


def _student_in_worker(index: int) -> str:
    import torch

    torch.set_num_threads(1)
    plan, tokenizers = _WORKER_PLAN
    run = plan.runs[index]
    _evaluate_student(plan, run, tokenizers[run.organism], Evaluated())
    return run.name


def _students_in_workers(plan: Plan, tokenizers: dict[int | None, Any]) -> None:
    """Train and evaluate the unfinished students in `workers` forked processes, one CPU thread each; each writes its
    folder (`done.json`, adapter, records) as a sequential run would."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    global _WORKER_PLAN
    pending = [i for i, run in enumerate(plan.runs) if not (run.folder / "done.json").exists()]
    if not pending:
        return
    _WORKER_PLAN = (plan, tokenizers)
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(min(plan.args.workers, len(pending)), mp_context=context) as pool:
            for name in pool.map(_student_in_worker, pending):
                logger.info("Student %s finished in a worker.", name)
    finally:
        _WORKER_PLAN = None


def _write_plan(plan: Plan) -> None:
    """The comparison's settings and task, written before anything runs."""
    task = plan.task
    plan.root.mkdir(parents=True, exist_ok=True)
    write_text_atomic(plan.root / "settings.json", json.dumps(plan.settings, indent=2, sort_keys=True) + "\n")
    write_text_atomic(
        plan.root / "task.json",
        json.dumps({"task": task.name, "family": task.family, "description": task.description, **task.info,
                    "num_train": len(plan.train_rows), "num_test": len(plan.test_rows)}, indent=2, default=str) + "\n"
    )  # fmt: skip


def _evaluate_bases(plan: Plan, evaluated: Evaluated) -> dict[int | None, Any]:
    """Evaluate each base model (one per organism seed); returns their tokenizers, which the students share."""
    from transformers import AutoTokenizer

    from ..eval import ModelRun

    tokenizers = {}
    for organism, model_path in plan.model_paths.items():
        tokenizers[organism] = tokenizer = AutoTokenizer.from_pretrained(model_path)
        base = _load_base(model_path, plan.model_init_kwargs)
        prov = plan.evaluator.provenance(base, model_path)
        path = plan.base_folder(organism) / "records.jsonl"
        records = plan.evaluator.run(base, tokenizer, output_path=path, provenance=prov)
        name = plan.base_name(organism)
        evaluated.runs.append(ModelRun(name, records, provenance=prov, records_path=str(path)))
        evaluated.identity[name] = ("base", organism, None)
        del base
    return tokenizers


def _evaluate_student(plan: Plan, run: Run, tokenizer, evaluated: Evaluated) -> None:
    """Train the student of `run` (or load it, when its folder holds a finished one), then evaluate it."""
    from ..eval import ModelRun

    model_path = plan.model_paths[run.organism]
    records_path = run.folder / "eval" / "records.jsonl"
    done_path = run.folder / "done.json"
    if done_path.exists():
        done = read_json_output(done_path, _done_fix(run))
        from peft import PeftModel

        student = PeftModel.from_pretrained(_load_base(model_path, plan.model_init_kwargs), str(run.folder))
    else:
        done, student = _train_student(plan, run, model_path, tokenizer)
        write_text_atomic(done_path, json.dumps(done, indent=2, default=str) + "\n")
    evaluated.train_seconds[run.name] = done["train_seconds"]
    evaluated.histories[run.name] = compact_history(done["log_history"])
    evaluated.tracking[run.name] = [
        {k: row[k] for k in ("step", "acc_x", "acc_xc", "harm_count", "help_count") if k in row}
        for row in done.get("tracking", [])
    ]
    prov = plan.evaluator.provenance(student, model_path, adapter=str(run.folder))
    records = plan.evaluator.run(student, tokenizer, output_path=records_path, provenance=prov)
    evaluated.runs.append(ModelRun(run.name, records, provenance=prov, records_path=str(records_path)))
    evaluated.identity[run.name] = (run.method.name, run.organism, run.seed)
    del student


def _train_student(plan: Plan, run: Run, model_path: str, tokenizer):
    """Train and save the student of `run`; returns its `done.json` record and the trained model."""
    from ..eval import PairedEvalCallback

    args, task = plan.args, plan.task
    tracker = None
    if args.track_every > 0:
        tracker = PairedEvalCallback(
            plan.test_rows, context=task.context, scorer=task.scorer, id_column="id",
            eval_steps=args.track_every, num_items=args.track_items, generation=plan.evaluator.generation,
            eval_on_start=True, final_report=False, n_bootstrap=0,
        )  # fmt: skip
    t0 = time.perf_counter()
    trainer = train_run(
        task, run.config, model_path, plan.model_init_kwargs, tokenizer, copy.deepcopy(plan.peft_config),
        plan.train_rows,
        tracker,
    )  # fmt: skip
    trainer.save_model(str(run.folder))
    done = {
        "method": run.method.name,
        "overrides": run.method.overrides,
        "organism_seed": run.organism,
        "seed": run.seed,
        "settings": run.settings,
        "train_seconds": round(time.perf_counter() - t0, 1),
        "log_history": trainer.state.log_history,
        "tracking": [] if tracker is None else tracker.summary_rows(),
    }
    return done, trainer.accelerator.unwrap_model(trainer.model)


def _per_seed_rows(task: BuiltinTask, evaluated: Evaluated) -> dict[str, list[dict[str, Any]]]:
    """Every evaluated model's metrics as one row, grouped by method (the base models under "base")."""
    from ..eval.report import summarize_run

    per_seed: dict[str, list[dict[str, Any]]] = {}
    for run in evaluated.runs:
        method, organism, seed = evaluated.identity[run.name]
        metrics = summarize_run(run, n_bootstrap=0)["metrics"]
        row = {k: metrics.get(k) for k in SUMMARY_KEYS}
        row.update(diagnostic_rates(task, run.records))
        row.update(regime=metrics.get("regime"), organism=organism, seed=seed)
        per_seed.setdefault(method, []).append(row)
    return per_seed


def _report(plan: Plan, evaluated: Evaluated, start: float) -> dict[str, Any]:
    """The paired report, the table, the statistics over runs and the figures; returns the summary written to
    `comparison.json`."""
    from ..eval import write_report
    from .plots import write_figures
    from .statistics import STAT_KEYS, compare_organisms, compare_to_baseline, distributions, render_statistics

    args, task, root = plan.args, plan.task, plan.root
    report = write_report(evaluated.runs, root / "paired_eval", title=f"{task.name}: base vs students, paired")
    per_seed = _per_seed_rows(task, evaluated)
    extra = ("regime", "organism", "seed")
    keys = [*SUMMARY_KEYS, *(k for k in per_seed["base"][0] if k not in SUMMARY_KEYS and k not in extra)]
    aggregated = aggregate(per_seed, keys)
    table = render_table(aggregated, per_seed, keys)
    sentence = conclusion(task.name, aggregated)
    statistics = {
        "keys": list(STAT_KEYS),
        "baseline": plan.baseline,
        "distributions": distributions(per_seed, STAT_KEYS),
        "paired": compare_to_baseline(per_seed, plan.baseline, STAT_KEYS),
        "organisms": compare_organisms(per_seed, plan.baseline),
    }
    stats_text = render_statistics(statistics, COLUMN_NAMES)
    summary = {
        "task": task.name,
        "family": task.family,
        "methods": {m.name: m.overrides for m in plan.methods},
        "seeds": list(args.seeds),
        "organism_seeds": None if args.organism_seeds is None else list(args.organism_seeds),
        "num_train": len(plan.train_rows),
        "num_test": len(plan.test_rows),
        "settings": plan.settings,
        "evaluation": {**plan.evaluator.generation.to_dict(), "samples_per_view": args.eval_samples_per_view},
        "columns": keys,
        "aggregated": aggregated,
        "per_seed": per_seed,
        "statistics": statistics,
        "conclusion": sentence,
        "versions": report["versions"],
        "wall_seconds": round(time.perf_counter() - start, 1),  # this invocation (a resumed one skips finished work)
        "train_seconds": evaluated.train_seconds,  # each run's training time, measured when it ran
        "curves": evaluated.histories,
        "tracking": evaluated.tracking,
        "exclusion": evaluated.exclusion,
        "report": str(root / "paired_eval" / "report.md"),
    }
    summary["range_reading"] = read_against_ranges(summary)
    summary["organism_reading"] = read_per_organism(summary)
    # with organisms, the reading is per organism against the documented outcomes; else against the documented ranges
    summary["reading"] = summary["organism_reading"] or summary["range_reading"]
    summary["figures"] = write_figures(summary, root)
    write_text_atomic(root / "comparison.json", json.dumps(summary, indent=2, default=str) + "\n")
    write_text_atomic(
        root / "comparison.md",
        f"# {task.name}: base, OPD and NCA\n\n{table}\n\n{sentence} {summary['reading']}\n\n"
        f"## Statistics over runs\n\n{stats_text}\n",
    )
    summary["table"] = table
    summary["statistics_table"] = stats_text
    return summary
