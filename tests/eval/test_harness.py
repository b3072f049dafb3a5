"""Paired evaluation over lm-evaluation-harness tasks (issue 49), offline on the tiny model and two local task YAMLs.

The numbers must be lm-eval's: Acc_x and Acc_xc equal what `lm_eval.simple_evaluate` reports for the task run without
and with the same context, per document too. The context must be where the placement says in the prompt lm-eval
actually ran, and nowhere in the prompt without it.
"""

import json
import logging

import pytest

from trl_nca.core.views import ContextSpec
from trl_nca.eval.metrics import compute_metrics
from trl_nca.testing import make_tiny_model


lm_eval = pytest.importorskip("lm_eval")
from trl_nca.eval.harness import (  # noqa: E402  (after the skip: the module runs lm-eval)
    HarnessOptions,
    evaluate_harness,
    harness_tasks,
    hf_lm,
)
from trl_nca.eval.harness_index import task_manager  # noqa: E402


logging.getLogger("lm-eval").setLevel(logging.ERROR)
FIXED = "Be careful and precise."
SEED = 0
QUESTIONS = ["Which answer is right?", "Is the box pushed?", "Frozen lake: up?", "Is this hateful?", "Push the box."]


def write_tasks(folder, answers=None):
    """Two local tasks on one JSONL: `h_mc` (multiple choice, acc) and `h_gen` (generate_until, exact_match); each
    document has its own context in the field `hint`. `answers` replaces the generation targets."""
    folder.mkdir(parents=True, exist_ok=True)
    docs = [
        {
            "question": q,
            "choices": ["yes", "no", "maybe"],
            "label": i % 3,
            "hint": f"Hint {i}: answer {'yes no'[i % 2]}.",
            "answer": (answers or {}).get(i, "yes"),
        }
        for i, q in enumerate(QUESTIONS)
    ]
    data = folder / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    common = (
        f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\n'
    )
    (folder / "h_mc.yaml").write_text(
        "task: h_mc\n" + common + "output_type: multiple_choice\ndoc_to_choice: choices\ndoc_to_target: label\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )
    (folder / "h_gen.yaml").write_text(
        "task: h_gen\n" + common + "output_type: generate_until\ndoc_to_target: answer\ngeneration_kwargs:\n"
        '  until: ["\\n"]\n  max_gen_toks: 6\n  do_sample: false\nmetric_list:\n  - metric: exact_match\n'
    )
    # what a user writes to run lm-eval itself with each document's context: the description is the field
    for name in ("h_mc", "h_gen"):
        text = (folder / f"{name}.yaml").read_text().replace(f"task: {name}", f"task: {name}_hint")
        (folder / f"{name}_hint.yaml").write_text(text + 'description: "{{hint}}"\n')
    return folder


def lm_eval_run(lm, folder, task, system_instruction=None):
    """lm-eval's own run of `task`, with the settings the paired evaluation uses."""
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=[task],
        task_manager=task_manager(str(folder), include_defaults=False),
        system_instruction=system_instruction,
        apply_chat_template=True,
        random_seed=SEED,
        numpy_random_seed=SEED,
        torch_random_seed=SEED,
        fewshot_random_seed=1234,
        bootstrap_iters=0,
    )
    return results


@pytest.fixture(scope="module")
def model(tok):
    return make_tiny_model(tok)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tok, model):
    """The two tasks, with generation targets set so that exact_match is not 0 everywhere: documents 0-2 expect the
    tiny model's greedy answer without a context, documents 3-4 its answer with the fixed context."""
    folder = write_tasks(tmp_path_factory.mktemp("tasks"))
    lm = hf_lm(model, tok, HarnessOptions(batch_size=4))
    plain = {s["doc_id"]: s["filtered_resps"][0] for s in lm_eval_run(lm, folder, "h_gen")["samples"]["h_gen"]}
    fixed = {s["doc_id"]: s["filtered_resps"][0] for s in lm_eval_run(lm, folder, "h_gen", FIXED)["samples"]["h_gen"]}
    assert plain != fixed  # the context changes some answer, so harm and help can be seen
    return write_tasks(folder, {0: plain[0], 1: plain[1], 2: plain[2], 3: fixed[3], 4: fixed[4]})


def values(results, task, metric):
    return {s["doc_id"]: float(s[metric]) for s in results["samples"][task]}


