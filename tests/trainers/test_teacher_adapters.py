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


def test_a_wrapped_teacher_is_called_through_its_wrapper():
    """A teacher prepared in an engine (DeepSpeed's, faked here by a module holding it as `.module`) is scored through
    the engine's forward (TRL's forward redirection), so hooks on its top-level module run; the states are those of
    calling the teacher directly. tests/trainers/test_deepspeed.py checks it under real 2-process ZeRO-3."""
    from torch import nn

    from trl_nca.core.schedule import ConstantSchedule
    from trl_nca.core.views import build_view, left_pad, right_pad
    from trl_nca.trainers.objective import NCAObjective, NCASettings
    from trl_nca.trainers.teacher import ModelTeacher

    class Engine(nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module, self.calls = module, 0

        def forward(self, *args, **kwargs):
            self.calls += 1
            return self.module(*args, **kwargs)

    tok = make_tiny_tokenizer()
    teacher = make_tiny_model(tok, seed=1)
    engine = Engine(teacher)
    root_calls = []
    teacher.register_forward_pre_hook(lambda module, args: root_calls.append(1))

    def objective(wrapper):  # built without a Trainer
        return NCAObjective(NCASettings(), ModelTeacher(teacher, wrapper), ConstantSchedule(), tok.pad_token_id)

    (prompts, prompt_mask), (completion, completion_mask) = (
        left_pad([[5, 6, 7], [8, 9]], 0),
        right_pad([[10, 11], [12]], 0),
    )
    view = build_view(prompts, prompt_mask, completion, completion_mask)
    direct, _ = objective(None).teacher_states(view, completion_mask, None, None)
    assert engine.calls == 0 and root_calls == []  # no wrapper known: the decoder is called directly
    routed, _ = objective(engine).teacher_states(view, completion_mask, None, None)
    assert engine.calls == 1 and root_calls == [1]
    torch.testing.assert_close(routed, direct, rtol=0, atol=0)
