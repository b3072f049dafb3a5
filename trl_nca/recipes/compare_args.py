"""The options of `trl-nca compare` and their checks: `CompareArguments`, the methods (`parse_method`, `check_methods`)
and every count, seed and type, checked before anything is written or any model is loaded.

A method's values are read as YAML, then converted to the training config's field types by the HF argument parser
that reads the command line's top-level options (`TrlParser`), so `nca:max_steps=3` and `--max_steps 3` convert alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..core.checks import is_int
from ..inputs import InputError
from ..tasks import BuiltinTask, task_names
from . import sdft


@dataclass
class CompareArguments:
    """Options of `trl-nca compare`; training options are those of `NCAConfig`, model and LoRA options those of
    `trl.ModelConfig` (`model_name_or_path`, `use_peft`, `lora_r`, `lora_target_modules`, ...)."""

    task: str = field(
        default="reply_in_french",
        metadata={"help": f"Built-in task (trl_nca.tasks): one of {', '.join(task_names())}."},
    )
    task_seed: int = field(default=0, metadata={"help": "Seed that generates the task's items."})
    seeds: list[int] = field(
        default_factory=lambda: [0],
        metadata={
            "help": "Training seeds; each method runs once per seed (and per organism) from the same initial weights."
        },
    )
    organism_seeds: list[int] | None = field(
        default=None,
        metadata={
            "help": "With model_name_or_path: organism (or organism-quick), the seeds of independently "
            "pretrained organisms (each pretrained once and cached); every method and training seed runs on "
            "each. Default: the one organism of the alias."
        },
    )
    methods: list[str] = field(
        default_factory=lambda: ["opd:nca_beta=0", "nca:nca_beta=0.5"],
        metadata={
            "help": "Methods as NAME:FIELD=VALUE[,FIELD=VALUE...] overrides of the training config, e.g. "
            "'opd:nca_beta=0' 'nca:nca_beta=0.5'. The key `trainer` picks the trainer: nca (NCATrainer, the "
            "default) or sdft (TRL's SDFTTrainer, whose overrides are SDFTConfig fields), e.g. "
            "'sdft:trainer=sdft'."
        },
    )
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
        metadata={
            "help": "An exclusion rule fixed in advance: an organism whose base Acc_xc (a fraction, e.g. 0.9) is "
            "below this is excluded after the bases are evaluated, before any student trains, and reported. "
            "Default: no rule."
        },
    )
    organism_limit: int | None = field(
        default=None,
        metadata={
            "help": "Run the first N organisms of `organism_seeds` (in the order listed) that pass the exclusion "
            "rule; the others are reported as not run. Default: all that pass."
        },
    )
    slice: str | None = field(
        default=None,
        metadata={
            "help": "Run one unit of the comparison and write its slice file to `slices_dir`: `base` (or "
            "`base-orgN`), or a student such as `opd-seed0` (`nca-orgN-seedS` with organisms); the tables are "
            "then built with `from_slices` (trl_nca.recipes.slices). Default: run every unit."
        },
    )
    slices_dir: str | None = field(
        default=None, metadata={"help": "Folder of the slice files of `slice` and `from_slices` (commit it)."}
    )
    from_slices: bool = field(
        default=False,
        metadata={
            "help": "Build the table, statistics and reading from the slice files in `slices_dir` alone, "
            "refusing a missing or left-over unit and a slice made with other settings, data or weights (other "
            "library versions are a warning); nothing is trained or evaluated."
        },
    )
    workers: int = field(
        default=1,
        metadata={
            "help": "Units run at once, each in a process of its own with one CPU thread (a CPU with N free "
            "cores runs N): every student, and every base evaluation too unless `organism_min_base_acc_xc` or "
            "`organism_limit` waits on the bases. The records and tables equal a sequential run's at one "
            "thread; only the measured times differ."
        },
    )


@dataclass
class Method:
    """A named set of `NCAConfig` overrides."""

    name: str
    overrides: dict[str, Any]


METHOD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# fields the comparison sets itself for every run (the task's context: `trl_nca.trainers.nca_config.context_fields`,
# the run's folder and seed)
RECIPE_FIELDS = (
    "output_dir",
    "seed",
    "save_strategy",
    "context_text",
    "context_column",
    "context_placement",
    "context_template",
    "context_separator",
)


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


def _method_parser(config_class):
    """The HF argument parser of `config_class` (as `TrlParser` reads top-level options), raising instead of exiting,
    and its action per field."""
    from transformers import HfArgumentParser

    parser = HfArgumentParser(config_class, exit_on_error=False)
    return parser, {action.dest: action for action in parser._actions if action.dest != "help"}


def _convert(parser, method: str, key: str, value: Any, action, item: bool = False) -> Any:
    """`value` (read as YAML) as the command line converts `--key=value`, by `parser`; a list for a list field item by
    item; null, or a list or mapping for a field that takes one value, refused naming the field's type."""
    if action is None:
        return value
    kind = getattr(action.type, "__name__", "value")
    example = f"Write e.g. {key}={action.default!r}." if action.default is not None else ""
    many = action.nargs in ("+", "*")
    if value is None:
        if action.default is not None:
            raise CompareInputError(f"Method {method!r}: {key}=null is not allowed; {key} takes a {kind}. {example}")
        return value
    if isinstance(value, list) and many and not item:
        return [_convert(parser, method, key, element, action, item=True) for element in value]
    if isinstance(value, (list, dict)):
        if action.type in (int, float, bool) or action.choices or (many and not item):
            raise CompareInputError(f"Method {method!r}: {key}={value!r} is not a {kind}. {example}")
        return value
    if action.type is None:
        return value
    text = str(value).lower() if isinstance(value, bool) else str(value)
    try:
        converted = getattr(parser.parse_known_args([f"--{key}={text}"])[0], action.dest)
    except argparse.ArgumentError as error:
        if error.__context__ is None:  # the value converted, but is not one of the field's choices
            raise CompareInputError(
                f"Method {method!r}: {key}={value!r} is not one of {list(action.choices)}."
            ) from None
        raise CompareInputError(
            f"Method {method!r}: {key}={value!r} is not a valid {kind} ({error.__context__}). Write e.g. "
            f"{key}={action.default!r}."
        ) from error.__context__
    return converted[0] if many else converted


