"""Where models load under each launcher, checked on the kwargs that reach `from_pretrained`, with the launch faked:
the process's device reports `cuda` (in the training arguments and in accelerate's `PartialState`, which TRL reads
when no `device_map` is given) and the distributed type is DEEPSPEED, MULTI_GPU, FSDP or NO. Also the agreement
helpers in a single process."""

import pytest
import torch
from accelerate.utils import DistributedType
from datasets import Dataset
from transformers import PreTrainedModel


class FakeState:
    """The attributes of `accelerate.PartialState` that placement reads."""

    def __init__(self, kind: DistributedType, processes: int, device: str):
        self.distributed_type, self.num_processes, self.device = kind, processes, torch.device(device)


class Loaded(Exception):
    """Raised instead of loading the teacher: the test has seen every kwargs it needs."""


@pytest.fixture
def launch(monkeypatch):
    """Fake a launch; records the `device_map` of every `from_pretrained` (student loaded on the CPU, teacher not)."""
    calls = []
    original = PreTrainedModel.from_pretrained.__func__

    def from_pretrained(cls, path, *args, **kwargs):
        calls.append(kwargs.get("device_map", "<not given>"))
        if len(calls) == 2:
            raise Loaded
        kwargs.pop("device_map", None)
        return original(cls, path, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(from_pretrained))

    def fake(args, kind, processes=1, device="cuda:0"):
        state = FakeState(kind, processes, device)
        monkeypatch.setattr("trl.trainer.utils.PartialState", lambda *a, **k: state)  # what TRL asks when unset
        args.__dict__["_setup_devices"] = state.device  # TrainingArguments.device, computed once per instance
        args.distributed_state = state
        return calls

    return fake


def _config(cls, tmp_path, **kwargs):
    return cls(output_dir=str(tmp_path), report_to=[], bf16=False, use_cpu=True, **kwargs)


def _trainers():
    from trl_nca import NCAConfig, NCADistillationConfig, NCADistillationTrainer, NCATrainer

    return [(NCATrainer, NCAConfig), (NCADistillationTrainer, NCADistillationConfig)]


DATA = Dataset.from_dict({"prompt": ["Hi?"], "context": ["Be brief."]})

CASES = [
    # (distributed type, processes, device, user's device_map, expected device_map or the error's words)
    (DistributedType.NO, 1, "cuda:0", None, "cuda:0"),  # one process: its own device, never "auto"
    (DistributedType.MULTI_GPU, 2, "cuda:1", None, None),
    (DistributedType.DEEPSPEED, 2, "cuda:0", None, None),
    (DistributedType.DEEPSPEED, 1, "cuda:0", None, None),  # DeepSpeed places the model even in one process
    (DistributedType.NO, 1, "cpu", None, None),
    (DistributedType.NO, 1, "cuda:0", "auto", "auto"),  # the user's choice where the launch allows it
    (DistributedType.MULTI_GPU, 2, "cuda:1", {"": "cuda:1"}, {"": "cuda:1"}),
    (DistributedType.MULTI_GPU, 2, "cuda:1", "auto", "under DDP each process holds the whole model"),
    (DistributedType.MULTI_GPU, 2, "cuda:1", "cuda:0", "under DDP each process holds the whole model"),
    (DistributedType.DEEPSPEED, 2, "cuda:0", "cuda:0", "DeepSpeed places"),
]


@pytest.mark.parametrize("trainer_index", [0, 1], ids=["NCATrainer", "NCADistillationTrainer"])
@pytest.mark.parametrize("kind, processes, device, given, expected", CASES)
def test_student_and_teacher_load_where_the_launch_needs_them(
    launch, tiny_dir, tiny_teacher_dir, tmp_path, trainer_index, kind, processes, device, given, expected
):
    trainer_cls, config_cls = _trainers()[trainer_index]
    init = {} if given is None else {"device_map": given}
    args = _config(config_cls, tmp_path, model_init_kwargs=dict(init), teacher_model_init_kwargs=dict(init))
    calls = launch(args, kind, processes, device)
    if isinstance(expected, str) and " " in expected:  # refused before any model loads
        with pytest.raises(ValueError, match=expected) as error:
            trainer_cls(model=str(tiny_dir), teacher_model=str(tiny_teacher_dir), args=args, train_dataset=DATA)
        assert "Remove `device_map`" in str(error.value) and "the student" in str(error.value)
        assert calls == []
        return
    with pytest.raises(Loaded):
        trainer_cls(model=str(tiny_dir), teacher_model=str(tiny_teacher_dir), args=args, train_dataset=DATA)
    assert calls == [expected, expected]  # student, then the teacher loaded by name