@pytest.mark.parametrize("task, metric", [("h_mc", "acc"), ("h_gen", "exact_match")])
@pytest.mark.parametrize("fixed", [True, False], ids=["fixed context", "per-document context"])
def test_accuracies_are_lm_evals(tok, model, folder, task, metric, fixed):
    context = ContextSpec(column=None, text=FIXED) if fixed else ContextSpec(column="hint")
    (run,) = evaluate_harness(
        model, tok, [task], context=context, include_path=str(folder), options=HarnessOptions(batch_size=4)
    )
    lm = hf_lm(model, tok, HarnessOptions(batch_size=4))
    without = lm_eval_run(lm, folder, task)
    with_context = lm_eval_run(lm, folder, task, FIXED) if fixed else lm_eval_run(lm, folder, f"{task}_hint")
    reported = f"{task}" if fixed else f"{task}_hint"
    m = compute_metrics(run.records, n_bootstrap=0)
    assert m["n"] == len(QUESTIONS)
    assert m["acc_x"] == pytest.approx(without["results"][task][f"{metric},none"], abs=0)
    assert m["acc_xc"] == pytest.approx(with_context["results"][reported][f"{metric},none"], abs=0)
    # per document, joined by doc_id
    assert {int(r.item_id): r.x.extra["value"] for r in run.records} == values(without, task, metric)
    assert {int(r.item_id): r.xc.extra["value"] for r in run.records} == values(with_context, reported, metric)
    assert m["harm_count"] + m["help_count"] > 0  # the views disagree somewhere: pairing is tested, not 0 == 0


@pytest.mark.parametrize(
    "context, where",
    [
        (ContextSpec(column=None, text=FIXED), "<|im_start|>system\n" + FIXED + "<|im_end|>"),
        (ContextSpec(column="hint"), "<|im_start|>system\nHint {i}: answer"),
        (ContextSpec(column=None, text=FIXED, placement="user"), "<|im_start|>user\n" + FIXED + "\n\nQuestion: "),
        (ContextSpec(column="hint", placement="user"), "<|im_start|>user\nHint {i}: answer"),
    ],
    ids=["fixed, system", "per-document, system", "fixed, user", "per-document, user"],
)
def test_context_is_where_the_placement_says(tok, model, folder, context, where):
    """The prompts lm-eval ran (its logged requests), through the tiny model's ChatML template."""
    (run,) = evaluate_harness(model, tok, ["h_mc"], context=context, include_path=str(folder))
    for record in run.records:
        i = int(record.item_id)
        text = FIXED if context.text else f"Hint {i}: answer"
        assert where.format(i=i) in record.xc.extra["prompt"]
        assert text not in record.x.extra["prompt"] and "<|im_start|>system" not in record.x.extra["prompt"]
        assert record.x.extra["prompt"].endswith(
            f"Question: {QUESTIONS[i]}\nAnswer:<|im_end|>\n<|im_start|>assistant\n"
        )


def test_resumed_documents_are_paired_by_doc_id(tok, model, folder, tmp_path):
    """A rerun evaluates only the documents missing from records.jsonl (lm-eval's `samples` subset, whose logged
    doc_ids are the documents' own) and drops a half-written last line; the records end as those of one uninterrupted
    run."""
    context = ContextSpec(column="hint")
    (full,) = evaluate_harness(
        model, tok, ["h_mc"], context=context, include_path=str(folder), output_dir=tmp_path / "a"
    )
    path = tmp_path / "a" / "model" / "h_mc" / "records.jsonl"
    lines = path.read_text().splitlines()
    kept = "\n".join(line for k, line in enumerate(lines) if k in (1, 3)) + "\n"  # docs 0, 2, 4 lost
    path.write_text(kept + lines[0][:60])  # and a half-written last line, as a Ctrl-C in a write leaves
    (resumed,) = evaluate_harness(
        model, tok, ["h_mc"], context=context, include_path=str(folder), output_dir=tmp_path / "a"
    )
    assert [r.item_id for r in resumed.records] == [str(i) for i in range(len(QUESTIONS))]
    for a, b in zip(full.records, resumed.records, strict=True):
        assert (a.x.extra["value"], a.xc.extra["value"], a.x.answer, a.xc.answer) == (
            b.x.extra["value"],
            b.xc.extra["value"],
            b.x.answer,
            b.xc.answer,
        )
        assert a.xc.extra["prompt"] == b.xc.extra["prompt"]


def test_sampled_generation_k_samples(tok, model, folder):
    """--samples-per-view K: each view runs K times, sample j of both views with seed + j; records hold K samples."""
    options = HarnessOptions(samples_per_view=2, gen_kwargs={"do_sample": True, "temperature": 1.0})
    (run,) = evaluate_harness(
        model, tok, ["h_gen"], context=ContextSpec(column="hint"), include_path=str(folder), options=options
    )
    m = compute_metrics(run.records, n_bootstrap=0)
    assert m["samples_per_view"] == 2 and m["permutation_p"] is not None
    record = run.records[0]
    assert len(record.x.extra["samples"]) == 1 and record.x.extra["samples"][0]["extra"]["doc_id"] == 0
    assert record.x.completion != record.x.extra["samples"][0]["completion"]  # two seeds, two samples


