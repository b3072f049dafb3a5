"""What a comparison plans before it runs: one `Run` per student with its config and the settings that shape it, the
`Plan` that holds them, and the checks of an existing output folder and of the model against those settings."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from ..eval import GenerationSettings, PairedEvaluator
from ..inputs import read_json_output
from ..models.names import resolve_model_name_or_path
from ..models.organism import ORGANISM_ALIASES
from ..tasks import BuiltinTask, get_task, task_names
from . import sdft
from .compare_args import CompareArguments, CompareInputError, Method, check_lora_sizes
from .identity import compare_settings, jsonable


logger = logging.getLogger(__name__)


# NCAConfig fields that cannot change a trained student (where logs and checkpoints go, how progress is shown)
NON_SHAPING_FIELDS = (
    "output_dir",
    "logging_dir",
    "logging_steps",
    "logging_strategy",
    "logging_first_step",
    "logging_nan_inf_filter",
    "log_level",
    "log_level_replica",
    "log_on_each_node",
    "report_to",
    "run_name",
    "project",
    "trackio_space_id",
    "trackio_bucket_id",
    "trackio_static_space_id",
    "disable_tqdm",
    "push_to_hub",
    "hub_model_id",
    "hub_strategy",
    "hub_token",
    "hub_private_repo",
    "hub_always_push",
    "hub_revision",
    "save_strategy",
    "save_steps",
    "save_total_limit",
    "save_only_model",
    "save_on_each_node",
    "resume_from_checkpoint",
    "skip_memory_metrics",
    "dataloader_num_workers",
    "dataloader_persistent_workers",
    "dataloader_prefetch_factor",
    "dataloader_pin_memory",
    "ddp_timeout",
    "local_rank",
)


def run_config(config, task: BuiltinTask, method: Method, seed: int, output_dir: Path, monitor_opd: bool):
    """The training config of one run: the shared config with the task's context, the method's overrides, the seed
    and the run's folder (for a `trainer=sdft` method, the `SDFTConfig` built from them: `recipes/sdft.py`)."""
    from ..trainers.nca_config import context_fields

    if method.overrides.get(sdft.TRAINER_KEY) == "sdft":
        return sdft.sdft_config(config, task, method.overrides, seed, output_dir)
    overrides = {
        "output_dir": str(output_dir),
        "seed": seed,
        "save_strategy": "no",
        **context_fields(task.context),
        **method.overrides,
    }
    beta = overrides.get("nca_beta", config.nca_beta)
    if monitor_opd and isinstance(beta, (int, float)) and beta == 0:
        overrides.setdefault("nca_monitor", True)
    return dataclasses.replace(config, **overrides)


def training_settings(config, skip: Sequence[str] = ()) -> dict[str, Any]:
    """The `NCAConfig` fields that shape a student (every field but `NON_SHAPING_FIELDS` and `skip`), as JSON values."""
    skipped = {*NON_SHAPING_FIELDS, *skip}
    return jsonable({k: v for k, v in config.to_dict().items() if k not in skipped})


def peft_settings(peft_config) -> dict[str, Any]:
    data = peft_config.to_dict() if hasattr(peft_config, "to_dict") else dataclasses.asdict(peft_config)
    return jsonable({k: v for k, v in data.items() if k not in ("base_model_name_or_path", "revision")})


