"""The paired evaluator on a tiny offline model: prompts, reproducible sampling, resume, errors and reports."""

import json
import random

import numpy as np
import pytest
import torch

from trl_nca.core.sampling import HFBackend, PerRowSampler
from trl_nca.core.views import ContextSpec, add_context, render_prompt_ids
from trl_nca.eval import GenerationSettings, ModelRun, PairedEvaluator, write_report
from trl_nca.eval.errors import EvalInputError
from trl_nca.eval.store import load_records
from trl_nca.testing import CONTEXT, make_tiny_model


@pytest.fixture(scope="module")
def model(tok):
    return make_tiny_model(tok).eval()


def rows(n=5):
    return [
        {
            "id": f"q{i}",
            "prompt": f"Question {i}: which answer? (A) yes (B) no",
            "answer": "AB"[i % 2],
            "context": CONTEXT,
        }
        for i in range(n)
    ]


def evaluator(data=None, **kwargs):
    kwargs.setdefault("generation", GenerationSettings(max_new_tokens=6, batch_size=2))
    kwargs.setdefault("context", ContextSpec())
    return PairedEvaluator(data if data is not None else rows(), id_column="id", **kwargs)


def completions(records):
    return {r.item_id: (r.x.completion, r.xc.completion) for r in records}


def test_prompts_are_the_training_views(tok):
    ev = evaluator(context=ContextSpec(placement="user", template="Experience: {context}\n{prompt}"))
    item = ev.items(tok)[0]
    messages = [{"role": "user", "content": rows()[0]["prompt"]}]
    assert item.prompt_ids_x == render_prompt_ids(tok, messages)
    assert item.prompt_ids_xc == render_prompt_ids(tok, add_context(messages, CONTEXT, ev.context))
    assert CONTEXT not in tok.decode(item.prompt_ids_x) and CONTEXT in tok.decode(item.prompt_ids_xc)


def test_samples_do_not_depend_on_batching_or_order(tok, model):
    data = rows(5)
    small = evaluator(data, generation=GenerationSettings(max_new_tokens=8, batch_size=1)).run(
        model, tok, progress=False
    )
    big = evaluator(data, generation=GenerationSettings(max_new_tokens=8, batch_size=4)).run(model, tok, progress=False)
    shuffled = evaluator(data[::-1], generation=GenerationSettings(max_new_tokens=8, batch_size=3)).run(
        model, tok, progress=False
    )
    assert completions(small) == completions(big) == completions(shuffled)
    other_seed = evaluator(data, generation=GenerationSettings(max_new_tokens=8, seed=1)).run(
        model, tok, progress=False
    )
    assert completions(other_seed) != completions(small)
    assert [r.item_id for r in small] == [f"q{i}" for i in range(5)]
    record = small[0]
    assert record.meta["prompt_tokens_xc"] > record.meta["prompt_tokens_x"]


def test_end_of_turn_and_truncation(tok, model):
    """A response stops at (and counts) the first end-of-turn token; one that never ends is truncated."""
    import copy

    settings = GenerationSettings(max_new_tokens=5, do_sample=False)
    prompt = [tok("Question 0")["input_ids"]]
    first = HFBackend(model, tok).generate(prompt, [0], settings)[0]
    assert first.truncated and len(first.token_ids) == 5
    stopping = copy.deepcopy(model)
    stop = next(j for j, t in enumerate(first.token_ids) if j > 0 and t not in first.token_ids[:j])
    stopping.generation_config.eos_token_id = [tok.eos_token_id, first.token_ids[stop]]
    ended = HFBackend(stopping, tok).generate(prompt, [0], settings)[0]
    assert ended.token_ids == first.token_ids[: stop + 1] and not ended.truncated


def test_evaluation_uses_no_global_rng(tok, model):
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    evaluator().run(model, tok, progress=False)
    assert random.getstate() == states[0]
    assert (np.random.get_state()[1] == states[1]).all()
    assert torch.equal(torch.get_rng_state(), states[2])


def test_greedy_is_deterministic_and_ignores_seed(tok, model):
    a = evaluator(generation=GenerationSettings(max_new_tokens=6, do_sample=False, seed=0)).run(
        model, tok, progress=False
    )
    b = evaluator(generation=GenerationSettings(max_new_tokens=6, temperature=0, seed=5)).run(
        model, tok, progress=False
    )
    assert completions(a) == completions(b)