@pytest.mark.parametrize("trainer_index", [0, 1], ids=["NCATrainer", "NCADistillationTrainer"])
def test_fsdp_is_refused_before_any_model_loads(launch, tiny_dir, tmp_path, trainer_index):
    trainer_cls, config_cls = _trainers()[trainer_index]
    args = _config(config_cls, tmp_path)
    calls = launch(args, DistributedType.FSDP, 2, "cuda:0")
    with pytest.raises(ValueError, match="does not support FSDP") as error:
        trainer_cls(model=str(tiny_dir), args=args, train_dataset=DATA)
    assert "examples/accelerate/zero3.yaml" in str(error.value)
    assert calls == []


def test_agreement_in_one_process_communicates_nothing():
    from trl_nca.core.launch import agreed_max, agreed_min, distributed_world, rank0_choice

    assert distributed_world() == 1
    assert agreed_min([3, 0]) == [3, 0] and agreed_max([True, 2]) == [1, 2]
    assert rank0_choice(True) is True and rank0_choice(0) is False


@pytest.mark.parametrize("trainer_index", [0, 1], ids=["NCATrainer", "NCADistillationTrainer"])
def test_one_process_seeing_several_gpus_is_refused_with_the_launch_to_use(
    tiny_dir, tmp_path, monkeypatch, trainer_index
):
    """Without a launcher, Trainer wraps the student in `nn.DataParallel` when one process sees several GPUs (faked
    here: `n_gpu` 8); the trainer refuses it, naming the launch, before the teacher loads."""
    trainer_cls, config_cls = _trainers()[trainer_index]
    args = _config(config_cls, tmp_path)
    _ = args.device
    args._n_gpu = 8  # what TrainingArguments counts on a machine with 8 visible GPUs and no launcher
    monkeypatch.setattr("sys.argv", ["examples/medmcqa.py", "--use_peft"])
    teacher_loads = []
    monkeypatch.setattr("trl_nca.trainers.setup.resolve_teacher", lambda *a, **k: teacher_loads.append(1))
    with pytest.raises(ValueError, match="nn.DataParallel") as error:
        trainer_cls(model=str(tiny_dir), args=args, train_dataset=DATA)
    assert "sees 8 GPUs" in str(error.value)
    assert (
        "accelerate launch --config_file examples/accelerate/ddp.yaml --num_processes 8 examples/medmcqa.py "
        "--use_peft" in str(error.value)
    )
    assert teacher_loads == []


def test_a_student_split_over_gpus_is_not_data_parallel(tmp_path):
    """A student dispatched over several GPUs with `device_map` runs model-parallel (Trainer sets `n_gpu` to 1 for it):
    not refused. The trl-nca command is relaunched as `-m trl_nca.cli`."""
    from types import SimpleNamespace

    from trl_nca.core.launch import command_line, refuse_data_parallel

    split = SimpleNamespace(hf_device_map={"embed": 0, "layers.0": 1, "lm_head": 1})
    refuse_data_parallel(SimpleNamespace(n_gpu=2), "NCATrainer", split)
    with pytest.raises(ValueError, match="--num_processes 2"):
        refuse_data_parallel(SimpleNamespace(n_gpu=2), "NCATrainer", SimpleNamespace(hf_device_map={"": 0}))
    import sys

    argv = sys.argv
    try:
        sys.argv = ["/usr/bin/trl-nca", "train", "--config", "run.yaml"]
        assert command_line() == "-m trl_nca.cli train --config run.yaml"
    finally:
        sys.argv = argv
