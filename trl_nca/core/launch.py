"""What a launch asks of every process: where models load, which launches are refused, and agreement between ranks.

Placement at load time (`placed_init_kwargs`). TRL's `create_model_from_path` picks `device_map="auto"` whenever no
`device_map` is given and the process's device is not a CPU. Under a distributed launch that is wrong everywhere:
transformers refuses any `device_map` under ZeRO-3, accelerate refuses to prepare a model dispatched over several
devices under DDP and FSDP, and a single process that sees 8 GPUs would spread the model over all of them. So:

    distributed launch (DDP, DeepSpeed, FSDP, or several processes)   device_map=None: the launcher places the model
    single process on an accelerator                                  the process's own device
    single process on a CPU                                           device_map=None (loads on the CPU)

A `device_map` the user set in `model_init_kwargs`/`teacher_model_init_kwargs` is kept where the launch allows it (any
value for a single process; under DDP only the whole model on the process's own device) and refused with an error
that says what to do elsewhere (DeepSpeed and FSDP place the model themselves).

Agreement (`agreed_min`, `agreed_max`, `rank0_choice`). Under DeepSpeed ZeRO-3 every module call gathers its
parameters through collectives, so every rank must run the same modules in the same order. Any choice that depends on
a rank's own data (share a prompt prefix or not and how long, sample or use the dataset's completions, how many times
to call `generate`) is agreed with one small all-reduce before it is acted on. In a single process these return their
input unchanged and communicate nothing.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import torch
from accelerate.utils import DistributedType, str_to_bool


logger = logging.getLogger(__name__)

_UNSET = object()


def distributed_world() -> int:
    """Processes of the running `torch.distributed` group (1 when there is none)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


def _reduce(values: Sequence[int], op, device) -> list[int]:
    if distributed_world() == 1:
        return [int(v) for v in values]
    if torch.distributed.get_backend() == "nccl" and torch.device(device).type != "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    tensor = torch.tensor([int(v) for v in values], dtype=torch.long, device=device)
    torch.distributed.all_reduce(tensor, op=op)
    return tensor.tolist()


def agreed_min(values: Sequence[int], device: torch.device | str = "cpu") -> list[int]:
    """The element-wise minimum of `values` over all ranks (each rank passes as many values)."""
    return _reduce(values, torch.distributed.ReduceOp.MIN if distributed_world() > 1 else None, device)


def agreed_max(values: Sequence[int], device: torch.device | str = "cpu") -> list[int]:
    """The element-wise maximum of `values` over all ranks (each rank passes as many values)."""
    return _reduce(values, torch.distributed.ReduceOp.MAX if distributed_world() > 1 else None, device)


def rank0_choice(choice: bool, device: torch.device | str = "cpu") -> bool:
    """Rank 0's `choice`, on every rank (each rank still computes its own, so random streams advance alike)."""
    if distributed_world() == 1:
        return bool(choice)
    device = torch.device(device)
    if torch.distributed.get_backend() == "nccl" and device.type != "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([int(bool(choice))], dtype=torch.long, device=device)
    torch.distributed.broadcast(flag, src=0)
    return bool(flag.item())


def _launcher(state) -> str:
    """'deepspeed', 'fsdp', 'ddp' (any other distributed type, or several processes) or 'single'."""
    kind = state.distributed_type
    if kind == DistributedType.DEEPSPEED:
        return "deepspeed"
    if kind == DistributedType.FSDP:
        return "fsdp"
    if kind != DistributedType.NO or state.num_processes > 1:
        return "ddp"
    return "single"


def _same_device(device_map: Any, device: torch.device) -> bool:
    """Whether `device_map` puts the whole model on `device` (`"cuda:1"`, `1`, a torch.device, or `{"": ...}`)."""
    if isinstance(device_map, dict):
        targets = set(device_map.values())
        return len(targets) == 1 and _same_device(next(iter(targets)), device)
    if isinstance(device_map, int) and not isinstance(device_map, bool):
        return device.type not in ("cpu", "mps") and device.index == device_map
    try:
        wanted = torch.device(device_map)
    except (TypeError, RuntimeError):
        return False  # "auto", "balanced", ...: dispatched over devices
    if wanted.type != device.type:
        return False
    return wanted.index is None or device.index is None or wanted.index == device.index


