"""Gradient checkpointing settled once at setup (`trl_nca.trainers.activation_checkpointing`): non-reentrant unless
asked, TRL's PEFT + ZeRO-3 workaround lifted where DeepSpeed has the fix, the views as one forward where checkpointing is reentrant
under DeepSpeed or DDP, and no FutureWarning for the old checkpointing names from PEFT or TRL (the launches that train
under DeepSpeed are in tests/trainers/test_deepspeed.py)."""

import warnings
from types import SimpleNamespace

import pytest
from packaging.version import Version

from trl_nca import NCAConfig, NCADistillationConfig, NCADistillationTrainer, NCATrainer
from trl_nca.testing import make_tiny_model, make_tiny_tokenizer, prompt_dataset
from trl_nca.trainers.activation_checkpointing import needs_joint_forward, reentrant_for


@pytest.mark.parametrize(
    "requested, peft_zero3, deepspeed, reentrant",
    [
        (None, False, None, False),
        (None, True, Version("0.19.8"), False),  # TRL's workaround lifted: DeepSpeed has the fix
        (None, True, Version("0.19.2"), True),  # kept: DeepSpeed without the fix
        (True, False, None, True),  # the user's choice is kept either way
        (False, True, Version("0.18.6"), False),
    ],
)
def test_reentrant_or_not(requested, peft_zero3, deepspeed, reentrant):
    assert reentrant_for(requested, peft_zero3, deepspeed) is reentrant


def test_joint_forward_where_reentrant_checkpointing_meets_a_gradient_reduction():
    def args(world_size=1, deepspeed=False, checkpointing=True):
        return SimpleNamespace(
            world_size=world_size,
            deepspeed_plugin=object() if deepspeed else None,
            gradient_checkpointing=checkpointing,
        )

    assert needs_joint_forward(args(deepspeed=True), reentrant=True)  # one process under DeepSpeed too
    assert needs_joint_forward(args(world_size=2), reentrant=True)  # DDP
    assert not needs_joint_forward(args(), reentrant=True)  # one process, no reduction hooks
    assert not needs_joint_forward(args(deepspeed=True), reentrant=False)
    assert not needs_joint_forward(args(deepspeed=True, checkpointing=False), reentrant=True)


CONFIGS = {
    "nca": (NCAConfig, NCATrainer, {"max_new_tokens": 3}),
    "distillation": (NCADistillationConfig, NCADistillationTrainer, {"max_completion_length": 3}),
}


@pytest.mark.parametrize("trainer_name", CONFIGS)
@pytest.mark.parametrize("requested", [None, True])
def test_settled_kwargs_reach_the_model_and_sampling(tmp_path, trainer_name, requested):
    """A LoRA run at TRL's defaults (checkpointing on) trains with checkpointing non-reentrant unless asked for, the
    same kwargs are what sampling re-enables checkpointing with, and no FutureWarning about the old checkpointing
    names reaches the user (PEFT's PeftModel and TRL's unwrap_model_for_generation still call them)."""
    from peft import LoraConfig

    config_class, trainer_class, lengths = CONFIGS[trainer_name]
    tok = make_tiny_tokenizer()
    kwargs = None if requested is None else {"use_reentrant": requested}
    args = config_class(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        gradient_checkpointing_kwargs=kwargs,
        **lengths,
    )
    assert args.gradient_checkpointing  # TRL's default
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = trainer_class(
            model=make_tiny_model(tok),
            args=args,
            train_dataset=prompt_dataset(4),
            processing_class=tok,
            peft_config=LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]),
        )
        trainer.train()
    old_names = [w for w in caught if "gradient_checkpointing" in str(w.message) and w.category is FutureWarning]
    assert old_names == []
    expected = bool(requested)
    assert trainer.args.gradient_checkpointing_kwargs["use_reentrant"] is expected
    layers = [m for m in trainer.model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    assert layers, "checkpointing is on in the student's layers"
    for layer in layers:
        assert layer._gradient_checkpointing_func.keywords["use_reentrant"] is expected
