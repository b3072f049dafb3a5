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
        NCAConfig, tmp_path, CPU, max_new_tokens=12, seed=0, gradient_checkpointing=False,
        per_device_train_batch_size=rows,
    )  # fmt: skip
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
