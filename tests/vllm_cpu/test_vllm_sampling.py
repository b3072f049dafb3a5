"""Sampling with vLLM in training (`NCADistillationTrainer(use_vllm=True, vllm_mode="colocate")`, one process, CPU):
the completions come from vLLM, the loss and update on them are the Transformers path's, the engine samples with the
trained weights after each step, and the weight push TRL uses fails where vLLM's CPU build packs the weights while
vLLM's reload (`trl_nca.trainers.vllm_sync`) works."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_nca import NCADistillationConfig, NCADistillationTrainer
from trl_nca.testing import (
    FLOAT64,
    ONE_SGD_STEP,
    float64_model,
    full_logprobs,
    prompt_dataset,
    record_batches,
    run_args,
    token_kl,
)


pytestmark = [pytest.mark.vllm, pytest.mark.slow]

STEP = {**ONE_SGD_STEP, "use_vllm": True, "vllm_mode": "colocate", "vllm_max_model_length": 512}


def vllm_trainer(student, teacher, tokenizer, directory, **fields):
    trainer = NCADistillationTrainer(
        model=student,
        teacher_model=teacher,
        args=run_args(NCADistillationConfig, directory, STEP, **fields),
        train_dataset=prompt_dataset(),
        processing_class=tokenizer,
    )
    sampled = []
    generate = trainer.vllm_generation.generate

    def spy(*args, **kwargs):  # what vLLM returned, to compare with what the loss scored
        out = generate(*args, **kwargs)
        sampled.extend(out[1])
        return out

    trainer.vllm_generation.generate = spy
    return trainer, sampled


@pytest.mark.numerics
def test_colocated_vllm_samples_and_the_loss_is_the_transformers_paths(vllm_models, tmp_path):
    """One SGD step (lr 1, no clipping) on completions vLLM sampled: the completions scored are vLLM's, and the update
    equals minus the gradient of a full-logit float64 reference of OPD + nca_beta * NCA on those completions."""
    student_path, teacher_path = vllm_models
    tokenizer = AutoTokenizer.from_pretrained(student_path)
    student = float64_model(AutoModelForCausalLM.from_pretrained(student_path))  # vLLM loads the folder, then the sync
    teacher = float64_model(AutoModelForCausalLM.from_pretrained(teacher_path))
    initial = copy.deepcopy(student)
    trainer, sampled = vllm_trainer(student, copy.deepcopy(teacher), tokenizer, tmp_path)
    batches = record_batches(trainer)
    trainer.train()
    (batch,) = batches
    scored = [row[mask.bool()].tolist() for row, mask in zip(batch.completion_ids, batch.completion_mask)]
    assert sorted(scored) == sorted(list(ids) for ids in sampled)  # TRL shuffles the rows of its generation batch

    completions = (batch.completion_ids, batch.completion_mask)
    lx = full_logprobs(initial, batch.prompts, batch.prompt_attention_mask, *completions)
    lc = full_logprobs(initial, batch.context_prompts, batch.context_prompt_attention_mask, *completions)
    with torch.no_grad():
        lt = full_logprobs(teacher, batch.context_prompts, batch.context_prompt_attention_mask, *completions)
    reference = token_kl(lx, lt).mean() + 0.5 * token_kl(lx.detach(), lc).mean()
    reference.backward()
    (log,) = [h for h in trainer.state.log_history if "opd_loss" in h]
    assert log["loss"] == pytest.approx(reference.item(), rel=1e-6)  # the logged loss passed through float32
    for name, p in initial.named_parameters():
        update = student.get_parameter(name).detach() - p.detach()
        FLOAT64.close(update, -p.grad, msg=name, scale=p.grad.abs().max())


def test_the_engine_samples_with_the_trained_weights(vllm_models, tmp_path):
    """Two steps at a learning rate that moves the weights: afterwards the engine's log-probabilities of a sequence are
    the trained student's (within bfloat16 rounding: vLLM's CPU build runs a float32 checkpoint in bfloat16), not the
    initial student's."""
    student_path, teacher_path = vllm_models
    tokenizer = AutoTokenizer.from_pretrained(student_path)
    student = AutoModelForCausalLM.from_pretrained(student_path, dtype=torch.float32)
    initial = copy.deepcopy(student)
    trainer, _ = vllm_trainer(student, teacher_path, tokenizer, tmp_path, max_steps=3, learning_rate=30.0)
    trainer.train()
    trainer._generate_single_turn([[5, 6]], None, {})  # the step-3 weights into the engine, as the next step would

    from vllm import SamplingParams

    ids = tokenizer("Which answer? (A) yes (B) no")["input_ids"]
    (out,) = trainer.vllm_generation.llm.generate(
        [{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False
    )
    served = torch.tensor([next(iter(lp.values())).logprob for lp in out.prompt_logprobs[1:]])

    def local(model):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
        return logits.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]

    trained, before = local(student), local(initial)
    moved = (trained - before).abs().max()
    assert moved > 0.5, "the test needs weights that moved"
    assert (served - trained).abs().max() < 0.1 * moved  # bfloat16 rounding of a 2-layer model, far below the move


def test_trls_weight_push_fails_where_the_cpu_build_packs_weights_and_the_reload_works(vllm_models):
    """A float32 engine (oneDNN packs its linear weights on x86): TRL's per-parameter push ends in vLLM's
    `'Parameter' object has no attribute 'weight_loader'`, while vLLM's reload (the route `vllm_sync` takes) makes the
    engine generate what the new weights generate."""
    from vllm import LLM, SamplingParams

    student_path = vllm_models[0]
    llm = LLM(model=student_path, dtype="float32", max_model_len=512, enforce_eager=True, seed=0)
    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    new = AutoModelForCausalLM.from_pretrained(student_path, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    prompt, greedy = [{"prompt_token_ids": [5, 6, 7, 8]}], SamplingParams(temperature=0.0, max_tokens=8)
    before = llm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0].token_ids
    with pytest.raises(AttributeError, match="'Parameter' object has no attribute 'weight_loader'"):
        for name, p in new.named_parameters():  # TRL's VLLMGeneration.sync_weights, colocate mode
            runner.model.load_weights([(name, p.data)])
    runner.reload_weights(weights_iterator=new.named_parameters())
    llm.reset_prefix_cache()
    after = llm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0].token_ids
    expected = new.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=8, do_sample=False)[0, 4:].tolist()
    assert list(after) == expected != list(before)


def test_seeded_requests_over_one_steps_token_budget_do_not_stop_the_cpu_engine(vllm_models):
    """200 seeded prompts of 31 tokens (6200 tokens, more than the engine's 4096 per step): sent at once, the engine
    would prefill some prompts in parts and die ("CPU Generator does not use offset"); `VLLMBackend` sends them in
    groups it prefills whole, and each sample is the one the same request gives alone in a small batch."""
    from vllm import LLM

    from trl_nca.core.sampling import GenerationSettings, VLLMBackend

    student_path = vllm_models[0]
    llm = LLM(model=student_path, dtype="float32", max_model_len=512, enforce_eager=True, seed=0)
    assert llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens < 200 * 31
    backend = VLLMBackend(llm, AutoTokenizer.from_pretrained(student_path))
    prompts = [[5 + (j * 7 + i) % 250 for j in range(31)] for i in range(200)]
    settings = GenerationSettings(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=0)
    together = backend.generate(prompts, list(range(200)), settings)
    alone = [g for i in range(0, 20, 5) for g in backend.generate(prompts[i : i + 5], list(range(i, i + 5)), settings)]
    assert [g.token_ids for g in together[:20]] == [g.token_ids for g in alone]
