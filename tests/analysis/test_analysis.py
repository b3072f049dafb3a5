"""`trl_nca.analysis` and `trl-nca analyze` on tiny offline models: every measure against a direct computation."""

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model

from trl_nca.analysis import (
    AnalysisInputError,
    AnalysisItem,
    compare_views,
    items_from_records,
    opd_nca_gradient_cosine,
    parameter_location,
    prepare_prompts,
    update_norms,
)
from trl_nca.core.losses import DivergenceSpec
from trl_nca.core.views import ContextSpec
from trl_nca.testing import CONTEXT, FLOAT64, float64_model, make_tiny_model


def ragged_items(tok):
    """Items whose prompts (both views) and completions have different lengths; one completion has one token."""
    spec = ContextSpec(column=None, text=CONTEXT)
    rows = [{"prompt": p} for p in ("Which answer? (A) yes (B) no", "Push the box onto the target.", "up")]
    prompts = prepare_prompts(rows, tok, spec)
    completions = [[40, 41, 42, 43, 44, 45], [50], [60, 61, 62]]
    return [AnalysisItem(p.item_id, p.prompt_ids_x, p.prompt_ids_xc, c) for p, c in zip(prompts, completions)]


def single_forward(model, prompt, completion):
    """Hidden states (all layers) and float64 log-probs at the positions predicting each completion token, from one
    unpadded example."""
    ids = torch.tensor([prompt + completion])
    out = model(input_ids=ids, output_hidden_states=True)
    sl = slice(len(prompt) - 1, len(prompt) - 1 + len(completion))
    return [h[0, sl] for h in out.hidden_states[1:]], out.logits[0, sl].double()


@pytest.mark.numerics
def test_identical_views_give_cosine_one_and_kl_zero(tok):
    model = float64_model(make_tiny_model(tok))
    items = [AnalysisItem(it.item_id, it.prompt_ids_x, it.prompt_ids_x, it.completion_ids) for it in ragged_items(tok)]
    views = compare_views(model, items, pad_id=tok.pad_token_id, batch_size=2)
    assert views.layer_cosine.shape == (10, 2)
    FLOAT64.close(views.layer_cosine, torch.ones_like(views.layer_cosine))  # float64 model
    assert views.kl.abs().max().item() < 1e-12  # the same rows in both views: the same logits, bit for bit
    summary = views.layer_summary(5)
    assert summary["layers"] == [0, 1] and summary["mean"] + summary["percentile"] == FLOAT64.approx([1.0] * 4)


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.numerics
def test_cosine_and_kl_equal_unpadded_single_example_forwards(tok, batch_size):
    """Padded batches give, per completion token, the cosine of each layer's hidden states and the KL(q_x || q_c) of
    each example's own unpadded forwards (full logits, float64), at a temperature and with small vocabulary tiles;
    the top-KL table holds the largest KLs with each view's log-probabilities."""
    torch.manual_seed(0)
    model = float64_model(make_tiny_model(tok, num_layers=3))  # every comparison below: float64 on both sides
    items = ragged_items(tok)
    temperature = 0.7
    views = compare_views(
        model,
        items,
        pad_id=tok.pad_token_id,
        batch_size=batch_size,
        temperature=temperature,
        vocab_chunk=37,
        top_tokens=4,
    )
    cosines, kls, logps = [], [], []
    with torch.no_grad():
        for it in items:
            hx, lx = single_forward(model, it.prompt_ids_x, it.completion_ids)
            hc, lc = single_forward(model, it.prompt_ids_xc, it.completion_ids)
            cosines.append(torch.stack([F.cosine_similarity(a, b, dim=-1) for a, b in zip(hx, hc)], dim=1))
            px, pc = F.log_softmax(lx / temperature, -1), F.log_softmax(lc / temperature, -1)
            kls.append((px.exp() * (px - pc)).sum(-1))
            logps.append((px, pc))
    FLOAT64.close(views.layer_cosine, torch.cat(cosines))
    FLOAT64.close(views.kl, torch.cat(kls))
    assert views.position.tolist() == [0, 1, 2, 3, 4, 5, 0, 0, 1, 2]
    assert views.item_index.tolist() == [0] * 6 + [1] + [2] * 3
    assert (views.layer_cosine < 0.9999).any()  # the context does change the hidden states
    reference = torch.cat(kls)
    assert [t.kl for t in views.top] == FLOAT64.approx(reference.topk(4).values.tolist())
    for t in views.top:
        px, pc = logps[t.item_index]
        assert t.token_id == items[t.item_index].completion_ids[t.position]
        assert t.logp_x == FLOAT64.approx(px[t.position, t.token_id].item())
        assert t.logp_c == FLOAT64.approx(pc[t.position, t.token_id].item())
        assert t.top_x == px[t.position].argmax().item() and t.top_c == pc[t.position].argmax().item()
        assert t.top_x_logp == FLOAT64.approx(px[t.position].max().item())
    summary = views.layer_summary(percentile=5)
    ref = torch.cat(cosines)
    assert summary["mean"] == FLOAT64.approx(ref.mean(0).tolist())
    assert summary["percentile"] == FLOAT64.approx(torch.quantile(ref, 0.05, dim=0).tolist())
    kl = views.kl_summary()
    assert kl["token_mean"] == FLOAT64.approx(reference.mean().item())
    assert kl["by_position"][0] == {
        "position": 0,
        "mean": FLOAT64.approx(reference[[0, 6, 7]].mean().item()),
        "tokens": 3,
    }