def placed_init_kwargs(kwargs: dict[str, Any] | None, what: str, state, device: torch.device) -> dict[str, Any]:
    """`from_pretrained` kwargs of a model (`what`, e.g. "the student") with the `device_map` this launch needs.

    `state` is the launch's `accelerate.PartialState` (`TrainingArguments.distributed_state`), `device` the process's
    training device (`TrainingArguments.device`). See the module docstring for the rule.
    """
    kwargs = dict(kwargs or {})
    given = kwargs.get("device_map", _UNSET)
    launcher = _launcher(state)
    device = torch.device(device)
    if given is _UNSET or given is None:
        own = None if launcher != "single" or device.type == "cpu" else str(device)
        kwargs["device_map"] = own
        return kwargs
    if launcher == "single":
        return kwargs
    if launcher == "ddp" and _same_device(given, device):
        return kwargs
    where = {
        "deepspeed": "DeepSpeed places (and under ZeRO-3 partitions) every model itself",
        "fsdp": "FSDP places and shards the model itself",
        "ddp": f"under DDP each process holds the whole model on its own device ({device})",
    }[launcher]
    raise ValueError(
        f"The init kwargs of {what} set device_map={given!r}, which this {state.num_processes}-process "
        f"{launcher.upper() if launcher != 'deepspeed' else 'DeepSpeed'} launch cannot use: {where}. Remove "
        "`device_map` from the init kwargs (trl-nca then loads the model where the launch needs it)."
    )


def split_over_devices(model) -> bool:
    """Whether `model` was dispatched over several devices (`device_map`), so Trainer runs it model-parallel."""
    devices = set((getattr(model, "hf_device_map", None) or {}).values())
    return len(devices - {"cpu", "disk"}) > 1


def command_line() -> str:
    """The command this process runs, as `accelerate launch` would take it (a script path, or `-m trl_nca.cli ...` for
    the `trl-nca` command)."""
    argv = list(sys.argv) or ["your_script.py"]
    if os.path.basename(argv[0]) == "trl-nca":
        argv = ["-m", "trl_nca.cli", *argv[1:]]
    elif not argv[0].endswith(".py"):
        argv = ["your_script.py"]
    return " ".join(argv)


def refuse_data_parallel(args, trainer: str, model) -> None:
    """One process that sees several GPUs: Trainer would wrap the student in `nn.DataParallel`, which scatters the batch
    to replicas while the views, the teacher and the loss run on the original model (the first loss crashes or is
    wrong). Refused with the launch that trains on all of them; a student split over the GPUs with `device_map`
    (model-parallel, which Trainer runs without DataParallel) is allowed."""
    n_gpu = args.n_gpu
    if n_gpu <= 1 or split_over_devices(model):
        return
    raise ValueError(
        f"{trainer} runs in one process that sees {n_gpu} GPUs, where Trainer would wrap the model in "
        "`nn.DataParallel`, which trl-nca does not support. Start one process per GPU: `accelerate launch "
        f"--config_file examples/accelerate/ddp.yaml --num_processes {n_gpu} {command_line()}` (or zero3.yaml "
        "for models that need sharding), or make one GPU visible: `CUDA_VISIBLE_DEVICES=0`."
    )


