"""`adapter_is_identity` decides whether the LoRA self-teacher may be the student with its adapter disabled."""

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