@pytest.mark.numerics
def test_student_equal_to_base_has_zero_update_and_a_perturbation_is_located(tok):
    base = make_tiny_model(tok)
    assert update_norms(base, copy.deepcopy(base)).total == 0.0
    summary = update_norms(base, copy.deepcopy(base)).summary()
    assert all(v == 0.0 for row in summary["relative"] for v in row)
    student = copy.deepcopy(base)
    torch.manual_seed(1)
    noise = 0.01 * torch.randn_like(student.model.layers[1].self_attn.k_proj.weight)
    with torch.no_grad():
        student.model.layers[1].self_attn.k_proj.weight.add_(noise)
    summary = update_norms(base, student).summary()
    # The update as the float32 weights hold it (adding the noise rounded it), measured in float64 on both sides.
    delta = (
        student.model.layers[1].self_attn.k_proj.weight.double() - base.model.layers[1].self_attn.k_proj.weight.double()
    )
    expected = (delta.norm() / base.model.layers[1].self_attn.k_proj.weight.double().norm()).item()
    cell = summary["relative"][summary["layers"].index(1)][summary["modules"].index("k_proj")]
    assert cell == FLOAT64.approx(expected)
    assert summary["by_module"]["k_proj"] == FLOAT64.approx(
        (
            delta.norm()
            / torch.cat([layer.self_attn.k_proj.weight.reshape(-1) for layer in base.model.layers]).double().norm()
        ).item()
    )
    nonzero = [
        (layer, mod)
        for layer in summary["layers"]
        for mod in summary["modules"]
        if summary["relative"][layer][summary["modules"].index(mod)] > 0
    ]
    assert nonzero == [(1, "k_proj")]
    assert summary["method"] == "weights" and summary["outside_layers"]["embed_tokens"] == 0.0
    assert parameter_location("model.layers.12.mlp.down_proj.weight") == (12, "down_proj")
    assert parameter_location("lm_head.weight") == (None, "lm_head")


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["k_proj", "down_proj", "embed_tokens"]])
@pytest.mark.numerics
def test_adapter_update_equals_the_merged_model_delta(tok, targets):
    """LoRA deltas (B @ A * scaling, no merge) give the same relative norms as a merged copy of the adapter model,
    and as the merged weights compared directly with the base."""
    base = make_tiny_model(tok)
    student = get_peft_model(
        copy.deepcopy(base), LoraConfig(r=4, lora_alpha=16, target_modules=targets, init_lora_weights=False)
    )
    direct = update_norms(base, student, method="lora_delta")
    merged = update_norms(base, student, method="merged")
    assert direct.method == "lora_delta" and update_norms(base, student).method == "lora_delta"
    merged_weights = dict(copy.deepcopy(student).merge_and_unload().named_parameters())
    for name, weight in base.named_parameters():
        expected = ((merged_weights[name].double() - weight.double()).norm() / weight.double().norm()).item()
        # the merged float32 weights rounded w + BA * s: off by u32 * |w| / |BA * s|, below 1e-5 here
        assert direct.summary()["parameters"][name]["relative"] == pytest.approx(expected, rel=1e-4, abs=1e-12), name
        assert merged.summary()["parameters"][name]["relative"] == FLOAT64.approx(expected)  # the same weights
    summary = direct.summary()
    changed = {mod for mod, value in summary["by_module"].items() if value > 0}
    assert changed == set(targets) - {"embed_tokens"}
    assert (summary["outside_layers"]["embed_tokens"] > 0) == ("embed_tokens" in targets)
    dora = get_peft_model(
        copy.deepcopy(base), LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False, use_dora=True)
    )
    assert update_norms(base, dora).method == "merged"  # DoRA is not a plain B @ A delta: merged copy


