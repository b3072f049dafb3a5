"""`trl-nca compare`: TrlParser options (and an optional `--config` YAML) for the comparison recipe
(`trl_nca.recipes`): planned and checked before any model loads or file is written, run, and its tables printed."""

from __future__ import annotations

import logging
from pathlib import Path

from trl import ModelConfig, TrlParser

from ..console import closing_line, say, shows
from ..core.schedule import unread_settings
from ..inputs import output_folder_lock
from ..models.names import EmbeddedModelUnavailableError
from ..recipes import CompareArguments, execute, plan_comparison, slices
from ..trainers.nca_config import NCAConfig
from . import explain
from .config_files import CommandLineError, parse_command_line, with_builtin_config


def compare(argv: list[str] | None = None) -> dict:
    """Parse `trl-nca compare` options (and an optional `--config` YAML), run the comparison, print its table."""
    parser = TrlParser((CompareArguments, NCAConfig, ModelConfig), prog="trl-nca compare")
    argv = with_builtin_config(argv)
    compare_args, training_args, model_args = parse_command_line(parser, argv)  # with the config's own checks
    with output_folder_lock(training_args.output_dir, "trl-nca compare"):  # one writer per output folder
        try:  # before any model loads
            plan = plan_comparison(compare_args, training_args, model_args)
        except (ValueError, TypeError, OSError, EmbeddedModelUnavailableError) as error:
            raise CommandLineError(str(error)) from error
        for line in unread_schedule_settings(training_args, plan.runs):
            logging.getLogger(__name__).warning(line)
        if compare_args.slice is not None or compare_args.from_slices:
            return _compare_slices(compare_args, plan)
        explain.opening(explain.compare_opening(plan))
        summary = execute(plan)
    if shows("units"):
        print(f"\n{summary['table']}\n\n{summary['conclusion']}\n{summary['reading']}\n")
        if summary.get("tracking_reading"):
            print(f"{summary['tracking_reading']}\n")
        print(f"{summary['statistics_table']}\n")
        print(f"Figures: {', '.join(summary['figures'].values())}")
        print(f"Full paired report: {summary['report']}")
    else:  # --quiet: the opening line, the table and the closing line
        print(f"\n{summary['table']}\n")
    output = Path(training_args.output_dir)
    say(
        closing_line(
            "compare",
            summary["sittings"][-1]["wall_seconds"] if summary.get("sittings") else summary["wall_seconds"],
            explain.outputs_of(
                table=output / "comparison.md", summary=output / "comparison.json", report=summary["report"]
            ),
        )
    )
    return summary


def unread_schedule_settings(shared, runs) -> list[str]:
    """One line per schedule field set away from its default that the run it shapes never reads, as `trl-nca train`
    names them (`core.schedule.unread_settings`): a field of the shared config that no method's schedule reads, and a
    method's own override that its schedule does not read (a method of another trainer, e.g. sdft, reads none)."""
    runs = [run for run in runs if hasattr(run.config, "nca_beta_schedule")]
    kinds = {}
    for run in runs:
        if float(run.config.nca_beta) != 0:
            kinds.setdefault(run.config.nca_beta_schedule)
    lines = unread_settings(shared, kinds=list(kinds)) if runs and hasattr(shared, "nca_beta_schedule") else []
    for method in {run.method.name: run for run in runs}.values():
        own = [line for line in unread_settings(method.config) if line.split("=", 1)[0] in method.method.overrides]
        lines += [f"Method {method.method.name!r}: {line}" for line in own]
    return lines


def _compare_slices(compare_args, plan) -> dict:
    """`trl-nca compare --slice UNIT` (one unit run, its slice written) or `--from_slices` (the tables built from the
    slice files): `trl_nca.recipes.slices`."""
    try:
        if compare_args.from_slices:
            summary = slices.build_from_slices(plan, compare_args.slices_dir)
            print(f"\n{summary['table']}\n\n{summary['conclusion']}\n\n{summary['statistics_table']}\n")
            print(f"Built from the slices in {compare_args.slices_dir}: {plan.root / 'comparison.md'}")
            return summary
        path = slices.run_slice(plan, compare_args.slice, compare_args.slices_dir)
    except slices.SliceError as error:
        raise CommandLineError(str(error)) from error
    missing = slices.missing_units(plan, compare_args.slices_dir)
    piece = slices.Slice.load(path)
    print(f"Slice {compare_args.slice} written: {path}\n{slices.describe_slice(piece)}")
    print(
        f"Units still without a slice: {', '.join(missing)}"
        if missing
        else f"Every unit has its slice: build the tables with --from_slices --slices_dir {compare_args.slices_dir}"
    )
    return piece.as_dict()
