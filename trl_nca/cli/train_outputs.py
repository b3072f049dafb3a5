"""What `trl-nca train` writes into its output folder, and what it refuses to overwrite there: the folder checked
before any model loads (`check_output_dir`), the room for the final save checked before training
(`check_room_for_final_save`), the final model written whole (`save_model_whole`), its card written whole
(`write_model_card`), and a write cut by a full disk reported in one line (`write_failure`,
`checkpoint_write_failures`)."""

from __future__ import annotations

import contextlib
import io
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError

from ..inputs import FULL_DISK_ERRNOS, InputError, OutputError
from ..trainers.checkpoints import checkpoint_problem, checkpoints_of, last_complete_checkpoint


TRAIN_SETTINGS = "train_settings.json"  # what shaped a `trl-nca train` run, checked when it is resumed
STAGING = ".saving-model"  # the final model is written here, then moved into output_dir whole
COMPARE_FILES = ("settings.json", "task.json")  # what `trl-nca compare` writes first into its output folder
CARD_ALLOWANCE = 8 << 10  # bytes of the model card TRL writes (2-3 KiB with its citations), counted by the room check


def check_output_dir(output_dir: str, resume: str | None) -> None:
    """Before any model loads: `output_dir` must not hold what the run would overwrite. A `trl-nca compare` folder is
    refused (the model would land among the comparison's files and replace its README.md); without a checkpoint to
    resume, so is a folder holding a trained model or the checkpoints of an interrupted run (a fresh run would
    replace them from step 1). A folder holding only a `train_settings.json` (a run refused or failed before its
    first checkpoint) is trained into again."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return
    if all((folder / name).is_file() for name in COMPARE_FILES):
        raise InputError(
            f"output_dir {output_dir!r} holds a `trl-nca compare` run ({', '.join(COMPARE_FILES)}): `trl-nca train` "
            "would write its model among the comparison's files and replace its README.md. Give another output_dir."
        )
    if resume is not None:
        return
    weights = sorted(
        p.name
        for p in folder.iterdir()
        if p.is_file() and (p.suffix == ".safetensors" or p.name.endswith((".safetensors.index.json", "model.bin")))
    )
    if weights:
        raise InputError(
            f"output_dir {output_dir!r} holds a trained model ({', '.join(weights)}): a new run would replace it "
            "without a trace. Give a new output_dir (or delete this one to train anew); to train this run further, "
            "add --resume_from_checkpoint true with a longer max_steps."
        )
    checkpoints = checkpoints_of(folder)
    if checkpoints:
        last, _ = last_complete_checkpoint(folder)
        kept = f"its last complete one is {last.name}" if last is not None else "none of them is complete"
        raise InputError(
            f"output_dir {output_dir!r} holds the checkpoints of an unfinished run ({len(checkpoints)}; {kept}): a "
            "new run would train from step 1 and overwrite them. Run the same command with --resume_from_checkpoint "
            "true to continue it, or give a new output_dir (or delete this one to train anew)."
        )


def write_failure(error: BaseException) -> str | None:
    """What a failed write of the model says, when it is a full disk: torch's stream writer reports it as a
    RuntimeError, safetensors as a `SafetensorError` and the tokenizers library as a bare `Exception` (Rust's
    "os error 28", no `OSError`), Python as an `OSError` (ENOSPC, EDQUOT)."""
    text = str(error).splitlines()[0][:160] if str(error) else type(error).__name__
    rust = ("os error 28", "No space left", "StorageFull", "os error 122", "Disk quota")  # Rust's io::Error texts
    if isinstance(error, OSError):
        return text if error.errno in FULL_DISK_ERRNOS else None
    if isinstance(error, SafetensorError):
        return f"safetensors: {text}" if any(marker in str(error) for marker in rust) else None
    if isinstance(error, RuntimeError):
        markers = ("PytorchStreamWriter failed writing", "file write failed", "inline_container")  # torch's writer
        return f"torch: {text}" if any(marker in str(error) for marker in markers) else None
    if type(error) is Exception and any(marker in str(error) for marker in rust):  # the tokenizers library
        return f"tokenizers: {text}"
    return None


@contextlib.contextmanager
def checkpoint_write_failures(trainer, training_args):
    """A checkpoint that cannot be written (a full disk; torch's, safetensors' and Python's errors alike) is the one
    line of every other full disk; the cut checkpoint folder is removed (the last complete one stays the one to
    resume)."""
    try:
        yield
    except Exception as error:
        what = write_failure(error)
        if what is None:
            raise
        cut = Path(training_args.output_dir) / f"checkpoint-{trainer.state.global_step}"
        if cut.is_dir() and checkpoint_problem(cut) is not None and trainer.accelerator.is_main_process:
            shutil.rmtree(cut, ignore_errors=True)
        last, _ = last_complete_checkpoint(training_args.output_dir)
        then = (
            f"run the same command with --resume_from_checkpoint true: the last complete checkpoint ({last.name}) is "
            "kept"
            if last is not None
            else "run the same command again (no complete checkpoint was written yet)"
        )
        raise OutputError(
            f"No space left to write a checkpoint in {training_args.output_dir} ({what}). Free some space (or choose "
            f"an output folder on another disk) and {then}."
        ) from error


def save_model_whole(trainer, output_dir: str) -> None:
    """`trainer.save_model(output_dir)`, written into a staging folder first and moved into `output_dir` only once
    every file is written: a save cut by a full disk leaves the files of `output_dir` as they were (never a
    half-written model presented as the model) and is one line."""
    output = Path(output_dir)
    staging = output / STAGING
    main = trainer.accelerator.is_main_process
    if main and staging.exists():
        shutil.rmtree(staging, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    try:
        trainer.save_model(str(staging))
    except Exception as error:
        if main:
            shutil.rmtree(staging, ignore_errors=True)
        what = write_failure(error)
        if what is None:
            raise
        last, _ = last_complete_checkpoint(output)
        kept = (
            f"its last complete checkpoint ({last.name}) is kept: free some space (or choose an output folder on "
            "another disk) and run the same command with --resume_from_checkpoint true"
            if last is not None
            else "no checkpoint was saved: free some space (or choose an output folder on another disk) before "
            "training again"
        )
        raise OutputError(
            f"No space left to write the trained model into {output} ({what}); nothing of it was kept as the model "
            f"and {kept}. `trl-nca train` checks the room for the final save before it trains: another writer filled "
            "the disk meanwhile, or checkpoints took the room."
        ) from error
    trainer.accelerator.wait_for_everyone()
    if main:
        for path in sorted(staging.iterdir()):
            target = output / path.name
            if target.is_dir() and not path.is_dir():
                shutil.rmtree(target)
            os.replace(path, target)
        staging.rmdir()


def write_model_card(trainer, output_dir: str, **card_args) -> None:
    """`trainer.create_model_card(**card_args)` (main process), whole or not at all: the card of the last checkpoint
    is moved aside first and put back if the new one cannot be written, so a full disk never leaves an empty or cut
    README.md; it is one line saying that the model is saved and nothing needs training again."""
    if not trainer.accelerator.is_main_process:
        return
    card = Path(output_dir) / "README.md"
    earlier = card.with_name(".README.md.earlier")
    had = card.is_file()
    if had:
        os.replace(card, earlier)
    try:
        trainer.create_model_card(**card_args)
    except BaseException as error:
        with contextlib.suppress(OSError):
            card.unlink(missing_ok=True)
            if had:
                os.replace(earlier, card)
        what = write_failure(error) if isinstance(error, Exception) else None
        if what is None:
            raise
        kept = "the card of its last checkpoint is kept" if had else "it has no card"
        raise OutputError(
            f"No space left to write the model card {card} ({what}): the trained model is saved whole in {output_dir} "
            f"(its weights, config and tokenizer) and nothing needs training again; {kept} ({TRAIN_SETTINGS} records "
            "how it was trained). Free some space for files you add there."
        ) from error
    if had:
        earlier.unlink(missing_ok=True)


def final_save_sizes(trainer) -> tuple[dict[str, int], int, str]:
    """The files the final save writes and their sizes in bytes, with the number of weights saved and their kind: the
    weights (the adapter with LoRA, else every parameter) as parameter count x dtype size plus the safetensors
    header, the tokenizer and configs measured by writing them into a temporary folder, the pickled training
    arguments, and `CARD_ALLOWANCE` for the model card."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    adapter = hasattr(model, "peft_config")
    saved = [(name, p) for name, p in model.named_parameters() if p.requires_grad or not adapter]
    header = 8 + sum(len(name) + 96 for name, _ in saved)  # a JSON entry per tensor: dtype, shape, offsets
    count = sum(getattr(p, "ds_numel", p.numel()) for _, p in saved)  # ZeRO-3 partitions hold a part: ds_numel all
    size = saved[0][1].element_size() if saved else 0
    sizes = {"adapter weights" if adapter else "weights": header + count * size}
    with tempfile.TemporaryDirectory() as folder:
        if trainer.processing_class is not None:
            trainer.processing_class.save_pretrained(folder)
        configs = (
            list(model.peft_config.values()) if adapter else [model.config, getattr(model, "generation_config", None)]
        )
        for config in filter(None, configs):
            config.save_pretrained(folder)
        sizes.update({p.name: p.stat().st_size for p in Path(folder).iterdir() if p.is_file()})
    buffer = io.BytesIO()
    torch.save(trainer.args, buffer)
    sizes["training_args.bin"] = buffer.tell()
    sizes["README.md"] = CARD_ALLOWANCE
    return sizes, count, f"{'adapter ' if adapter else ''}parameters x {size}"


def check_room_for_final_save(trainer, output_dir: str, written_first: dict[str, int]) -> None:
    """Before training: the output disk must have room for everything the final save writes (`final_save_sizes`)
    and for the files written before training (`written_first`, e.g. `train_settings.json`), each file rounded up to
    the disk's whole blocks, as the disk counts it."""
    sizes, count, unit = final_save_sizes(trainer)
    try:
        block = os.statvfs(output_dir).f_frsize or 4096
    except (AttributeError, OSError):
        block = 4096
    taken = {name: math.ceil(size / block) * block for name, size in {**sizes, **written_first}.items()}
    need, free = sum(taken.values()), shutil.disk_usage(output_dir).free
    if free >= need:
        return
    weights = next(iter(sizes))
    others = need - taken[weights]
    raise OutputError(
        f"output_dir {output_dir!r} has {size_text(free)} free, but the final save needs about {size_text(need)}: the "
        f"{weights} {size_text(sizes[weights])} ({count:,} {unit} bytes) and {len(taken) - 1} more files "
        f"{size_text(others)} (tokenizer, configs, training arguments, model card, {TRAIN_SETTINGS}; each in whole "
        f"{size_text(block)} blocks): {size_text(need - free)} short. Free that much space, or choose an output folder "
        "on another disk, before training."
    )


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