def check_methods(methods: Sequence[Method], config) -> list[Method]:
    """Refuse colliding or ill-formed methods and return them with their values converted to the fields' types."""
    if not methods:
        raise CompareInputError("Give at least one method (`methods`), e.g. ['opd:nca_beta=0', 'nca:nca_beta=0.5'].")
    names = [m.name for m in methods]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise CompareInputError(f"Method names must be unique; {repeated} appear more than once in {names}.")

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
        parser, actions = _method_parser(config_class)
        overrides = {k: _convert(parser, method.name, k, v, actions.get(k)) for k, v in given.items()}
        if trainer == "sdft":  # recorded with the method (`trainer=nca` is the default, left out)
            overrides = {sdft.TRAINER_KEY: "sdft", **overrides}
        checked.append(Method(method.name, overrides))
    return checked


def check_sdft_task(methods: Sequence[Method], task: BuiltinTask, train_rows) -> None:
    """A `trainer=sdft` method needs a context on every training row, placed in the user turn (`recipes/sdft.py`)."""
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


def check_seed(name: str, seed: Any) -> None:
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
        check_seed(name, seed)
    repeated = sorted({s for s in seeds if list(seeds).count(s) > 1})
    if repeated:
        raise CompareInputError(
            f"`{name}` repeats {repeated}: each seed names one run (a repeat would train the same student twice). List "
            "each seed once."
        )


def _annotation_types(annotation: Any) -> tuple[tuple[type, ...], type | None, bool]:
    """(the accepted types, the element type of a list, whether None is accepted) of a field's type hint such as
    `int`, `float`, `str | None` or `list[int] | None` (those of `CompareArguments`)."""
    parts = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else (annotation,)
    )
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
    check_seed("task_seed", args.task_seed)
    check_seed("eval_seed", args.eval_seed)
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
    if (args.slice is not None or args.from_slices) and not args.slices_dir:
        raise CompareInputError(
            "`slice` and `from_slices` read and write slice files: give their folder as `slices_dir`."
        )
    if args.slice is not None and args.from_slices:
        raise CompareInputError(
            "`slice` runs one unit and `from_slices` builds the tables from finished ones: give one of them."
        )
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
    for name, value, available in (
        ("num_train", args.num_train, len(task.train)),
        ("eval_items", args.eval_items, len(task.test)),
    ):
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


def check_lora_sizes(model_args, error=ValueError) -> None:
    """`lora_r` and `lora_alpha` of a `trl.ModelConfig` with `use_peft`: positive integers (peft accepts r=0 in its
    config and fails only when the adapter is built, after the base model was loaded and evaluated). One module name
    in `lora_target_modules` stays a list of one: TRL's `ModelConfig` turns a list of one into its string (for
    `all-linear`), which PEFT reads as a pattern that must match a module's whole name, so it would match none."""
    targets = getattr(model_args, "lora_target_modules", None)
    if isinstance(targets, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", targets):
        model_args.lora_target_modules = [targets]
    for name in ("lora_r", "lora_alpha"):
        value = getattr(model_args, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise error(f"{name} must be an integer >= 1 (the LoRA rank and its scale), got {value!r}.")