def setting_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(setting, old value, new value) for every setting that shapes the numbers and differs, nested dicts flattened
    as `a.b` (`identity.compare_settings`: a library's new default field and its version are no difference)."""
    return compare_settings(old, new).differences


def _refuse_mismatch(
    what: str,
    path: Path,
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    why: str = "Resuming would mix them into one table.",
) -> None:
    """Refuse a resume whose settings `new` differ from the recorded `old` (in `path`), listing the first differences;
    `why` says what resuming would do (`trl-nca train` uses it too). Library versions that differ are a warning."""
    comparison = compare_settings(old, new)
    if comparison.differences:
        raise CompareInputError(
            f"{path} holds {what} made with other settings: {comparison.describe()}. {why} Use a new output_dir, or "
            "set them back."
        )
    if comparison.versions:
        logger.warning(
            "%s holds %s %s; versions are provenance, the settings match.", path, what, comparison.version_note()
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


def resolve_model_paths(model_name: str, organism_seeds: Sequence[int] | None) -> dict[int | None, str]:
    """Resolve the model (pretraining an organism the first time it is asked for): the last step of the plan."""
    from ..models.organism import organism_model_path, use_one_cpu_thread

    if organism_seeds is None:
        return {None: resolve_model_name_or_path(model_name)}
    use_one_cpu_thread()
    return {seed: organism_model_path(_organism_spec(model_name, seed)) for seed in organism_seeds}


# the most of a task's prompt and context tokens a model may not know (a byte-level tokenizer knows every text; a
# word-level one, like the organism's, knows its own language only)
MAX_UNKNOWN_FRACTION = 0.01


def check_task_fits_model(task: BuiltinTask, model_name: str, model_paths: Mapping[Any, str] | None = None) -> None:
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


def checked_peft_config(args: CompareArguments, model_args, model_name: str):
    """The students' LoRA config; `organism_seeds` only with the organism."""
    from trl import get_peft_config

    if args.organism_seeds is not None and model_name.strip().lower() not in ORGANISM_ALIASES:
        raise CompareInputError(
            f"`organism_seeds` pretrains one organism per seed, so it needs model_name_or_path: organism (or "
            f"organism-quick), not {model_name!r}. Drop organism_seeds, or use the organism."
        )
    check_lora_sizes(model_args, CompareInputError)
    peft_config = get_peft_config(model_args)
    if peft_config is None:
        raise CompareInputError(
            "The comparison trains LoRA students (self-distillation from the adapter-off model): set use_peft: true."
        )
    return peft_config


def paired_evaluator(args: CompareArguments, config, task: BuiltinTask, test_rows):
    """The paired evaluator of the base models and the students, with the comparison's sampling settings."""
    generation = GenerationSettings(
        max_new_tokens=args.eval_max_new_tokens or config.max_new_tokens,
        temperature=args.eval_temperature,
        top_p=args.eval_top_p,
        top_k=args.eval_top_k,
        seed=args.eval_seed,
        batch_size=args.eval_batch_size,
    )
    return PairedEvaluator(
        test_rows,
        context=task.context,
        scorer=task.scorer,
        id_column="id",
        generation=generation,
        samples_per_view=args.eval_samples_per_view,
    )


def planned_runs(args, config, task, methods, root: Path, student: dict[str, Any]) -> list[Run]:
    """One run per method, organism seed and training seed, each with its folder, checked config and settings."""
    organisms: list[int | None] = list(args.organism_seeds) if args.organism_seeds is not None else [None]
    runs = []
    for method in methods:
        for organism in organisms:
            for seed in args.seeds:
                folder = (
                    root / method.name / f"seed{seed}"
                    if organism is None
                    else (root / f"org{organism}" / method.name / f"seed{seed}")
                )
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


def done_fix(run: Run) -> str:
    return f"Delete the folder {run.folder} (its student is trained again) and run the same command again."


def check_output_folder(root: Path, settings: dict[str, Any], runs: Sequence[Run], eval_items: int) -> None:
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
    if saved.exists():  # the resolved model paths are compared after resolving (`check_model_paths`)
        old = {k: v for k, v in read_json_output(saved, SETTINGS_FIX).items() if k != "model_paths"}
        _refuse_mismatch("a comparison", saved, old, settings)
    for run in runs:
        done = run.folder / "done.json"
        if not done.exists():
            continue
        old = read_json_output(done, done_fix(run)).get("settings")
        if old is None:
            raise CompareInputError(
                f"{done} was written by an older trl-nca without the settings of its student, so it cannot be checked "
                "against this comparison. Use a new output_dir."
            )
        _refuse_mismatch(f"the student {run.name}", done, old, run.settings)
    if not saved.exists() and any((run.folder / "done.json").exists() for run in runs):
        raise CompareInputError(f"{root} holds finished students but no settings.json; use a new output_dir.")


def check_model_paths(saved: Path, model_paths: dict[str, str]) -> None:
    """The models the names resolve to (e.g. the organism of another trl-nca version) must be those of the saved
    comparison, where both have them."""
    if saved.exists():
        old = read_json_output(saved, SETTINGS_FIX).get("model_paths", {})
        common = sorted(set(old) & set(model_paths))
        _refuse_mismatch(
            "a comparison",
            saved,
            {"model_paths": {k: old[k] for k in common}},
            {"model_paths": {k: model_paths[k] for k in common}},
        )