def test_per_row_sampler_matches_the_filtered_distribution():
    """Frequencies of many independently seeded rows match softmax over the top-k / top-p candidates."""
    n = 6000
    logits = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0])
    rows_ = logits.expand(n, -1).clone()
    picks = PerRowSampler(range(n), GenerationSettings(top_k=3, top_p=1.0), "cpu")(None, rows_).argmax(-1)
    freq = torch.bincount(picks, minlength=5).float() / n
    expected = torch.softmax(logits[:3], -1)
    # a frequency of n = 6000 draws has standard deviation <= sqrt(0.25 / n) = 0.0065: 0.025 is 3.9 of them
    assert torch.allclose(freq[:3], expected, atol=0.025) and freq[3:].sum() == 0
    # top-p: probs ~ [0.63, 0.23, 0.09, ...]; top_p=0.8 keeps the two most likely tokens
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    sampler = PerRowSampler(range(n), GenerationSettings(top_k=0, top_p=0.8), "cpu")
    picks = sampler(None, logits.expand(n, -1)).argmax(-1)
    freq = torch.bincount(picks, minlength=5).float() / n
    assert freq[2:].sum() == 0
    assert torch.allclose(freq[:2], torch.softmax(logits[:2], -1), atol=0.025)  # 3.9 standard deviations, as above


class InterruptingBackend:
    """Wraps the HF backend and fails on its `fail_at`-th call, like a crash in the middle of a run."""

    name = "hf"

    def __init__(self, model, tok, fail_at):
        self.inner, self.calls, self.fail_at = HFBackend(model, tok), 0, fail_at

    def generate(self, prompts, seeds, settings):
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyboardInterrupt
        return self.inner.generate(prompts, seeds, settings)


def test_resume_after_interruption_writes_no_duplicates(tok, model, tmp_path):
    path = tmp_path / "records.jsonl"
    ev = evaluator()
    with pytest.raises(KeyboardInterrupt):
        ev.run(model, tok, output_path=path, backend=InterruptingBackend(model, tok, fail_at=4), progress=False)
    assert len(path.read_text().splitlines()) == 2  # the first chunk of 2 items was written
    backend = InterruptingBackend(model, tok, fail_at=-1)
    resumed = ev.run(model, tok, output_path=path, backend=backend, progress=False)
    assert backend.calls == 4  # 3 items left in chunks of 2, two views each
    ids = [json.loads(line)["item_id"] for line in path.read_text().splitlines()]
    assert sorted(ids) == [f"q{i}" for i in range(5)] and len(ids) == len(set(ids))
    fresh = evaluator().run(model, tok, progress=False)
    assert completions(resumed) == completions(fresh)
    # a third run generates nothing and returns the same records
    again = InterruptingBackend(model, tok, fail_at=1)
    assert completions(ev.run(model, tok, output_path=path, backend=again, progress=False)) == completions(fresh)
    assert len(path.read_text().splitlines()) == 5


def test_half_written_last_line_is_repaired(tok, model, tmp_path):
    path = tmp_path / "records.jsonl"
    ev = evaluator(rows(3))
    ev.run(model, tok, output_path=path, progress=False)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])  # crash in the middle of the third line
    before = path.read_bytes()
    assert set(load_records(path)) == {"q0", "q1"}
    assert path.read_bytes() == before  # reading alone never changes the file; the runner repairs before appending
    assert ev.run(model, tok, output_path=path, progress=False)[2].item_id == "q2"
    assert [json.loads(line)["item_id"] for line in path.read_text().splitlines()] == ["q0", "q1", "q2"]
    # a complete last record without its newline is kept, and the next append starts on a new line
    path.write_text("\n".join(path.read_text().splitlines()[:2]))
    ev.run(model, tok, output_path=path, progress=False)
    assert len(path.read_text().splitlines()) == 3


def test_resume_refuses_records_of_other_settings(tok, model, tmp_path):
    path = tmp_path / "records.jsonl"
    evaluator().run(model, tok, output_path=path, progress=False)
    # the batch size does not change samples, so it may change on resume
    evaluator(generation=GenerationSettings(max_new_tokens=6, batch_size=5)).run(
        model, tok, output_path=path, progress=False
    )
    with pytest.raises(EvalInputError, match="another run"):
        evaluator(generation=GenerationSettings(max_new_tokens=6, temperature=0.7)).run(
            model, tok, output_path=path, progress=False
        )
    path.write_text("not json\n" + path.read_text())
    with pytest.raises(EvalInputError, match="Line 1"):
        load_records(path)


def test_scoring_errors_are_format_failures_not_dropped(tok, model):
    def broken(text, label):
        raise RuntimeError("scorer bug")

    records = evaluator(scorer=broken).run(model, tok, progress=False)
    assert len(records) == 5
    assert all(r.x.format_failure and r.xc.format_failure and not r.x.correct for r in records)
    assert "scorer bug" in records[0].x.extra["scores"]["broken"]["error"]