def reference_gradient_cosine(student, teacher, items, params, temperature, beta):
    """Two separate full-logit losses (token means over all items, unpadded single forwards), each backpropagated
    into .grad on its own; their gradients flattened and compared."""
    tokens = sum(len(it.completion_ids) for it in items)
    grads = []
    for term in ("opd", "nca"):
        student.zero_grad(set_to_none=True)
        loss = 0.0
        for it in items:
            _, lx = single_forward(student, it.prompt_ids_x, it.completion_ids)
            lx = F.log_softmax(lx / temperature, -1)
            if term == "opd":
                with torch.no_grad():
                    _, lt = single_forward(teacher, it.prompt_ids_xc, it.completion_ids)
                    lt = F.log_softmax(lt / temperature, -1)
                p, q = (lx, lt) if beta == 1.0 else (lt, lx)
                loss = loss + (p.exp() * (p - q)).sum()
            else:
                _, lc = single_forward(student, it.prompt_ids_xc, it.completion_ids)
                lc = F.log_softmax(lc / temperature, -1)
                p = lx.detach()
                loss = loss + (p.exp() * (p - lc)).sum()
        (loss / tokens).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in params]).double())
    a, b = grads
    return (a @ b / (a.norm() * b.norm())).item(), a.norm().item(), b.norm().item()


