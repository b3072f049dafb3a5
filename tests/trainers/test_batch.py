"""`trl_nca.trainers.batch`: the `NCABatch` a trainer builds at its boundary from a mapping of both views, and the
one line that refuses a batch without them."""

import pytest
import torch

from trl_nca.trainers.batch import VIEW_KEYS, NCABatch


def views(keys=VIEW_KEYS):
    return {key: torch.full((2, 3), i) for i, key in enumerate(keys)}


def test_from_mapping_reads_the_views_in_order_and_takes_the_other_fields():
    names = ("a", "b", "c", "d", "e", "f")
    batch = NCABatch.from_mapping(views(names), names, "T", on_policy=False)
    for i, key in enumerate(VIEW_KEYS):
        assert torch.equal(getattr(batch, key), torch.full((2, 3), i)), key
    assert (batch.on_policy, batch.step_tokens) == (False, None)


def test_a_batch_without_the_context_view_is_refused_with_the_fix():
    partial = {k: v for k, v in views().items() if not k.startswith("context_")}
    with pytest.raises(
        ValueError, match=r"^MyTrainer\.compute_loss got a batch without \['context_prompts'.*cannot be"
    ):
        NCABatch.from_mapping(partial, trainer="MyTrainer")