def test_scorer_errors_are_counted_warned_once_and_reported(tok, model, tmp_path, caplog):
    """A scorer that raises on some items: one warning with the first traceback, and the count per scorer and view
    in summary.json and in the Markdown report."""

    def flaky(text, label):
        if label == "B":
            raise KeyError("flaky scorer cannot read this label")
        return True

    ev = evaluator(scorer=flaky)
    with caplog.at_level("WARNING", logger="trl_nca.eval.paired"):
        records = ev.run(model, tok, progress=False)
    failing = [r for r in records if r.meta["label"] == "B"]  # q1 and q3, both views each
    assert len(failing) == 2
    tracebacks = [rec for rec in caplog.records if "Traceback" in rec.getMessage()]
    assert len(tracebacks) == 1
    assert (
        "flaky scorer cannot read this label" in tracebacks[0].getMessage()
        and "item 'q1'" in tracebacks[0].getMessage()
    )
    assert any("4 responses could not be scored" in rec.getMessage() for rec in caplog.records)

    summary = write_report([ModelRun("base", records, ev.provenance(model))], tmp_path, n_bootstrap=10, plots=False)
    saved = json.loads((tmp_path / "summary.json").read_text())
    for errors in (summary["models"][0]["scorer_errors"], saved["models"][0]["scorer_errors"]):
        assert errors["total"] == 4
        assert errors["by_scorer"]["flaky"]["x"] == errors["by_scorer"]["flaky"]["xc"] == 2
        assert "item q1, view x: KeyError" in errors["by_scorer"]["flaky"]["first"]
    markdown = (tmp_path / "report.md").read_text()
    assert "## Scorer errors" in markdown and "| base | flaky | 2 | 2 | item q1, view x: KeyError" in markdown

    clean = write_report([ModelRun("base", ev.run(model, tok, progress=False)[:1], {})], tmp_path / "c", plots=False)
    assert clean["models"][0]["scorer_errors"]["total"] == 0
    assert "None: every response was scored" in (tmp_path / "c" / "report.md").read_text()
    m = clean["models"][0]["metrics"]  # one item: harm and help divide by one item or none, both marked few
    harm_cell = f"({m['harm_count']}/{m['n_correct_x']}, few)"
    assert harm_cell in (tmp_path / "c" / "report.md").read_text() and "`few`: n below 10" in markdown


def test_companion_scores_are_stored(tok):
    always = evaluator(scorer=lambda text, label: True)
    assert always.companions == []
    mcq = evaluator()
    assert [s.name for s in mcq.companions] == ["mcq_strict", "mcq_lenient"]


def test_input_errors_name_the_problem():
    with pytest.raises(EvalInputError, match=r"no label column 'gold'.*'answer', 'context', 'id', 'prompt'"):
        evaluator(label_column="gold")
    with pytest.raises(EvalInputError, match="no context column 'ctx'"):
        evaluator(context=ContextSpec(column="ctx"))
    with pytest.raises(EvalInputError, match="Scorer/dataset mismatch at item 'q0'.*'yes' or 'no'"):
        evaluator(scorer="yesno")
    with pytest.raises(EvalInputError, match="q1.*appears in rows"):
        evaluator([{**r, "id": "q1"} for r in rows(2)])
    with pytest.raises(EvalInputError, match="empty"):
        evaluator([{**rows(1)[0], "context": "  "}])
    with pytest.raises(EvalInputError, match="neither a `prompt` nor a `messages`"):
        evaluator([{"id": "a", "question": "q", "answer": "A", "context": CONTEXT}])
    with pytest.raises(EvalInputError, match="dataset is empty"):
        evaluator([])


def test_prompt_column_and_limit(tok, model):
    data = [{"question": r["prompt"], "answer": r["answer"], "context": r["context"]} for r in rows(4)]
    ev = PairedEvaluator(data, context=ContextSpec(), prompt_column="question", limit=2)
    assert [item.item_id for item in ev.items(tok)] == ["0", "1"]


