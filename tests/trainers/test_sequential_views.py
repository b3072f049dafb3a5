"""`nca_sequential_views`: a training micro-batch backpropagates its no-context view (with the teacher and OPD) before
its context view runs. The same update and logged terms as both views at once, in float64; at most one view's saved
activations alive at a time; the settings where it cannot apply."""

import gc
import weakref

import pytest
import torch
from datasets import Dataset

from trl_nca import NCAConfig, NCADistillationConfig, NCADistillationTrainer, NCATrainer
from trl_nca.core.losses import DivergenceSpec
from trl_nca.testing import CONTEXT, FLOAT64, STORED32, float64_model, make_tiny_model
from trl_nca.trainers.objective import NCASettings, resolve_sequential_views


def references(n=4):
    """Reference completions of different lengths (off-policy steps score exactly these)."""
    rows = [
        [
            {"role": "user", "content": f"Question {i}: which answer? (A) yes (B) no"},
            {"role": "assistant", "content": "<answer>" + "AB"[i % 2] + "</answer>" + " ok" * (2 * i)},
        ]
        for i in range(n)
    ]
    return Dataset.from_dict({"messages": rows, "context": [CONTEXT] * n})


def nca_args(tmp_path, **kwargs):
    defaults = dict(
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        per_device_train_batch_size=4,
        max_new_tokens=6,
        lmbda=0.0,
        nca_beta=0.5,
        optim="sgd",
        learning_rate=1.0,
        max_grad_norm=0.0,
        lr_scheduler_type="constant",
        bf16=False,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        gradient_checkpointing=False,
        seed=0,
        disable_tqdm=True,
    )
    defaults.update(kwargs)
    return NCAConfig(**defaults)


def one_step(tok, tmp_path, sequential, lora=False, teacher="separate", **kwargs):
    """One SGD step at lr 1 (the update is minus the gradient) on float64 models: the update, the logged step and
    whether the views ran in sequence."""
    from peft import LoraConfig

    student = float64_model(make_tiny_model(tok, 0))
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    trainer = NCATrainer(
        model=student,
        teacher_model=float64_model(make_tiny_model(tok, 1)) if teacher == "separate" else None,
        args=nca_args(tmp_path / str(sequential), nca_sequential_views=sequential, **kwargs),
        processing_class=tok,
        train_dataset=references(),
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]) if lora else None,
    )
    trainer.train()
    update = {n: p.detach() - before[n] for n, p in trainer.model.named_parameters() if n in before}
    if lora:
        update = {n: p.detach() for n, p in trainer.model.named_parameters() if "lora_" in n}
    (log,) = [h for h in trainer.state.log_history if "opd_loss" in h]
    return update, log, trainer.nca.sequential


CASES = {
    "full-separate": {},
    "full-self": dict(teacher="self"),
    "lora-self": dict(lora=True, teacher="self"),
    "lora-separate": dict(lora=True),
    "top-k": dict(divergence_support="top_k", top_k=7),
    "dualopd": dict(nca_anchor="teacher"),
    "symmetric-kl": dict(nca_divergence="symmetric_kl"),
    "unshared-prefix": dict(share_prefix=False),
    "accumulation": dict(per_device_train_batch_size=2, gradient_accumulation_steps=2),
    "checkpointing": dict(gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False}),
}


@pytest.mark.numerics
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_views_in_sequence_give_the_update_and_logs_of_both_views_at_once(tok, tmp_path, case):
    (u_seq, log_seq, seq), (u_joint, log_joint, joint) = (
        one_step(tok, tmp_path, sequential, **CASES[case]) for sequential in (True, False)
    )
    assert seq and not joint
    assert u_seq.keys() == u_joint.keys() and any(u.abs().sum() > 0 for u in u_seq.values())
    for name, update in u_joint.items():  # float64 models
        FLOAT64.close(u_seq[name], update, msg=name, scale=update.abs().max())
    for key in ("opd_loss", "nca_loss", "view_kl", "completions/mean_length"):
        assert log_seq[key] == FLOAT64.approx(log_joint[key]), key
    assert log_seq["loss"] == STORED32.approx(log_joint["loss"])  # Trainer's logged loss passes through float32


class SavedActivations:
    """The bytes of the tensors autograd keeps for backward that are alive at once, and their peak; storages are
    counted once, the model's parameters not at all."""

    class _Box:  # holds the data only: a saved tensor with its grad_fn would make a cycle autograd never frees
        def __init__(self, tensor):
            self.tensor = tensor.detach()

    def __init__(self, model):
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.refs, self.live, self.peak = {}, 0, 0

    def pack(self, tensor):
        box = self._Box(tensor)
        ptr = tensor.untyped_storage().data_ptr()
        if ptr not in self.params:
            if ptr not in self.refs:
                self.live += tensor.untyped_storage().nbytes()
                self.peak = max(self.peak, self.live)
            self.refs[ptr] = self.refs.get(ptr, 0) + 1
            weakref.finalize(box, self._release, ptr, tensor.untyped_storage().nbytes())
        return box

    def _release(self, ptr, nbytes):
        self.refs[ptr] -= 1
        if not self.refs[ptr]:
            del self.refs[ptr]
            self.live -= nbytes

    @staticmethod
    def unpack(box):
        return box.tensor


def saved_peak(trainer) -> int:
    """Peak bytes of saved activations over one training step of `trainer` on its first four rows."""
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    batch = trainer._with_completions(batch, on_policy=False)  # its completions chosen, as get_batch_samples does
    meter = SavedActivations(trainer.model)
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
        trainer.training_step(trainer.model, batch)
    gc.collect()
    assert meter.live == 0  # every saved tensor was released by the backward
    return meter.peak