@pytest.mark.parametrize("beta", [1.0, 0.0])
@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.numerics
def test_gradient_cosine_equals_two_separate_full_logit_losses(tok, beta, lora):
    torch.manual_seed(0)
    # float64 throughout: the chunked and the full-logit gradients sum in different orders, and the cosine of two
    # nearly orthogonal gradients would carry that float32 rounding (~1e-7) into the comparison.
    student, teacher = float64_model(make_tiny_model(tok, 0)), float64_model(make_tiny_model(tok, 1))
    if lora:
        student = get_peft_model(student, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    items = ragged_items(tok)
    result = opd_nca_gradient_cosine(
        student,
        teacher,
        items,
        pad_id=tok.pad_token_id,
        spec=DivergenceSpec(beta=beta, temperature=0.8),
        batch_size=2,
        vocab_chunk=53,
    )
    params = [p for p in student.parameters() if p.requires_grad]
    assert all(p.grad is None for p in params)  # the measure writes no .grad
    cosine, norm_opd, norm_nca = reference_gradient_cosine(student, teacher, items, params, 0.8, beta)
    assert result["cosine"] == pytest.approx(cosine, rel=1e-9, abs=1e-12)
    assert result["norm_opd"] == pytest.approx(norm_opd, rel=1e-9)
    assert result["norm_nca"] == pytest.approx(norm_nca, rel=1e-9)
    assert result["tokens"] == 10 and result["num_params"] == sum(p.numel() for p in params)
    assert abs(cosine) < 0.999


def test_items_from_records_rebuild_the_evaluated_prompts(tok, tmp_path):
    """Records of a real paired evaluation: the prompts rebuilt from the dataset are the evaluation's own, the
    completion is the re-tokenised text (+ end token when not cut off), and a different context or dataset is an
    error naming the item."""
    from trl_nca.eval import GenerationSettings, PairedEvaluator
    from trl_nca.eval.store import load_records

    rows = [{"prompt": f"Question {i}: which answer? (A) yes (B) no", "answer": "A"} for i in range(4)]
    spec = ContextSpec(column=None, text=CONTEXT, placement="user")
    evaluator = PairedEvaluator(rows, context=spec, generation=GenerationSettings(max_new_tokens=5, batch_size=2))
    model = make_tiny_model(tok)
    model.generation_config.sequence_bias = {(tok.eos_token_id,): 2.0}  # some responses end, some hit the limit
    path = tmp_path / "records.jsonl"
    evaluator.run(model, tok, output_path=path, progress=False)
    records = load_records(path)
    assert {r.x.truncated for r in records.values()} == {True, False}
    items, info = items_from_records(records, rows, tok, spec, path=str(path), end_id=tok.eos_token_id)
    assert [it.item_id for it in items] == ["0", "1", "2", "3"] and info.items == 4 and info.retokenized == 4
    assert len(items_from_records(records, rows, tok, spec, limit=3)[0]) == 3
    for item, prepared in zip(items, evaluator.items(tok)):
        assert item.prompt_ids_x == prepared.prompt_ids_x and item.prompt_ids_xc == prepared.prompt_ids_xc
        record = records[item.item_id]
        expected = tok(record.x.completion, add_special_tokens=False)["input_ids"]
        assert item.completion_ids == expected + ([] if record.x.truncated else [tok.eos_token_id])
        assert item.completion_source == "records:retokenized"
    xc_items, _ = items_from_records(records, rows, tok, spec, view="xc", end_id=tok.eos_token_id)
    assert len(xc_items) == 4
    with pytest.raises(AnalysisInputError, match="context differs"):
        items_from_records(records, rows, tok, ContextSpec(column=None, text="Another context.", placement="user"))
    changed = [dict(r, prompt=r["prompt"] + " Explain.") for r in rows]
    with pytest.raises(AnalysisInputError, match="renders to .* tokens here"):
        items_from_records(records, changed, tok, spec)
    with pytest.raises(AnalysisInputError, match="the dataset has 2 rows"):
        items_from_records(records, rows[:2], tok, spec)


# ----------------------------------------------------------------------------------------------------------------------
# The command line


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    """A tiny model folder, a LoRA adapter on it, and a dataset file with a per-row context."""
    from transformers import AutoModelForCausalLM

    from trl_nca.testing import save_tiny_model

    root = tmp_path_factory.mktemp("analyze")
    model_dir = save_tiny_model(root / "tiny")
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    lora = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj"], init_lora_weights=False)
    )
    lora.save_pretrained(root / "lora")
    rows = [
        {"id": f"q{i}", "prompt": f"Which answer {i}? (A) yes (B) no", "context": CONTEXT, "answer": "AB"[i % 2]}
        for i in range(5)
    ]
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"model": model_dir, "lora": str(root / "lora"), "data": str(data), "root": root}