def test_report_with_several_models(tok, model, tmp_path):
    ev = evaluator()
    base = ev.run(model, tok, progress=False)
    other = make_tiny_model(tok, seed=3).eval()
    student = ev.run(other, tok, progress=False)
    runs = [ModelRun("base", base, ev.provenance(model)), ModelRun("nca student", student, ev.provenance(other))]
    summary = write_report(runs, tmp_path / "report", n_bootstrap=50, title="tiny")
    out = tmp_path / "report"
    assert [m["name"] for m in summary["models"]] == ["base", "nca student"]
    saved = json.loads((out / "summary.json").read_text())
    prov = saved["models"][0]["provenance"]
    assert prov["context"]["sha256"] == ev.context_sha256() and len(prov["context"]["sha256"]) == 64
    assert prov["generation"]["seed"] == 0 and prov["generation"]["top_k"] == 20
    assert {"trl", "transformers", "torch", "trl_nca"} <= set(saved["versions"]) <= set(prov["versions"]) | {"python"}
    assert prov["model"]["fingerprint"] != saved["models"][1]["provenance"]["model"]["fingerprint"]
    assert "mcq_strict" in saved["models"][0]["metrics_by_scorer"]
    markdown = (out / "report.md").read_text()
    assert "| base |" in markdown and "| nca student |" in markdown and "mcq_strict" in markdown
    same_lengths = "`lengths.png` is not drawn" in markdown  # every model's lengths equal: a line stands for it
    for name in ("accuracy.png", "harm_help.png", *([] if same_lengths else ["lengths.png"])):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = (out / "nca_student" / "records.jsonl").read_text().splitlines()
    assert len(lines) == 5 and json.loads(lines[0])["meta"]["versions"]["torch"] == torch.__version__
    with pytest.raises(ValueError, match="unique"):
        write_report([runs[0], runs[0]], tmp_path / "dup", plots=False)


def test_evaluate_paired_from_paths_with_adapter(tok, tiny_dir, tmp_path):
    """A model path (plus a PEFT adapter path) is loaded, evaluated, and identified in the records' provenance."""
    from peft import LoraConfig, get_peft_model

    from trl_nca.eval import evaluate_paired, load_model

    settings = GenerationSettings(max_new_tokens=6, batch_size=2)
    kwargs = {"context": ContextSpec(), "id_column": "id", "generation": settings, "progress": False}
    base = evaluate_paired(tiny_dir, rows(3), **kwargs)
    same = evaluator(rows(3), generation=settings).run(load_model(tiny_dir), tok, progress=False)
    assert [(r.x.completion, r.xc.completion) for r in base] == [(r.x.completion, r.xc.completion) for r in same]

    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(load_model(tiny_dir), lora).save_pretrained(tmp_path / "adapter")
    adapted = evaluate_paired(tiny_dir, rows(3), adapter=str(tmp_path / "adapter"), **kwargs)
    assert adapted[0].meta["adapter"] == str(tmp_path / "adapter")
    assert [r.x.completion for r in adapted] != [r.x.completion for r in base]
    with pytest.raises(EvalInputError, match="does not exist"):
        load_model(str(tmp_path / "nope"))


def test_vllm_backend_gives_records_of_the_same_shape(tiny_dir):
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("the vLLM backend needs a GPU")
    from trl_nca.eval import evaluate_paired

    settings = GenerationSettings(max_new_tokens=6, batch_size=2)
    records = evaluate_paired(tiny_dir, rows(3), context=ContextSpec(), generation=settings, backend="vllm")
    again = evaluate_paired(tiny_dir, rows(3)[::-1], context=ContextSpec(), generation=settings, backend="vllm")
    assert [r.item_id for r in records] == ["0", "1", "2"]
    assert all(0 < r.x.num_tokens <= 6 and r.x.truncated == (r.x.num_tokens == 6) for r in records)
    assert {r.meta["index"] for r in again} == {0, 1, 2}


def test_estimate_comes_from_the_first_chunk_and_holds(tok, model, caplog):
    """The logged estimate is extrapolated from the first chunk's calls of both views, timed in this run (the view
    with the context has the longer prompts, so one call of the other view alone would err short), and it is checked
    against the evaluation's measured time. The bound is loose because the machine may be shared."""
    import re
    import time

    data = [{**row, "context": CONTEXT * 30} for row in rows(24)]  # context prompts ~30x longer than the others
    ev = evaluator(data, generation=GenerationSettings(max_new_tokens=8, batch_size=4))
    with caplog.at_level("WARNING", logger="trl_nca.eval.paired"):
        start = time.perf_counter()
        ev.run(model, tok, progress=False)
        measured = time.perf_counter() - start
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Paired evaluation:")]
    assert (
        "24 items x 2 views x 1 sample(s) = 48 replies" in line and "6 chunks of 2 generate calls (both views)" in line
    )
    first, total = (float(v) for v in re.search(r"first chunk took ([\d.]+) s, so about ([\d.]+) s", line).groups())
    assert total == pytest.approx(6 * first, abs=0.35)  # both printed to 0.1 s
    assert measured / 3 < total < 3 * measured, (total, measured)