def test_only_one_views_activations_are_alive_at_a_time(tok, tmp_path):
    """A separate teacher, full fine-tuning: with the views in sequence the step keeps at most what the larger of
    (the OPD step, the context view alone) keeps; with both views at once, their sum."""

    def peak(**kwargs):
        trainer = NCATrainer(
            model=make_tiny_model(tok, 0),
            teacher_model=make_tiny_model(tok, 1),
            processing_class=tok,
            args=nca_args(tmp_path, **kwargs),
            train_dataset=references(),
        )
        return saved_peak(trainer)

    opd = peak(nca_beta=0.0)  # the no-context view, the teacher (no graph) and OPD
    both = peak(nca_sequential_views=False)
    in_sequence = peak(nca_sequential_views=True)
    context = both - opd  # what the context view and NCA add when both are alive
    assert context > 0.5 * opd  # the context view is the longer one here: a real saving to look for
    assert in_sequence <= 1.02 * max(opd, context)
    assert in_sequence < 0.8 * both


def test_distillation_trainer_views_in_sequence(tok, tmp_path):
    """NCADistillationTrainer with its own on-policy samples (the same with the views in sequence or not: sampling
    draws the same numbers), 2 accumulation steps: the same update and logged terms."""
    results = []
    for sequential in (True, False):
        student = float64_model(make_tiny_model(tok, 0))
        student.generation_config.eos_token_id = [tok.eos_token_id, *range(40, 100)]  # ragged completions
        before = {n: p.detach().clone() for n, p in student.named_parameters()}
        args = NCADistillationConfig(
            output_dir=str(tmp_path / str(sequential)),
            max_steps=1,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            max_completion_length=8,
            use_cpu=True,
            report_to=[],
            save_strategy="no",
            logging_steps=1,
            gradient_checkpointing=False,
            seed=0,
            nca_beta=0.5,
            optim="sgd",
            learning_rate=1.0,
            max_grad_norm=0.0,
            lr_scheduler_type="constant",
            disable_tqdm=True,
            nca_sequential_views=sequential,
        )
        rows = {
            "prompt": ["Which answer? (A) yes (B) no", "Push the box.", "Is it hateful?", "Up"],
            "context": [CONTEXT] * 4,
        }
        trainer = NCADistillationTrainer(
            model=student,
            teacher_model=float64_model(make_tiny_model(tok, 1)),
            args=args,
            train_dataset=Dataset.from_dict(rows),
            processing_class=tok,
        )
        assert trainer.nca.sequential == sequential
        trainer.train()
        update = {n: p.detach() - before[n] for n, p in student.named_parameters()}
        results.append((update, next(h for h in trainer.state.log_history if "opd_loss" in h)))
    (u_seq, log_seq), (u_joint, log_joint) = results
    for name, update in u_joint.items():
        FLOAT64.close(u_seq[name], update, msg=name, scale=update.abs().max())
    for key in ("opd_loss", "nca_loss", "view_kl"):
        assert log_seq[key] == FLOAT64.approx(log_joint[key]), key
    assert log_seq["entropy"] == STORED32.approx(log_joint["entropy"])


def _settings(**kwargs):
    return NCASettings(**kwargs)


NONE = dict(live_teacher=False, deepspeed=False, full_fine_tuning=False)
REFUSALS = {
    "stop-gradient": (dict(spec=DivergenceSpec(nca_stop_gradient=False)), {}, "nca_stop_gradient"),
    "live-teacher": ({}, dict(live_teacher=True), "live"),
    "joint-forward": (dict(joint_forward=True), {}, "nca_joint_forward"),
    "deepspeed": ({}, dict(deepspeed=True), "DeepSpeed"),
    "lomo": (dict(updates_in_backward=True), {}, "LOMO"),
}


@pytest.mark.parametrize("case", REFUSALS, ids=list(REFUSALS))
def test_where_the_views_cannot_run_in_sequence(case):
    """None: off where it cannot apply; True: an error naming why; off whenever the NCA term is."""
    config, runtime, reason = REFUSALS[case]
    flags = NONE | runtime
    assert resolve_sequential_views(_settings(), True, **NONE)
    assert not resolve_sequential_views(_settings(**config), True, **flags)
    with pytest.raises(ValueError, match=reason):
        resolve_sequential_views(_settings(**config, sequential_views=True), True, **flags)
    assert not resolve_sequential_views(_settings(**config, sequential_views=True), False, **flags)
    assert not resolve_sequential_views(_settings(sequential_views=False), True, **NONE)


def test_none_runs_the_views_in_sequence_for_adapters_only(tok, tmp_path):
    """Full fine-tuning keeps both views at once unless asked (the first backward's gradients would sit beside the
    context view); an adapter runs them in sequence; True runs them in sequence for full fine-tuning too."""
    from peft import LoraConfig

    def sequential(**kwargs):
        lora = kwargs.pop("lora", False)
        trainer = NCATrainer(
            model=make_tiny_model(tok, 0),
            teacher_model=make_tiny_model(tok, 1),
            processing_class=tok,
            args=nca_args(tmp_path, **kwargs),
            train_dataset=references(),
            peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]) if lora else None,
        )
        return trainer.nca.sequential

    assert not sequential() and sequential(lora=True) and sequential(nca_sequential_views=True)
    assert not sequential(lora=True, nca_sequential_views=False) and not sequential(lora=True, nca_beta=0.0)


def test_sequential_views_refused_at_init_where_they_cannot_apply(tok, tmp_path):
    with pytest.raises(ValueError, match="nca_sequential_views=True cannot apply: self_teacher='live'"):
        NCATrainer(
            model=make_tiny_model(tok, 0),
            args=nca_args(tmp_path, self_teacher="live", nca_sequential_views=True),
            train_dataset=references(),
            processing_class=tok,
        )