def refuse_fsdp(args, trainer: str) -> None:
    """FSDP is refused at init, before any model loads: the teacher and the frozen copies of the student are not
    sharded or placed by `prepare_model(evaluation_mode=True)` under FSDP, so a launch would leave them whole on the
    CPU. DeepSpeed ZeRO-3 shards student and teacher alike."""
    state = args.distributed_state
    launched = str_to_bool(os.environ.get("ACCELERATE_USE_FSDP", "false"))  # also where accelerate then set up none
    configured = getattr(args, "fsdp", None) not in (None, "", [], False)
    if launched or configured or (state is not None and state.distributed_type == DistributedType.FSDP):
        raise ValueError(
            f"{trainer} does not support FSDP: its teacher (a separate model or a frozen copy of the student) would "
            "be neither sharded nor placed on the GPU. Launch with DeepSpeed ZeRO-3 instead, which shards student and "
            "teacher alike: `accelerate launch --config_file examples/accelerate/zero3.yaml ...` (ZeRO-2 when the "
            "model fits on one GPU)."
        )


def deepspeed_requested(deepspeed_arg: Any) -> bool:
    """Whether this process trains under DeepSpeed: a config in the training arguments, or `accelerate launch` with a
    DeepSpeed config (which sets `ACCELERATE_USE_DEEPSPEED`)."""
    return bool(deepspeed_arg) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true")


def skip_deepspeed_shared_memory_op() -> bool:
    """Keep DeepSpeed from compiling its CPU shared-memory collective op, which training never calls.

    On a machine without a GPU, DeepSpeed's CPU accelerator JIT-compiles `deepspeed_shm_comm` (C++ with OpenMP) when
    its communication backend starts, in every process and every fresh environment: about a minute on an idle 2-core
    machine, 10-30 minutes under load. The op serves only `inference_all_reduce` (tensor-parallel inference); ZeRO-2/3
    training reduces through torch.distributed (gloo on a CPU) either way. Marking the op incompatible in DeepSpeed's
    table of compatible ops (a dict DeepSpeed builds once per process and keeps) makes the backend start without it,
    as on a platform that lacks it. Does nothing where DeepSpeed is not installed or the accelerator is not the CPU.
    Returns whether it marked it. Called by `prepare_deepspeed_process`."""
    if importlib.util.find_spec("deepspeed") is None:
        return False
    import deepspeed.ops  # an optional dependency, imported only where DeepSpeed trains
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        return False
    compatible = deepspeed.ops.__compatible_ops__
    if compatible.get("deepspeed_shm_comm"):
        compatible["deepspeed_shm_comm"] = False
    return True


def prepare_deepspeed_process(argv: Sequence[str] | None = None, deepspeed_arg: Any = None) -> bool:
    """What a training script does first, before it builds its config, where the process trains under DeepSpeed
    (`deepspeed_requested`: `accelerate launch` with a DeepSpeed config, `deepspeed_arg`, or a `--deepspeed` option in
    `argv`): DeepSpeed's CPU shared-memory op is marked unavailable (`skip_deepspeed_shared_memory_op`), with one line
    in the log saying so. It must come first because building the config (transformers' `TrainingArguments`) starts
    DeepSpeed's communication backend, which would compile the op. Returns whether it marked the op."""
    given = deepspeed_arg or any(arg == "--deepspeed" or arg.startswith("--deepspeed=") for arg in argv or ())
    if not deepspeed_requested(given) or not skip_deepspeed_shared_memory_op():
        return False
    logger.info(
        "DeepSpeed on a CPU: its shared-memory collective op (deepspeed_shm_comm, used only by tensor-parallel "
        "inference) is marked unavailable, so DeepSpeed's backend starts without compiling it; training reduces "
        "through torch.distributed."
    )
    return True


def end_process_group() -> None:
    """End this process's `torch.distributed` group at the end of a script that trained under a launcher.

    A process that exits with its process group still up leaves the backend's threads (gloo's or NCCL's work and
    store threads) to the interpreter's teardown; a C++ thread still joinable when it is destroyed ends the process
    with `terminate called without an active exception` (SIGABRT, exit -6) after a good run, which a launcher
    reports as a failure. All ranks meet at a barrier first, so none tears its group down while another still
    communicates. Does nothing without a group. Call it only after success: after an error the other ranks may never
    reach the barrier."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
