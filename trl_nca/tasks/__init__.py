"""Dataset builders: the paper's system-prompt domains (MedMCQA, safety) and built-in tasks generated offline.

`trl_nca.tasks.paper` turns the Hub datasets of the paper into `id`/`prompt`/`answer` rows. `trl_nca.tasks.builtin`
generates, from a seed and with nothing downloaded, tasks on which the embedded SmolLM2-135M-Instruct measurably uses
its context (see `docs/results.md`): every task has a training split, a held-out split, a context and a scorer name.
"""

from .builtin import TASKS, BuiltinTask, get_task, task_names
from .paper import (
    LETTERS,
    MCQ_INSTRUCTION,
    MEDMCQA_TEST_SUBJECTS,
    MEDMCQA_TRAIN_SUBJECTS,
    YESNO_INSTRUCTION,
    build_medmcqa,
    build_prepared,
    detect_one_based,
    medmcqa_answer,
    medmcqa_prompt,
)


__all__ = [
    "LETTERS",
    "MCQ_INSTRUCTION",
    "MEDMCQA_TEST_SUBJECTS",
    "MEDMCQA_TRAIN_SUBJECTS",
    "TASKS",
    "YESNO_INSTRUCTION",
    "BuiltinTask",
    "build_medmcqa",
    "build_prepared",
    "detect_one_based",
    "get_task",
    "medmcqa_answer",
    "medmcqa_prompt",
    "task_names",
]
