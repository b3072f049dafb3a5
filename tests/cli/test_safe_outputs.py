"""Nothing lost, nothing mixed (issue 27): outputs written whole, one writer per output folder, clean interrupts,
incomplete checkpoints never resumed, cut files named, and resume keys that do not depend on how a path is spelled."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trl_nca.cli import main as cli_main


ROOT = Path(__file__).resolve().parents[2]


def _as_command(monkeypatch, name: str, function) -> None:
    """Run `function(argv)` as the command `name` (`trl_nca.cli.COMMANDS` names a module and a function in it)."""
    monkeypatch.setattr(sys.modules[__name__], f"_command_{name}", function, raising=False)
    monkeypatch.setitem(sys.modules["trl_nca.cli"].COMMANDS, name, (__name__, f"_command_{name}"))


def child_env(**extra):
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), **extra)


def train_argv(tiny_dir, output_dir, *extra):
    return [
        "--model_name_or_path",
        tiny_dir,
        "--dataset_name",
        "quickstart",
        "--max_train_samples",
        "8",
        "--per_device_train_batch_size",
        "2",
        "--max_steps",
        "4",
        "--max_new_tokens",
        "4",
        "--learning_rate",
        "1e-3",
        "--save_strategy",
        "steps",
        "--save_steps",
        "2",
        "--logging_steps",
        "1",
        "--output_dir",
        str(output_dir),
        "--bf16",
        "false",
        "--use_cpu",
        "true",
        "--report_to",
        "none",
        *extra,
    ]


def compare_config(tmp_path, tiny_dir, out, **changes):
    fields = {
        "model_name_or_path": tiny_dir,
        "task": "reply_in_french",
        "seeds": "[0]",
        "methods": '["opd:nca_beta=0", "nca:nca_beta=0.5"]',
        "num_train": 2,
        "eval_items": 2,
        "max_new_tokens": 3,
        "max_steps": 1,
        "per_device_train_batch_size": 2,
        "learning_rate": "1.0e-3",
        "use_peft": "true",
        "lora_r": 2,
        "lora_alpha": 4,
        "lora_target_modules": "[q_proj, v_proj]",
        "report_to": "none",
        "disable_tqdm": "true",
        "output_dir": str(out),
        **changes,
    }
    config = tmp_path / f"compare-{out.name}.yaml"
    config.write_text("".join(f"{key}: {value}\n" for key, value in fields.items()))
    return config


# --- atomic outputs ----------------------------------------------------------------------------------------------------


def test_an_interrupted_write_leaves_the_earlier_file_whole(tmp_path):
    from trl_nca.inputs import atomic_output, write_text_atomic

    path = tmp_path / "done.json"
    write_text_atomic(path, '{"old": true}\n')
    with pytest.raises(KeyboardInterrupt):
        with atomic_output(path) as temporary:
            temporary.write_text('{"new": ')  # half written when the interrupt lands
            raise KeyboardInterrupt
    assert path.read_text() == '{"old": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["done.json"]  # the temporary file is gone


def test_a_figure_is_written_whole_in_its_format(tmp_path):
    from trl_nca.eval.plots import new_figure
    from trl_nca.inputs import atomic_output

    fig = new_figure(2, 2)
    fig.add_subplot(1, 1, 1).plot([0, 1], [0, 1])
    with atomic_output(tmp_path / "a.png") as temporary:
        fig.savefig(temporary)
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and len(list(tmp_path.iterdir())) == 1


def _mount_tmpfs(folder: Path, size: str) -> bool:
    folder.mkdir()
    try:
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0


@pytest.mark.slow  # starts `mount` and `umount`
def test_a_full_disk_is_one_line_naming_the_file_and_keeps_the_earlier_file(tmp_path, capsys, monkeypatch):
    from trl_nca.inputs import OutputError, write_text_atomic

    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "64k"):
        pytest.skip("cannot mount a small tmpfs here (needs root and CAP_SYS_ADMIN): the full-disk case is not run")
    try:
        path = disk / "comparison.json"
        write_text_atomic(path, '{"whole": true}\n')
        with pytest.raises(OutputError, match=rf"No space left to write {path} .*Free some space"):
            write_text_atomic(path, "x" * 200_000)
        assert path.read_text() == '{"whole": true}\n' and [p.name for p in disk.iterdir()] == ["comparison.json"]

        def report(argv):  # a command whose report runs out of space
            write_text_atomic(disk / "report.md", "y" * 200_000)

        _as_command(monkeypatch, "eval", report)
        assert cli_main(["eval"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "trl-nca eval: error: No space left to write" in err and "Traceback" not in err
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True, timeout=30)


def test_a_disk_full_error_anywhere_in_a_command_is_one_line(capsys, monkeypatch):
    import errno

    def save(argv):
        raise OSError(errno.ENOSPC, "No space left on device", "/out/model.safetensors")

    _as_command(monkeypatch, "train", save)
    assert cli_main(["train"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("trl-nca train: error: No space left to write /out/model.safetensors") and err.count("\n") == 1
    )


# --- incomplete checkpoints ------------------------------------------------------------------------------------------


def fake_checkpoint(folder: Path, complete: bool) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}\n")
    if complete:  # what a checkpoint is judged by: its state and the files Trainer writes before it
        for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
            (folder / name).write_bytes(b"")
        (folder / "trainer_state.json").write_text('{"global_step": 2}\n')
    return folder


def test_resume_skips_a_checkpoint_whose_save_was_cut_off(tmp_path, caplog):
    from trl_nca.trainers.checkpoints import resolve_resume
    from trl_nca.trainers.script_options import resume_checkpoint

    good = fake_checkpoint(tmp_path / "checkpoint-2", complete=True)
    cut = fake_checkpoint(tmp_path / "checkpoint-4", complete=False)
    assert resume_checkpoint("true", str(tmp_path)) == resolve_resume(True, str(tmp_path)) == str(good)
    assert f"Skipping {cut}: it holds no trainer_state.json" in caplog.text
    with pytest.raises(ValueError, match=r"checkpoint-4' cannot be resumed: it holds no trainer_state.json"):
        resume_checkpoint(str(cut), str(tmp_path))
    (cut / "trainer_state.json").write_text('{"global_st')  # cut in the middle of the last file
    with pytest.raises(ValueError, match=r"its trainer_state.json is cut"):
        resolve_resume(str(cut), str(tmp_path))
    only_cut = tmp_path / "other"
    fake_checkpoint(only_cut / "checkpoint-3", complete=False)
    with pytest.raises(
        ValueError, match=r"holds no checkpoint-N folder to resume from that is complete \(.*incomplete"
    ):
        resume_checkpoint("true", str(only_cut))


def test_resuming_a_model_folder_is_refused_before_loading(tiny_dir, tmp_path, capsys):
    assert cli_main(["train", *train_argv(tiny_dir, tmp_path / "t", "--resume_from_checkpoint", tiny_dir)]) == 2
    err = capsys.readouterr().err
    assert "is a model folder, not a checkpoint" in err and "Traceback" not in err and err.count("\n") == 1


# Runs `trl-nca train`; the process sends itself SIGINT in the middle of optimizer step INTERRUPT_AT (inside the
# training step, as a user's Ctrl-C lands).
INTERRUPT_MID_STEP = """
import os, signal, sys
import trl_nca.trainers.nca_trainer as module

