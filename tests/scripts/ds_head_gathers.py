"""`ds_train.py` with small loss tiles, counting how often DeepSpeed gathers the output layers during the loss.

    ds_head_gathers.py OUT --tuning full --teacher separate --models DIR [--per-device N] ...   (ds_train.py's options)

Runs `ds_train.main` with `loss_vocab_chunk_size=64` and `loss_token_chunk_size=2` (several vocabulary slices and
token chunks per micro-batch) and records, per process, the `deepspeed.zero.GatheredParameters` blocks that include
an output layer the loss reads: those entered while `token_divergences` runs (forward) and while the trainer's
backward runs (backward), with the number of loss calls and of the tokens they scored. Saved to `gathers_rank{R}.json` next to ds_train's outputs.
"""

import functools
import json
import os
import sys

import deepspeed
import ds_train
from accelerate import Accelerator

import trl_nca.trainers.objective
from trl_nca.core.launch import end_process_group


def main():
    out = sys.argv[1]
    heads: set[int] = set()  # ids of the output-layer parameters the loss was given
    phase = [None]
    counts = {"loss_calls": 0, "tokens": 0, "forward": 0, "backward": 0, "elsewhere": 0}
    gathered_parameters = deepspeed.zero.GatheredParameters

    def counting_gathered_parameters(params, *args, **kwargs):
        listed = params if isinstance(params, (list, tuple)) else [params]
        if any(id(p) in heads for p in listed if p is not None):
            counts[phase[0] or "elsewhere"] += 1
        return gathered_parameters(params, *args, **kwargs)

    token_divergences = trl_nca.trainers.objective.token_divergences

    @functools.wraps(token_divergences)
    def counting_token_divergences(h_x, h_t, student, teacher, *args, **kwargs):
        heads.update(id(p) for p in (student.weight, student.bias, teacher.weight, teacher.bias) if p is not None)
        counts["loss_calls"] += 1
        counts["tokens"] += h_x.shape[0]
        phase[0] = "forward"
        try:
            return token_divergences(h_x, h_t, student, teacher, *args, **kwargs)
        finally:
            phase[0] = None

    backward = Accelerator.backward

    @functools.wraps(backward)
    def counting_backward(self, *args, **kwargs):
        phase[0] = "backward"
        try:
            return backward(self, *args, **kwargs)
        finally:
            phase[0] = None

    deepspeed.zero.GatheredParameters = counting_gathered_parameters
    trl_nca.trainers.objective.token_divergences = counting_token_divergences
    Accelerator.backward = counting_backward
    ds_train.NCAConfig = functools.partial(ds_train.NCAConfig, loss_vocab_chunk_size=64, loss_token_chunk_size=2)
    ds_train.main()
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(out, f"gathers_rank{rank}.json"), "w") as f:
        json.dump(counts, f)


if __name__ == "__main__":
    main()
    end_process_group()  # a clean exit under a launcher (trl_nca.core.launch.end_process_group)
