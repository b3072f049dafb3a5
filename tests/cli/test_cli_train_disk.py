"""`trl-nca train` on a full disk (issues 50, 57): each row is a real small tmpfs, full from the start or filled by
another writer during the run, with the one line the command prints and what it leaves in output_dir."""

import json
from pathlib import Path

import pytest

from tests.cli.test_cli_train_input import ROWS, one_line, train_argv


# (case, the disk's size, options, when another writer fills the disk and how many KiB it leaves free, the one expected
# line, the names left in output_dir): a real small tmpfs (4 KiB pages). The tiny model's final save takes 500 KiB
# there: the weights (113 pages), 9 small files (tokenizer, configs, training arguments, the card; one to three pages
# each) and train_settings.json; the room check counts 504 KiB (8 KiB for the card). A disk filled meanwhile (after the
# room check) fails the save at the weights (440 left), the tokenizer (472) or the card (488).
FULL_DISK_CASES = [
    (
        "no room for the final weights",
        "200k",
        ["--save_strategy", "no"],
        None,
        "output_dir '{out}' has 196.0 KiB free, but the final save needs about 504.0 KiB: the weights 451.9 KiB "
        "(115,008 parameters x 4 bytes) and 8 more files 52.0 KiB (tokenizer, configs, training arguments, model card, "
        "train_settings.json; each in whole 4.0 KiB blocks): 308.0 KiB short.",
        None,
    ),
    (
        "room for the weights, not for the files saved with them",
        "470k",
        ["--save_strategy", "no"],
        None,
        "output_dir '{out}' has 468.0 KiB free, but the final save needs about 504.0 KiB",
        None,
    ),
    (
        "the disk fills at the final save's weights",
        "1m",
        ["--save_strategy", "no"],
        ("on_train_end", 440),
        "No space left to write the trained model into {out} (safetensors: Error while serializing: I/O error: No "
        "space left on device (os error 28)); nothing of it was kept as the model and no checkpoint was saved",
        ["train_settings.json"],
    ),
    (
        "the disk fills at the final save's tokenizer",
        "1m",
        ["--save_strategy", "no"],
        ("on_train_end", 472),
        "No space left to write the trained model into {out} (tokenizers: No space left on device (os error 28)); "
        "nothing of it was kept as the model and no checkpoint was saved",
        ["train_settings.json"],
    ),
    (
        "the disk fills at the model card",
        "1m",
        ["--save_strategy", "no"],
        ("on_train_end", 488),
        "No space left to write the model card {out}/README.md ([Errno 28] No space left on device): the trained "
        "model is saved whole in {out} (its weights, config and tokenizer) and nothing needs training again; it has "
        "no card",
        [
            "chat_template.jinja",
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "train_settings.json",
            "training_args.bin",
        ],
    ),
    (
        "the disk fills at a checkpoint's weights",
        "1m",
        ["--save_steps", "1"],
        ("on_train_begin", 440),
        "No space left to write a checkpoint "
        "in {out} (safetensors: Error while serializing: I/O error: No space left on device (os error 28)). Free some "
        "space (or choose an output folder on another disk) and run the same command again (no complete checkpoint was "
        "written yet).",
        ["README.md", "train_settings.json"],
    ),
    (
        "the disk fills at a checkpoint's optimizer",
        "900k",
        ["--save_steps", "1"],
        None,
        "No space left to write a checkpoint in {out} (torch: ",
        ["README.md", "train_settings.json"],
    ),
]


def _fills_the_disk(monkeypatch, event: str, left_kib: int) -> None:
    """Another writer fills the output disk at `event` of the training (a TrainerCallback's), leaving `left_kib`."""
    import shutil as disk_tools

    from transformers import TrainerCallback

    import trl_nca.trainers.nca_trainer

    class Filler(TrainerCallback):
        pass

    def fill(self, args, state, control, **kwargs):
        free = disk_tools.disk_usage(args.output_dir).free
        (Path(args.output_dir).parent / "filler").write_bytes(b"\0" * (free - left_kib * 1024))

    setattr(Filler, event, fill)
    init = trl_nca.trainers.nca_trainer.NCATrainer.__init__

    def with_filler(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.add_callback(Filler())

    monkeypatch.setattr(trl_nca.trainers.nca_trainer.NCATrainer, "__init__", with_filler)


@pytest.mark.slow  # starts `mount` and `umount`
@pytest.mark.parametrize(
    "case, size, extra, filled, expected, left", FULL_DISK_CASES, ids=[c[0] for c in FULL_DISK_CASES]
)
def test_a_full_disk_is_one_line_and_no_half_written_model(
    tiny_dir, tmp_path, capsys, monkeypatch, case, size, extra, filled, expected, left
):
    """A disk too small for the final save is refused before training; one that fills at a save (safetensors'
    SafetensorError, torch's writer error, the tokenizers library's bare Exception, Python's OSError) is one line,
    and no cut model, checkpoint or card is left as if it were one."""
    import subprocess

    from tests.cli.test_safe_outputs import _mount_tmpfs

    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, size):
        pytest.skip("cannot mount a small tmpfs here (needs root and CAP_SYS_ADMIN): the full-disk case is not run")
    try:
        if filled is not None:
            _fills_the_disk(monkeypatch, *filled)
        data = tmp_path / "data.jsonl"
        data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
        out = disk / "out"
        line = one_line(train_argv(tiny_dir, data, out, *extra), capsys)
        assert line.startswith(f"trl-nca train: error: {expected.format(out=out)}"), line
        if left is None:  # refused before training: nothing written
            assert not out.exists()
        else:
            assert sorted(p.name for p in out.iterdir()) == left
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True, timeout=30)
