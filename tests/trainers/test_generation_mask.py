"""On-policy sampling: the trainer's completions and masks equal GKD's `generate_on_policy_outputs`, without the
deprecation warnings that path raises."""

import warnings

import pytest
import torch
from datasets import Dataset
from trl.experimental.gkd import GKDTrainer

from trl_nca import NCAConfig, NCATrainer
from trl_nca.core.sampling import mask_through_eos
from trl_nca.testing import CPU, make_tiny_model, make_tiny_tokenizer, run_args


def reference_mask(ids, eos):
    stops = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(ids.tolist()):
        for t, token in enumerate(row):
            mask[r, t] = 1
            if token in stops:
                break
    return mask


@pytest.mark.parametrize("eos", [None, 3, [3, 7]])
def test_mask_through_eos(eos):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 10, (64, 9), generator=generator)
    ids[0] = 3  # a stop at position 0 and everywhere after it
    ids[1] = 5  # no stop at all
    assert torch.equal(mask_through_eos(ids, eos), reference_mask(ids, eos))


@pytest.mark.parametrize("rows", [1, 4])
def test_trainer_samples_as_gkd_does(tmp_path, rows):
    tok = make_tiny_tokenizer()
    model = make_tiny_model(tok)
    args = run_args(
        NCAConfig,
        tmp_path,
        CPU,
        max_new_tokens=12,
        seed=0,
        gradient_checkpointing=False,
        per_device_train_batch_size=rows,
    )
    data = Dataset.from_dict({"prompt": [f"Question {i}?" for i in range(rows)], "context": ["Be brief."] * rows})
    trainer = NCATrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(rows)])
    prompts, prompt_mask = batch["prompts"], batch["prompt_attention_mask"]
    # stop ids the tiny random model does emit (found in a first draw), so that rows stop early and at different places
    torch.manual_seed(123)
    first, _ = trainer._generate(trainer.model, prompts, prompt_mask)
    trainer.generation_config.eos_token_id = [tok.eos_token_id, int(first[0, 3]), int(first[-1, 6])]
    torch.manual_seed(123)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        ids, mask = trainer._generate(trainer.model, prompts, prompt_mask)
    torch.manual_seed(123)
    sequences, attention, _ = GKDTrainer.generate_on_policy_outputs(
        trainer.model, {"prompts": prompts, "prompt_attention_mask": prompt_mask}, trainer.generation_config
    )
    width = prompts.shape[1]
    assert torch.equal(ids, sequences[:, width:])
    assert torch.equal(mask, attention[:, width:])
    assert (mask == 0).any() or ids.shape[1] < args.max_new_tokens  # some rows stopped early


@pytest.mark.parametrize("trainer_class", ["NCATrainer", "NCADistillationTrainer"])
def test_lora_student_samples_as_its_eval_mode_policy(tmp_path, trainer_class):
    """With LoRA dropout kept in training (`disable_dropout=False`, DistillationTrainer's default; `lora_dropout` 0.5
    so that a thinned sample would differ), every on-policy sample equals what the eval-mode student draws from the
    same random state; the training forwards still draw their dropout, and the modes are restored after sampling."""
    from peft import LoraConfig

    from trl_nca import NCADistillationConfig, NCADistillationTrainer
    from trl_nca.core.prefix import active_dropout
    from trl_nca.testing import SHORT_RUN, prompt_dataset

    tok = make_tiny_tokenizer()
    trainer_cls, config_cls = {
        "NCATrainer": (NCATrainer, NCAConfig),
        "NCADistillationTrainer": (NCADistillationTrainer, NCADistillationConfig),
    }[trainer_class]
    preset = {**SHORT_RUN, "lmbda": 1.0, "gradient_checkpointing": True}  # TRL's default checkpointing
    if config_cls is not NCAConfig:  # DistillationConfig: on-policy by default, its own name for the length
        del preset["lmbda"]
        preset["max_completion_length"] = preset.pop("max_new_tokens")
    args = run_args(config_cls, tmp_path, preset, disable_dropout=False)
    peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.5)
    trainer = trainer_cls(
        model=make_tiny_model(tok, 0),
        args=args,
        train_dataset=prompt_dataset(),
        processing_class=tok,
        peft_config=peft,
    )
    student = trainer.accelerator.unwrap_model(trainer.model)
    generate, checked, dropout_in_loss = student.generate, [], []

    def spy(*a, **k):
        state = torch.get_rng_state()
        sampled = generate(*a, **k)
        sampled = sampled if torch.is_tensor(sampled) else sampled.sequences
        modes = [m.training for m in student.modules()]
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(state)
            student.eval()
            policy = generate(*a, **k)
            policy = policy if torch.is_tensor(policy) else policy.sequences
        for module, mode in zip(student.modules(), modes):
            module.training = mode
        checked.append(torch.equal(sampled, policy))
        return sampled

    compute_loss = trainer.compute_loss

    def loss_spy(model, inputs, *a, **k):
        dropout_in_loss.append(active_dropout(student))
        return compute_loss(model, inputs, *a, **k)

    student.generate, trainer.compute_loss = spy, loss_spy
    trainer.train()
    assert checked and all(checked), checked
    assert dropout_in_loss and all(d is not None and "lora_dropout" in d for d in dropout_in_loss), dropout_in_loss
