"""Loads the documents of the shipped harness task from the JSONL next to this file (lm-eval's `custom_dataset`)."""

import json
from pathlib import Path


def load_docs(**kwargs):
    """The `test` split of island_facts_mc.jsonl as a `datasets.DatasetDict` (lm-eval passes the task's metadata)."""
    from datasets import Dataset, DatasetDict

    path = Path(__file__).with_name("island_facts_mc.jsonl")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return DatasetDict({"test": Dataset.from_list(rows)})