def test_cli_end_to_end_on_a_tiny_model(tiny_setup, tmp_path, capsys):
    from trl_nca.cli import main

    out = tmp_path / "out"
    argv = [
        "analyze",
        "--model",
        f"base={tiny_setup['model']}",
        "--model",
        f"nca=:{tiny_setup['lora']}",
        "--model",
        f"same={tiny_setup['model']}",
        "--dataset",
        tiny_setup["data"],
        "--max-new-tokens",
        "5",
        "--grad-items",
        "3",
        "--batch-size",
        "2",
        "--top-tokens",
        "3",
        "--output-dir",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "## Summary" in printed
    lines = printed.strip().splitlines()  # what it will do first; its time and outputs last
    assert lines[0].startswith("trl-nca analyze: measure 3 models (base, nca, same; the first is the reference) on 5 ")
    assert lines[-1].startswith("trl-nca analyze: done in ") and f"result: {out / 'analysis.json'}." in lines[-1]
    result = json.loads((out / "analysis.json").read_text())
    names = [m["name"] for m in result["models"]]
    assert names == ["base", "nca", "same"]
    base, nca, same = result["models"]
    assert "update" not in base
    assert same["update"]["total"] == 0.0 and nca["update"]["method"] == "lora_delta"
    assert {m for m, v in nca["update"]["by_module"].items() if v > 0} == {"q_proj", "k_proj"}
    assert base["hidden_cosine"] == same["hidden_cosine"] and base["view_kl"] == same["view_kl"]
    assert base["hidden_cosine"]["layers"] == [0, 1] and len(base["view_kl"]["top_tokens"]) == 3
    assert base["grad_cosine"]["items"] == 3 and nca["grad_cosine"]["num_params"] < base["grad_cosine"]["num_params"]
    assert nca["completions"] == {"source": "sampled by nca"}
    for name in ("report.md", "hidden_cosine.png", "view_kl.png", "update_norms.png"):
        assert (out / name).stat().st_size > 0
    report = (out / "report.md").read_text()
    assert "| nca | lora_delta |" in report and "## OPD vs NCA gradients" in report


def test_cli_on_the_records_of_trl_nca_eval(tiny_setup, tmp_path):
    """`trl-nca eval` then `trl-nca analyze --records <eval folder>`: each model is scored on its own records."""
    from trl_nca.cli import main

    eval_dir = tmp_path / "eval"
    assert (
        main(
            [
                "eval",
                "--model",
                f"base={tiny_setup['model']}",
                "--dataset",
                tiny_setup["data"],
                "--scorer",
                "mcq",
                "--max-new-tokens",
                "4",
                "--output-dir",
                str(eval_dir),
                "--no-plots",
                "--bootstrap",
                "0",
                "--no-progress",
            ]
        )
        == 0
    )
    out = tmp_path / "out"
    argv = [
        "analyze",
        "--model",
        f"base={tiny_setup['model']}",
        "--records",
        str(eval_dir),
        "--dataset",
        tiny_setup["data"],
        "--grad-items",
        "0",
        "--output-dir",
        str(out),
        "--no-progress",
        "--no-plots",
    ]
    # an interrupted evaluation's half-written last line: analyze leaves it out and does not touch the file it reads
    records_file = eval_dir / "base" / "records.jsonl"
    lines = records_file.read_text().splitlines()
    records_file.write_text("\n".join(lines[:4]) + "\n" + lines[4][:40])
    before = records_file.read_bytes()
    assert main(argv) == 0
    assert records_file.read_bytes() == before
    assert json.loads((out / "analysis.json").read_text())["models"][0]["completions"]["items"] == 4
    records_file.write_text("\n".join(lines) + "\n")
    assert main(argv) == 0
    result = json.loads((out / "analysis.json").read_text())
    (base,) = result["models"]
    assert base["completions"]["source"] == "records" and base["completions"]["items"] == 5
    assert "grad_cosine" not in base and "re-tokenised" in result["notes"][0]
    assert not (out / "hidden_cosine.png").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "Give the prompts"),
        (["--task", "reply_in_french", "--context-text", "hi"], "brings its own context"),
        (["--task", "nope"], "Unknown built-in task"),
        (["--task", "reply_in_french", "--records", "/nonexistent/records.jsonl"], "not found"),
        (["--task", "reply_in_french", "--percentile", "101"], "--percentile"),
    ],
)
def test_cli_bad_input_is_one_clear_error(tiny_setup, tmp_path, capsys, extra, message):
    from trl_nca.cli.analyze import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--model", tiny_setup["model"], "--output-dir", str(tmp_path), *extra])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_cli_on_the_model_organism(tmp_path):
    """The organism (pretrained once, cached) on its built-in task: runs, and its context changes the views."""
    from trl_nca.cli.analyze import main

    out = tmp_path / "out"
    assert (
        main(
            [
                "--model",
                "base=organism",
                "--task",
                "organism_shift",
                "--limit",
                "8",
                "--output-dir",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    (base,) = json.loads((out / "analysis.json").read_text())["models"]
    assert base["tokens"] > 0 and base["view_kl"]["token_mean"] > 0.01
    assert not math.isnan(base["grad_cosine"]["cosine"])
