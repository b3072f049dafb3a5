"""One evaluation runner for dataset items and game maps: the same provenance record, run key, record fields and
resume checks for both."""

import json

import pytest

from trl_nca.core.sampling import GenerationSettings
from trl_nca.core.views import ContextSpec
from trl_nca.eval import EvalInputError, PairedEvaluator, check_game_options, run_paired, run_provenance
from trl_nca.eval.runner import run_key
from trl_nca.testing import make_tiny_model, make_tiny_tokenizer


SETTINGS = GenerationSettings(max_new_tokens=3, temperature=0.7, top_p=0.8, top_k=20, batch_size=4)


@pytest.fixture(scope="module")
def tiny():
    tokenizer = make_tiny_tokenizer()
    return tokenizer, make_tiny_model(tokenizer, seed=0)


def qa_task():
    rows = [{"id": f"q{i}", "prompt": f"Question {i}?", "answer": "A"} for i in range(3)]
    return PairedEvaluator(
        rows, context=ContextSpec(column=None, text="Be brief."), id_column="id", generation=SETTINGS
    )


def game_task():
    return check_game_options("frozenlake", {"num_seeds": 2})


def test_dataset_items_and_game_maps_share_one_provenance_record_and_record_fields(tiny, tmp_path):
    tokenizer, model = tiny
    shared = {"model", "tokenizer_sha256", "context", "scorer", "chat_template_kwargs", "generation", "versions"}
    for name, task in (("qa", qa_task()), ("game", game_task())):
        provenance = run_provenance(task, model, tokenizer, generation=SETTINGS)
        assert shared <= set(provenance), name
        assert provenance["model"]["fingerprint"] and provenance["tokenizer_sha256"]
        assert {"sha256", "source", "placement"} <= set(provenance["context"])
        path = tmp_path / name / "records.jsonl"
        records = run_paired(task, model, tokenizer, generation=SETTINGS, output_path=path, provenance=provenance)
        stored = [json.loads(line) for line in path.read_text().splitlines()]
        assert [r["item_id"] for r in stored] == [r.item_id for r in records]
        for record in stored:
            assert record["meta"]["run_key"] == run_key(provenance), name
            assert len(record["meta"]["item_sha256"]) == 64 and "batch_size" not in record["meta"]["sampling"]
    assert game_task().describe()["context"]["source"] == "shipped:frozenlake"


def test_game_records_are_checked_on_resume_like_dataset_records(tiny, tmp_path):
    tokenizer, model = tiny
    path = tmp_path / "records.jsonl"
    first = run_paired(game_task(), model, tokenizer, generation=SETTINGS, output_path=path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        del line["meta"]["item_sha256"]  # as written before game records carried fingerprints
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(EvalInputError, match="records without item fingerprints"):
        run_paired(game_task(), model, tokenizer, generation=SETTINGS, output_path=path)

    for line in lines:
        line["meta"]["item_sha256"] = "0" * 64  # a map that is not the one played now under the same id
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(EvalInputError, match=r"records of 2 item\(s\) whose prompt, label or tokenization differ"):
        run_paired(game_task(), model, tokenizer, generation=SETTINGS, output_path=path)

    path.unlink()
    run_paired(game_task(), model, tokenizer, generation=SETTINGS, output_path=path)
    template = check_game_options("frozenlake", {"num_seeds": 2, "chat_template_kwargs": {"x": 1}})
    with pytest.raises(EvalInputError, match="holds records of another run"):
        run_paired(template, model, tokenizer, generation=SETTINGS, output_path=path)
    again = run_paired(game_task(), model, tokenizer, generation=SETTINGS, output_path=path)
    assert [r.to_dict() for r in again] == [r.to_dict() for r in first]


def test_evaluation_samples_in_eval_mode_and_gives_every_module_its_mode_back(tmp_path):
    """The model samples in evaluation mode (no dropout); afterwards each module has the mode it had, also a
    submodule kept in evaluation mode inside a model in training mode."""
    tokenizer = make_tiny_tokenizer()
    model = make_tiny_model(tokenizer, seed=0).train()
    model.model.layers[0].eval()  # kept in evaluation mode on purpose
    before = {name: m.training for name, m in model.named_modules()}
    seen, generate = [], model.generate

    def spy(*args, **kwargs):
        seen.append(any(m.training for m in model.modules()))
        return generate(*args, **kwargs)

    model.generate = spy
    run_paired(qa_task(), model, tokenizer, generation=SETTINGS)
    assert seen and not any(seen)
    assert {name: m.training for name, m in model.named_modules()} == before