def test_shipped_task_is_the_builtin_data():
    """The packaged island_facts_mc documents are the generator's output, and lm-eval loads the shipped task without
    --include-path."""
    from trl_nca.eval.harness_index import bundled_tasks_folder
    from trl_nca.tasks.harness_data import island_facts_mc_docs

    shipped = (bundled_tasks_folder() / "island_facts_mc.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in shipped] == island_facts_mc_docs()
    (task,) = harness_tasks(["island_facts_mc"], ContextSpec(column="context"), HarnessOptions(limit=3))
    assert task.output_type == "multiple_choice" and task.metric == "acc" and len(task.docs) == 3
    assert task.docs[0]["context"] == island_facts_mc_docs()[0]["context"]


def test_callback_logs_harness_tasks_every_n_steps(tok, folder, tmp_path):
    """PairedEvalCallback(tasks=...) in a 2-step NCATrainer run: each task's metrics logged under `paired/TASK/` at
    steps 1 and 2 through the trainer's loggers, as the callback logs a dataset; training unchanged; a final report
    with one row per task."""
    import torch
    from datasets import Dataset

    from trl_nca import NCAConfig, NCATrainer
    from trl_nca.eval.callback import PairedEvalCallback
    from trl_nca.testing import CONTEXT, CPU, run_args

    def train(callback=None):
        args = run_args(
            NCAConfig,
            tmp_path / ("with" if callback else "plain"),
            CPU,
            nca_beta=0.5,
            max_new_tokens=8,
            per_device_train_batch_size=2,
            max_steps=2,
            save_strategy="no",
            logging_steps=1,
            seed=7,
            data_seed=7,
        )
        data = Dataset.from_dict(
            {"prompt": [f"Which answer? {i} (A) yes (B) no" for i in range(4)], "context": [CONTEXT] * 4}
        )
        trainer = NCATrainer(model=make_tiny_model(tok), args=args, train_dataset=data, processing_class=tok)
        if callback is not None:
            trainer.add_callback(callback.bind(trainer))
        trainer.train()
        return trainer

    callback = PairedEvalCallback(
        context=ContextSpec(column="hint"),
        tasks=["h_mc", "h_gen"],
        include_path=str(folder),
        eval_steps=1,
        num_items=3,
        output_dir=str(tmp_path / "paired"),
        n_bootstrap=20,
    )
    plain, with_eval = train(), train(callback)
    for (name, a), (_, b) in zip(plain.model.named_parameters(), with_eval.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    logged = [entry for entry in with_eval.state.log_history if "paired/h_mc/acc_x" in entry]
    assert [entry["step"] for entry in logged] == [1, 2]
    assert {
        "paired/h_mc/acc_xc",
        "paired/h_gen/acc_x",
        "paired/h_gen/length_x_mean",
        "paired/h_mc/mcnemar_p",
        "paired/h_mc/regime_code",
    } <= set(logged[0])
    assert logged[1]["paired/h_mc/acc_x"] == compute_metrics(callback.last_runs[0].records)["acc_x"]
    assert [(e["step"], e["task"]) for e in callback.history] == [(1, "h_mc"), (1, "h_gen"), (2, "h_mc"), (2, "h_gen")]
    summary = json.loads((tmp_path / "paired" / "summary.json").read_text())
    assert [m["name"] for m in summary["models"]] == ["student/h_mc", "student/h_gen"]
    assert all(m["metrics"]["n"] == 3 and m["provenance"]["step"] == 2 for m in summary["models"])


def test_the_per_document_path_builds_no_generation_backend(tok, model, folder, monkeypatch):
    """lm-eval's model answers a harness task: the runner builds no generation backend of its own for it (issue 60:
    it built an `HFBackend` that the harness task never called)."""
    import trl_nca.eval.runner as runner

    def refused(*args, **kwargs):
        raise AssertionError("a generation backend was built for a harness task")

    monkeypatch.setattr(runner, "HFBackend", refused)
    (run,) = evaluate_harness(model, tok, ["h_mc"], context=ContextSpec(column="hint"), include_path=str(folder))
    assert len(run.records) == len(QUESTIONS)


def test_each_view_is_a_task_of_its_own_and_the_task_is_left_as_loaded(tok, folder):
    """The with-context view is a task built once from the task's config (not the task's config rewritten per
    document and put back): the task as lm-eval loaded it keeps its own config."""
    (task,) = harness_tasks(["h_mc"], ContextSpec(column="hint", placement="user"), include_path=str(folder))
    before = task.task.dump_config()
    task.prompts(task.docs[0], tok)
    assert task.views["xc"].task is not task.task and task.task.dump_config() == before
    assert task.views["xc"].task.config.doc_to_text is not task.task.config.doc_to_text
    (fixed,) = harness_tasks(["h_mc"], ContextSpec(column=None, text=FIXED), include_path=str(folder))
    assert fixed.views["xc"].task is fixed.task and fixed.views["xc"].system_instruction == FIXED
