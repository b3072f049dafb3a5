"""`adapter_is_identity` decides whether the LoRA self-teacher may be the student with its adapter disabled."""

from contextlib import nullcontext

import pytest
import torch
from peft import LoraConfig, get_peft_model

from trl_nca.testing import make_tiny_model, make_tiny_tokenizer
from trl_nca.trainers.teacher import adapter_is_identity


def test_adapter_identity_with_a_lora_on_the_embeddings():
    """LoRA on embed_tokens keeps its B matrices in a ParameterDict (not Linear modules): they are read too."""
    tok = make_tiny_tokenizer()
    model = get_peft_model(
        make_tiny_model(tok), LoraConfig(r=4, target_modules=["embed_tokens", "q_proj"], init_lora_weights=False)
    )
    assert not adapter_is_identity(model)
    for name, param in model.named_parameters():
        if "lora_B" in name or "lora_embedding_B" in name:
            torch.nn.init.zeros_(param)
    assert adapter_is_identity(model)
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "lora_embedding_B" in n)[0, 0] = 1.0
    assert not adapter_is_identity(model)  # a non-zero embedding B alone is enough


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_frozen_copy_gathers_one_module_at_a_time(monkeypatch, tied):
    """Under ZeRO-3 `frozen_copy` gathers the partitioned parameters of one module at a time (faked here: every
    parameter carries a `ds_id`, and `gathered` records what it is asked to gather at once), never the whole student:
    at most the largest module's own parameters. The copy holds every value, in new storage, frozen, ties kept."""
    from trl_nca.trainers import teacher as teacher_module

    model = make_tiny_model(make_tiny_tokenizer(), tie_word_embeddings=tied)
    params = dict(model.named_parameters(remove_duplicate=False))
    for index, p in enumerate(model.parameters()):
        p.ds_id = index
    at_once = []

    def recording(tensors):
        tensors = list(tensors)
        at_once.append(len(tensors))
        return nullcontext()

    monkeypatch.setattr(teacher_module, "gathered", recording)
    copy = teacher_module.frozen_copy(model)
    largest = max(len([p for p in m._parameters.values() if p is not None]) for m in model.modules())
    assert at_once and max(at_once) <= largest < len(list(model.parameters()))
    assert sum(at_once) == len(list(model.parameters()))  # each parameter once, tied ones too
    copied = dict(copy.named_parameters(remove_duplicate=False))
    assert copied.keys() == params.keys()
    for name, p in params.items():
        assert torch.equal(copied[name], p) and copied[name].data_ptr() != p.data_ptr(), name
        assert not copied[name].requires_grad and not hasattr(copied[name], "ds_id")
    assert (copy.lm_head.weight is copy.model.embed_tokens.weight) == tied
