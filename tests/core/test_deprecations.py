"""The one alias left before the first release (`trl_nca.core.deprecation`): `token_divergences(want=...)` still
works, with a FutureWarning naming `terms=`, and gives what `terms=` gives. It goes with the keyword."""

import pytest
import torch

from trl_nca.core.losses import DivergenceSpec, LMHead, token_divergences


def _states(seed, tokens=5, width=8):
    return torch.randn(tokens, width, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_token_divergences_want_is_terms():
    head = LMHead(_states(0, 11))
    args = (_states(1), _states(2), head, head, DivergenceSpec())
    new = token_divergences(*args, h_c=_states(3), terms=("opd", "view_kl"))
    with pytest.warns(FutureWarning, match=r"token_divergences\(want=\.\.\.\) is deprecated: use terms="):
        old = token_divergences(*args, h_c=_states(3), want=("opd", "view_kl"))
    assert old.keys() == new.keys() == {"opd", "view_kl"}
    for key in new:
        assert torch.equal(old[key], new[key]), key
    with pytest.raises(TypeError, match="both want= .* and terms="):
        token_divergences(*args, terms=("opd",), want=("opd",))