step = module.NCATrainer.training_step
def interrupted(self, *args, **kwargs):
    if self.state.global_step == int(os.environ["INTERRUPT_AT"]):
        os.kill(os.getpid(), signal.SIGINT)
    return step(self, *args, **kwargs)
module.NCATrainer.training_step = interrupted
from trl_nca.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # the interrupted run is a process of its own
def test_ctrl_c_in_train_saves_a_checkpoint_and_ends_in_one_line(tiny_dir, tmp_path):
    from trl_nca.cli import train as cli_train

    out = tmp_path / "run"
    argv = train_argv(tiny_dir, out, "--save_steps", "100")  # no checkpoint of its own before the interrupt
    result = subprocess.run(
        [sys.executable, "-c", INTERRUPT_MID_STEP, "train", *argv],
        cwd=tmp_path,
        env=child_env(INTERRUPT_AT="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 130, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("trl-nca train: interrupted at step 2; the run is saved in") and "checkpoint-2" in last
    assert json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2
    assert not (out / "model.safetensors").exists() and not (out / ".trl-nca.lock").exists()
    resumed = cli_train(train_argv(tiny_dir, out, "--save_steps", "100", "--resume_from_checkpoint", "true"))
    assert resumed.state.global_step == 4 and (out / "model.safetensors").exists()


# --- one writer per output folder -------------------------------------------------------------------------------------


HOLD_LOCK = """
import sys, time
from trl_nca.inputs import output_folder_lock
with output_folder_lock(sys.argv[1], "trl-nca compare"):
    print("locked", flush=True)
    time.sleep(600)
"""


@pytest.mark.slow  # the lock's holder is a process of its own
def test_a_locked_folder_is_refused_at_once_and_a_killed_holder_frees_it(tiny_dir, tmp_path, capsys):
    from trl_nca.inputs import output_folder_lock

    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(out)], env=child_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        start = time.perf_counter()
        assert cli_main(["train", *train_argv(tiny_dir, out)]) == 2
        err = capsys.readouterr().err
        assert f"{out} is in use by another trl-nca run (pid {holder.pid}, trl-nca compare)" in err, err
        assert err.count("\n") == 1 and time.perf_counter() - start < 30  # refused before any model loads
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    with output_folder_lock(out, "test"):  # a SIGKILLed holder leaves no stale lock
        pass


@pytest.mark.slow  # two real `trl-nca compare` processes
def test_two_compare_runs_started_together_into_one_folder(tiny_dir, tmp_path):
    out = tmp_path / "out"
    config = compare_config(tmp_path, tiny_dir, out)
    command = [sys.executable, "-m", "trl_nca.cli", "compare", "--config", str(config)]
    runs = [
        subprocess.Popen(
            command, cwd=tmp_path, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    results = [(run.pid, *run.communicate(timeout=900), run.returncode) for run in runs]
    codes = sorted(code for *_, code in results)
    assert codes == [0, 2], [(code, err[-2000:]) for _, _, err, code in results]
    (refused,) = [r for r in results if r[3] == 2]
    (winner,) = [r for r in results if r[3] == 0]
    assert f"{out} is in use by another trl-nca run (pid {winner[0]}, trl-nca compare)" in refused[2]
    assert "Traceback" not in refused[2]
    for records in out.rglob("records.jsonl"):  # every item once
        ids = [json.loads(line)["item_id"] for line in records.read_text().splitlines()]
        assert len(ids) == len(set(ids)) == 2, records


# --- compare killed at a write; cut and garbled files of older runs ----------------------------------------------------


# Runs `trl-nca compare` and SIGKILLs the process in the middle of writing the first student's done.json: half the
# text is on disk (as a full disk or a kill leaves it) when the process dies.
KILL_AT_DONE = """
import os, signal, sys
from pathlib import Path

write_text = Path.write_text
def cut(self, text, *args, **kwargs):
    if "done" in self.name:
        with open(self, "w") as handle:
            handle.write(text[: len(text) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    return write_text(self, text, *args, **kwargs)
Path.write_text = cut
from trl_nca.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # the killed comparison is a process of its own
def test_compare_killed_at_a_write_resumes_and_cut_files_are_named(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    config = compare_config(tmp_path, tiny_dir, out)
    result = subprocess.run(
        [sys.executable, "-c", KILL_AT_DONE, "compare", "--config", str(config)],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == -9, result.stderr[-3000:]
    assert not (out / "opd" / "seed0" / "done.json").exists()  # never half a file under the real name

    assert cli_main(["compare", "--config", str(config)]) == 0  # the student is trained again, then all goes on
    table = (out / "comparison.md").read_text()
    assert json.loads((out / "opd" / "seed0" / "done.json").read_text())["seed"] == 0
    capsys.readouterr()

    # a done.json cut by an older trl-nca (or by hand): named, with what to do
    done = out / "nca" / "seed0" / "done.json"
    whole = done.read_text()
    done.write_text(whole[:200])
    assert cli_main(["compare", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{done} is cut or garbled" in err and f"Delete the folder {done.parent}" in err, err
    assert len([line for line in err.splitlines() if ": error: " in line]) == 1 and "Traceback" not in err
    done.write_text(whole)

    # a garbage line in the middle of a records file, and a line without item_id
    records = out / "base" / "records.jsonl"
    lines = records.read_text().splitlines(keepends=True)
    for bad, reason in (
        ("garbage\n", "is not a valid paired record: Expecting value"),
        ('{"x": 1}\n', "is not a valid paired record: it has no 'item_id' field"),
    ):
        records.write_text(lines[0] + bad + "".join(lines[1:]))
        assert cli_main(["compare", "--config", str(config)]) == 2
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if ": error: " in line]  # after the weights' progress bar
        assert len(errors) == 1 and f"Line 2 of {records} {reason}" in errors[0] and "Traceback" not in err, err
    records.write_text("".join(lines))

    # the same folder spelled another way resumes: nothing is generated again and the table is the same
    relative = os.path.relpath(out, Path.cwd())
    spelled = compare_config(tmp_path, tiny_dir, Path(relative + "/../" + out.name))
    before = records.read_text()
    assert cli_main(["compare", "--config", str(spelled)]) == 0, capsys.readouterr().err
    assert records.read_text() == before and (out / "comparison.md").read_text() == table

    # a resume with another number of evaluated items is refused
    fewer = compare_config(tmp_path, tiny_dir, out, eval_items=1)
    assert cli_main(["compare", "--config", str(fewer)]) == 2
    assert "evaluated on 2 held-out items, now 1 (`eval_items`)" in capsys.readouterr().err


def test_records_resume_when_the_model_path_is_spelled_otherwise(tiny_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_nca.core.sampling import GenerationSettings
    from trl_nca.core.views import ContextSpec
    from trl_nca.eval import EvalInputError, PairedEvaluator

    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)
    rows = [{"id": f"q{i}", "prompt": f"Question {i}?", "answer": "A"} for i in range(2)]
    evaluator = PairedEvaluator(
        rows,
        context=ContextSpec(column=None, text="Be brief."),
        id_column="id",
        generation=GenerationSettings(max_new_tokens=2, batch_size=2),
    )
    path = tmp_path / "records.jsonl"
    first = evaluator.run(model, tokenizer, output_path=path, model_path=tiny_dir, progress=False)
    monkeypatch.chdir(Path(tiny_dir).parent)
    for spelled in (Path(tiny_dir).name, f"./{Path(tiny_dir).name}", f"../{Path(tiny_dir).parent.name}/student"):
        again = evaluator.run(model, tokenizer, output_path=path, model_path=spelled, progress=False)
        assert [r.to_dict() for r in again] == [r.to_dict() for r in first]
    assert len(path.read_text().splitlines()) == 2
    other = AutoModelForCausalLM.from_pretrained(tiny_dir)
    with __import__("torch").no_grad():
        next(other.parameters()).add_(1.0)  # other weights under the same path: still another run
    with pytest.raises(EvalInputError, match="holds records of another run"):
        evaluator.run(other, tokenizer, output_path=path, model_path=tiny_dir, progress=False)


# --- organism pretraining stopped by SIGTERM --------------------------------------------------------------------------


STOPPED_PRETRAINING = """
import sys, time
import trl_nca.models.organism as organism

def slow(spec, progress=True):
    print("pretraining", flush=True)
    time.sleep(600)
organism.pretrain = slow
organism.organism_model_path(organism.OrganismSpec(steps=1), cache_dir=sys.argv[1])
"""


@pytest.mark.slow  # the pretraining is a process of its own
def test_organism_pretraining_stopped_by_sigterm_leaves_no_staging_folder(tmp_path):
    cache = tmp_path / "cache"
    child = subprocess.Popen(
        [sys.executable, "-c", STOPPED_PRETRAINING, str(cache)],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "pretraining"
    assert list(cache.glob(".organism-*.tmp-*"))
    child.send_signal(signal.SIGTERM)
    child.wait(timeout=60)
    assert child.returncode != 0 and not list(cache.glob(".organism-*.tmp-*")), list(cache.iterdir())


def _immutable(folder: Path, on: bool) -> bool:
    done = subprocess.run(["chattr", "+i" if on else "-i", str(folder)], capture_output=True, timeout=30)
    return done.returncode == 0


def _read_only_remount(folder: Path, on: bool) -> bool:
    if on:
        steps = [["mount", "--bind", str(folder), str(folder)], ["mount", "-o", "remount,ro,bind", str(folder)]]
    else:
        steps = [["umount", str(folder)]]
    return all(subprocess.run(step, capture_output=True, timeout=30).returncode == 0 for step in steps)


# (case, how the output folder becomes unwritable while a command holds its lock, the one line expected) (issue 50):
# the first error is the one reported (the lock's release and the temporary file's removal tolerate EPERM and EROFS),
# what was written before is kept, and no stale lock blocks the rerun
UNWRITABLE_CASES = [
    (
        "made immutable (chattr +i)",
        _immutable,
        "atomic",
        "trl-nca eval: error: Cannot write {out}/b.json (Operation "
        "not permitted): its folder became unwritable during the run. Make it writable again (or choose another output "
        "folder) and run the same command again: finished work is kept and resumed.",
    ),
    (
        "remounted read-only",
        _read_only_remount,
        "atomic",
        "trl-nca eval: error: Cannot write {out}/b.json (Read-only "
        "file system): its folder became unwritable during the run. Make it writable again (or choose another output "
        "folder) and run the same command again: finished work is kept and resumed.",
    ),
    (
        "remounted read-only, a record appended",
        _read_only_remount,
        "append",
        "trl-nca eval: error: Cannot use "
        "{out}/a.json (Read-only file system). Check its permissions, or whether its folder became read-only during the "
        "run, and run the same command again: finished work is kept and resumed.",
    ),
]


@pytest.mark.slow  # starts `chattr` and `mount`
@pytest.mark.parametrize("case, make, writer, expected", UNWRITABLE_CASES, ids=[c[0] for c in UNWRITABLE_CASES])
def test_a_folder_made_unwritable_mid_run_is_one_line_and_leaves_no_stale_lock(
    tmp_path, capsys, monkeypatch, case, make, writer, expected
):
    from trl_nca.inputs import output_folder_lock, write_text_atomic

    out = tmp_path / "out"
    made = []

    def command(argv):  # a command that writes into its locked folder, which becomes unwritable between two writes
        with output_folder_lock(out, "trl-nca eval"):
            write_text_atomic(out / "a.json", "1\n")
            if not make(out, True):
                return 77
            made.append(out)
            if writer == "append":  # as the evaluation records are appended, item by item
                with open(out / "a.json", "a") as handle:
                    handle.write("2\n")
            write_text_atomic(out / "b.json", "2\n")
        return 0

    _as_command(monkeypatch, "eval", command)
    try:
        code = cli_main(["eval"])
    finally:
        if made:
            make(out, False)
    if code == 77:
        pytest.skip(
            f"cannot make a folder unwritable here ({case}: needs root and CAP_SYS_ADMIN / CAP_LINUX_IMMUTABLE)"
        )
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == expected.format(out=out) + " (set TRL_NCA_TRACEBACK=1 to see the traceback)", (
        err
    )
    assert (out / "a.json").read_text() == "1\n" and not list(out.glob(".b.tmp-*"))
    with output_folder_lock(out, "test"):  # the rerun takes the folder
        pass


HOLD_AS_ORPHAN = """
import fcntl, os, sys, time
path = os.path.join(sys.argv[1], ".trl-nca.lock")
os.makedirs(sys.argv[1], exist_ok=True)
descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.ftruncate(descriptor, 0)
os.write(descriptor, f"{sys.argv[2]}\\n".encode())
print("locked", flush=True)
time.sleep(600)
"""


def _start_of(pid: int) -> str:
    """When the process `pid` started (`/proc/PID/stat` field 22), as a lock records it."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]


def _this_run(processes) -> str:
    return f"pid {os.getpid()}, trl-nca compare; started {_start_of(os.getpid())}"


def _gone_run(processes) -> str:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return f"pid {int(gone.stdout)}, trl-nca compare; started 1"


def _reused_pid(processes) -> str:
    """The pid of a run that ended, now an unrelated process's: the pid runs, but it started after the lock's record."""
    unrelated = subprocess.Popen(["sleep", "600"])
    processes.append(unrelated)
    return f"pid {unrelated.pid}, trl-nca compare; started {int(_start_of(unrelated.pid)) - 1}"


# (case, the holder the lock file names while an orphan holds it, whether a rerun takes the lock over): a process of a
# run that is gone (a worker of an older trl-nca re-parented to PID 1) still holds the lock; the lock names its run by
# pid and start time, so only a run that still runs keeps it
LOCK_HOLDERS = [
    ("a live run", _this_run, False),
    ("a run that is gone", _gone_run, True),
    ("a run that is gone, its pid reused by an unrelated process", _reused_pid, True),
]


@pytest.mark.slow  # the orphan holding the lock is a process of its own
@pytest.mark.parametrize("case, holder, taken", LOCK_HOLDERS, ids=[c[0] for c in LOCK_HOLDERS])
def test_a_lock_whose_run_is_gone_is_taken_over_with_a_line(tmp_path, caplog, case, holder, taken):
    from trl_nca.inputs import FolderInUseError, output_folder_lock

    out, processes = tmp_path / "out", []
    try:
        record = holder(processes)
        orphan = subprocess.Popen(
            [sys.executable, "-c", HOLD_AS_ORPHAN, str(out), record], stdout=subprocess.PIPE, text=True
        )
        processes.append(orphan)
        assert orphan.stdout.readline().strip() == "locked"
        if not taken:
            with pytest.raises(
                FolderInUseError, match=r"is in use by another trl-nca run \(pid \d+, trl-nca compare\);"
            ):
                with output_folder_lock(out, "test"):
                    pass
            return
        with output_folder_lock(out, "test") as lock:
            assert lock.read_text() == f"pid {os.getpid()}, test; started {_start_of(os.getpid())}\n"
        line = f"{out / '.trl-nca.lock'} was held by {record.partition(';')[0]}, which is no longer running; taking"
        assert sum(line in r.getMessage() for r in caplog.records) == 1, caplog.text
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=60)


def test_a_run_refused_before_the_holder_wrote_its_record_still_names_the_holder(tmp_path):
    """The holder writes its record just after taking the lock: a second run refused in between waits for the record
    (`inputs.LOCK_RECORD_WAIT_S`) and names the holder's pid, not "pid unknown" (seen once, two compares started
    together on a loaded machine)."""
    import fcntl
    import threading

    from trl_nca.inputs import LOCK_FILE, LOCK_RECORD_WAIT_S, FolderInUseError, output_folder_lock

    out = tmp_path / "out"
    out.mkdir()
    descriptor = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)  # held, its record not written yet
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        record = _this_run([])
        timer = threading.Timer(LOCK_RECORD_WAIT_S / 4, os.write, (descriptor, f"{record}\n".encode()))
        timer.start()
        with pytest.raises(FolderInUseError, match=rf"in use by another trl-nca run \(pid {os.getpid()}, trl-nca"):
            with output_folder_lock(out, "test"):
                pass
        timer.join()
    finally:
        os.close(descriptor)
