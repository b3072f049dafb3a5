"""`trl-nca compare`: TrlParser options (and an optional `--config` YAML) for the comparison recipe
(`trl_nca.recipes`): planned and checked before any model loads or file is written, run, and its tables printed."""

from __future__ import annotations

from pathlib import Path

from ..console import closing_line, say, shows
from ..inputs import output_folder_lock
from . import explain
from .config_files import CommandLineError, check_config_file, with_builtin_config


def compare(argv: list[str] | None = None) -> dict:
    """Parse `trl-nca compare` options (and an optional `--config` YAML), run the comparison, print its table."""
    from trl import ModelConfig, TrlParser

    from ..models.names import EmbeddedModelUnavailableError
    from ..recipes import CompareArguments, execute, plan_comparison
    from ..trainers.nca_config import NCAConfig

    parser = TrlParser((CompareArguments, NCAConfig, ModelConfig), prog="trl-nca compare")
    argv = with_builtin_config(argv)
    check_config_file(argv)
    try:  # the config's own checks, and every check of the comparison (and of an existing output folder)
        compare_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    except (ValueError, TypeError) as error:
        raise CommandLineError(str(error)) from error
    with output_folder_lock(training_args.output_dir, "trl-nca compare"):  # one writer per output folder
        try:  # before any model loads
            plan = plan_comparison(compare_args, training_args, model_args)
        except (ValueError, TypeError, OSError, EmbeddedModelUnavailableError) as error:
            raise CommandLineError(str(error)) from error
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


def _compare_slices(compare_args, plan) -> dict:
    """`trl-nca compare --slice UNIT` (one unit run, its slice written) or `--from_slices` (the tables built from the
    slice files): `trl_nca.recipes.slices`."""
    from ..recipes import slices

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
