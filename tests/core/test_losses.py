"""The chunked divergences against a plain full-logit reference, in value and gradient."""

import itertools
import re
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from trl.experimental.gkd import GKDTrainer

from trl_nca.core.losses import (
    NCA_DIVERGENCES,
    DivergenceSpec,
    LMHead,
    TeacherTopK,
    divergence_names,
    register_divergence,
    token_divergences,
)
from trl_nca.testing import FLOAT64


pytestmark = pytest.mark.numerics  # replayed by CI under other vector units (.ci/run)

BUILTIN_DIVERGENCES = tuple(NCA_DIVERGENCES)  # at import: before any test registers one of its own


def _kl(p_log, q_log):
    """Elementwise KL(p || q) terms, through torch's own `kl_div`."""
    return F.kl_div(q_log, p_log, log_target=True, reduction="none")


# Each NCA divergence of `trl_nca.core.losses.NCA_DIVERGENCES`, written here on its own from the full log-probabilities
# (anchor, q_c): a divergence added to the package without its line here fails `test_every_divergence_has_a_reference`.
REFERENCE_DIVERGENCES = {
    "forward_kl": lambda anchor, lpc: _kl(anchor, lpc),
    "symmetric_kl": lambda anchor, lpc: _kl(anchor, lpc) + _kl(lpc, anchor),
}


def reference(h_x, h_c, h_t, w_s, w_t, spec: DivergenceSpec):
    """Full logits and full log_softmax. Full-vocabulary OPD goes through TRL's own generalized JSD; the top-k
    variants gather the support columns (from the full log_softmax, or renormalised over the support)."""
    T = spec.temperature
    lx, lc, lt = h_x @ w_s.T / T, h_c @ w_s.T / T, h_t @ w_t.T / T
    if spec.top_k:
        support = (lt if spec.top_k_of == "teacher" else lx).detach().topk(spec.top_k, dim=-1).indices
        if spec.renormalize:
            lpx, lpc, lpt = (F.log_softmax(z.gather(1, support), -1) for z in (lx, lc, lt))
        else:
            lpx, lpc, lpt = (F.log_softmax(z, -1).gather(1, support) for z in (lx, lc, lt))
        assert spec.beta in (0.0, 1.0)
        opd = (_kl(lpx, lpt) if spec.beta == 1.0 else _kl(lpt, lpx)).sum(-1)
    else:
        lpx, lpc, lpt = (F.log_softmax(z, -1) for z in (lx, lc, lt))
        opd = GKDTrainer.generalized_jsd_loss(lx, lt, beta=spec.beta, reduction="none").sum(-1)
    anchor = lpt if spec.nca_target == "teacher" else (lpx.detach() if spec.nca_stop_gradient else lpx)
    nca = REFERENCE_DIVERGENCES[spec.nca_divergence](anchor, lpc)
    view_kl = F.kl_div(lpc, lpx, log_target=True, reduction="none").sum(-1).detach()
    return {"opd": opd, "nca": nca.sum(-1), "view_kl": view_kl}


def _inputs(n=7, h=16, v=53, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: (torch.randn(*s, generator=g, dtype=torch.float64)).requires_grad_()  # noqa: E731
    return mk(n, h), mk(n, h), torch.randn(n, h, generator=g, dtype=torch.float64), mk(v, h), mk(v, h) * 1.0


SPECS = [
    DivergenceSpec(beta=1.0),
    DivergenceSpec(beta=0.0),
    DivergenceSpec(beta=0.5, temperature=0.7),
    DivergenceSpec(beta=1.0, top_k=5),
    DivergenceSpec(beta=1.0, top_k=5, renormalize=True),
    # the teacher's top-k (a served teacher's support), reverse and forward KL
    DivergenceSpec(beta=1.0, top_k=5, top_k_of="teacher"),
    DivergenceSpec(beta=0.0, top_k=5, top_k_of="teacher", renormalize=True),
    DivergenceSpec(nca_target="teacher"),
    DivergenceSpec(nca_stop_gradient=False),
    # every registered divergence (the default forward_kl is above), also on the top-k support
    *(DivergenceSpec(nca_divergence=name) for name in BUILTIN_DIVERGENCES if name != "forward_kl"),
    *(DivergenceSpec(top_k=5, renormalize=True, nca_divergence=name) for name in BUILTIN_DIVERGENCES),
]


def test_every_divergence_has_a_reference():
    """The reference above writes out each divergence the package registers; one without it is untested."""
    assert set(BUILTIN_DIVERGENCES) == set(REFERENCE_DIVERGENCES)


def test_a_divergence_name_is_checked_and_registered_once():
    with pytest.raises(ValueError, match=re.escape(f"nca_divergence must be one of {divergence_names()}")):
        DivergenceSpec(nca_divergence="no_such_divergence")
    with pytest.raises(ValueError, match="'forward_kl' is already registered"):
        register_divergence("forward_kl", "again")(lambda anchor, context: anchor)
    with pytest.raises(ValueError, match="must be a Python identifier"):
        register_divergence("two words", "no")(lambda anchor, context: anchor)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: str(s)[15:-1])
@pytest.mark.parametrize("vocab_chunk,token_chunk", [(8, 3), (64, 100)])
def test_chunked_matches_reference(spec, vocab_chunk, token_chunk):
    h_x, h_c, h_t, w_s, w_t = _inputs()
    w_t = w_t.detach()
    ref = reference(h_x, h_c, h_t, w_s, w_t, spec)
    out = token_divergences(
        h_x, h_t, LMHead(w_s), LMHead(w_t), spec, h_c=h_c, vocab_chunk=vocab_chunk, token_chunk=token_chunk
    )
    for name in ("opd", "nca", "view_kl"):
        FLOAT64.close(out[name], ref[name])
    weights = torch.tensor([0.3, 1.0, 0.0, 2.0, 0.5, 1.5, 0.7], dtype=torch.float64)
    for name in ("opd", "nca"):
        grads = torch.autograd.grad(
            (out[name].double() * weights).sum(), (h_x, h_c, w_s), allow_unused=True, retain_graph=True
        )
        ref_grads = torch.autograd.grad(
            (ref[name] * weights).sum(), (h_x, h_c, w_s), allow_unused=True, retain_graph=True
        )
        for g, r in zip(grads, ref_grads):
            if r is None or not r.abs().sum():
                assert g is None or not g.abs().sum(), f"{name}: unexpected gradient"
            else:
                FLOAT64.close(g, r)


def test_gradient_paths():
    """OPD reaches only the no-context view; NCA (default) reaches only the context view."""
    h_x, h_c, h_t, w_s, w_t = _inputs()
    out = token_divergences(h_x, h_t, LMHead(w_s), LMHead(w_t.detach()), DivergenceSpec(), h_c=h_c, vocab_chunk=16)
    g_x, g_c = torch.autograd.grad(out["nca"].sum(), (h_x, h_c), allow_unused=True, retain_graph=True)
    assert g_x is None or not g_x.abs().sum()
    assert g_c.abs().sum() > 0
    g_x, g_c = torch.autograd.grad(out["opd"].sum(), (h_x, h_c), allow_unused=True)
    assert g_x.abs().sum() > 0
    assert g_c is None or not g_c.abs().sum()


@pytest.mark.parametrize("spec", [DivergenceSpec(), DivergenceSpec(nca_target="teacher")], ids=["nca", "dualopd"])
def test_teacher_sharing_the_student_head_is_a_constant(spec):
    """A live self-teacher scores with the student's own head: its distribution must still send no gradient."""
    h_x, h_c, _, w_s, _ = _inputs()
    h_t = h_c.detach()
    out = token_divergences(h_x, h_t, LMHead(w_s), LMHead(w_s), spec, h_c=h_c, vocab_chunk=8)
    ref = reference(h_x, h_c, h_t, w_s, w_s.detach(), spec)
    for name in ("opd", "nca"):
        FLOAT64.close(out[name], ref[name])
        got = torch.autograd.grad(out[name].sum(), (h_x, h_c, w_s), allow_unused=True, retain_graph=True)
        expected = torch.autograd.grad(ref[name].sum(), (h_x, h_c, w_s), allow_unused=True, retain_graph=True)
        for g, r in zip(got, expected):
            if r is None:
                assert g is None or not g.abs().sum()
            else:
                FLOAT64.close(g, r)


def _partition(param: torch.nn.Parameter) -> None:
    """Make `param` look like a DeepSpeed ZeRO-3 partitioned parameter: an empty tensor plus the attributes TRL's
    `maybe_gather_lm_head_ctx` reads (`ds_id`, `ds_shape`, `ds_status`); the full data waits in `_full`."""
    param.ds_id, param.ds_shape, param.ds_status, param._full = id(param), param.shape, "NOT_AVAILABLE", param.data
    param.data = torch.empty(0, dtype=param.dtype)


@contextmanager
def _fake_gather(*params):
    """Stands in for `deepspeed.zero.GatheredParameters` (DeepSpeed cannot run on this CPU-only CI): gathers the
    partitioned parameters for the block and partitions them again on exit, skipping those already gathered."""
    todo = {id(p): p for p in params if p is not None and getattr(p, "ds_status", None) == "NOT_AVAILABLE"}
    for p in todo.values():
        p.data, p.ds_status = p._full, "AVAILABLE"
    try:
        yield
    finally:
        for p in todo.values():
            p._full, p.ds_status = p.data, "NOT_AVAILABLE"
            p.data = torch.empty(0, dtype=p.dtype)


@pytest.mark.parametrize("n", [7, 0], ids=["tokens", "empty"])
@pytest.mark.parametrize("bias", [False, True])
def test_zero3_partitioned_head_gets_full_gradients(monkeypatch, n, bias):
    """Under ZeRO-3 the LM head is an empty shard outside a gather: the log-normaliser's backward must allocate the
    weight gradient inside the gather, with the full shape autograd recorded in the (gathered) forward."""
    monkeypatch.setattr("trl_nca.core.losses.maybe_gather_lm_head_ctx", _fake_gather)
    h_x, h_c, h_t, w_s, w_t = _inputs(n=n)
    w_t = w_t.detach()
    b_s = torch.randn(w_s.shape[0], dtype=torch.float64, requires_grad=True) if bias else None
    ref_head = LMHead(w_s, b_s)
    ref = token_divergences(h_x, h_t, ref_head, LMHead(w_t), DivergenceSpec(), h_c=h_c, vocab_chunk=8)
    ref_params = [w_s] + ([b_s] if bias else [])
    expected = torch.autograd.grad((ref["opd"] + ref["nca"]).sum(), [h_x, *ref_params], materialize_grads=True)

    weight = torch.nn.Parameter(w_s.detach().clone())
    head_bias = torch.nn.Parameter(b_s.detach().clone()) if bias else None
    teacher = torch.nn.Parameter(w_t.clone(), requires_grad=False)
    for p in (weight, head_bias, teacher):
        if p is not None:
            _partition(p)
    out = token_divergences(
        h_x, h_t, LMHead(weight, head_bias), LMHead(teacher), DivergenceSpec(), h_c=h_c, vocab_chunk=8
    )
    assert weight.numel() == 0  # partitioned again after the forward
    params = [weight] + ([head_bias] if bias else [])
    got = torch.autograd.grad((out["opd"] + out["nca"]).sum(), [h_x, *params])
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        FLOAT64.close(g, e)


class _FullSizeAllocations(TorchDispatchMode):
    """Counts the tensors of the given shapes that an operation allocates (views of their inputs are not counted)."""

    def __init__(self, *shapes):
        super().__init__()
        self.counts = {tuple(s): 0 for s in shapes}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in pytree.tree_leaves((args, kwargs)) if torch.is_tensor(t)}
        for t in pytree.tree_leaves(out):
            if torch.is_tensor(t) and tuple(t.shape) in self.counts and t.untyped_storage().data_ptr() not in inputs:
                self.counts[tuple(t.shape)] += 1
        return out


@pytest.mark.parametrize(
    "spec",
    [
        DivergenceSpec(),
        DivergenceSpec(beta=0.5, temperature=0.7, nca_stop_gradient=False),
        DivergenceSpec(top_k=5, renormalize=True, nca_divergence="symmetric_kl"),
    ],
    ids=["default", "jsd-no-stop-gradient", "top-k-renormalised"],
)
def test_zero3_head_is_gathered_once_per_pass(monkeypatch, spec):
    """3 token chunks x 7 vocabulary slices: the partitioned heads are gathered once for the forward and once for the
    backward, the weight and bias gradients are one buffer each (no full-size gradient per tile), and the gradients
    equal the full-logit reference."""
    entries = []

    def counting_gather(*params):
        entries.append(any(getattr(p, "ds_status", None) == "NOT_AVAILABLE" for p in params if p is not None))
        return _fake_gather(*params)

    monkeypatch.setattr("trl_nca.core.losses.maybe_gather_lm_head_ctx", counting_gather)
    h_x, h_c, h_t, w_s, w_t = _inputs()
    w_t = w_t.detach()
    b_s = torch.randn(w_s.shape[0], dtype=torch.float64, requires_grad=True)
    # The bias as one more weight column against a constant 1 in the hidden states: the reference has no bias.
    ones = torch.ones(h_x.shape[0], 1, dtype=torch.float64)
    wb = torch.cat([w_s, b_s[:, None]], 1)
    ref = reference(
        torch.cat([h_x, ones], 1),
        torch.cat([h_c, ones], 1),
        torch.cat([h_t, ones], 1),
        wb,
        torch.cat([w_t, torch.zeros_like(ones[:1].expand(w_t.shape[0], 1))], 1),
        spec,
    )
    weights = torch.linspace(0.5, 2.0, h_x.shape[0], dtype=torch.float64)
    expected = torch.autograd.grad(((ref["opd"] + 0.5 * ref["nca"]) * weights).sum(), (h_x, h_c, w_s, b_s))

    weight, bias = torch.nn.Parameter(w_s.detach().clone()), torch.nn.Parameter(b_s.detach().clone())
    teacher = torch.nn.Parameter(w_t.clone(), requires_grad=False)
    for p in (weight, bias, teacher):
        _partition(p)
    with _FullSizeAllocations(w_s.shape, b_s.shape) as forward:
        out = token_divergences(
            h_x, h_t, LMHead(weight, bias), LMHead(teacher), spec, h_c=h_c, vocab_chunk=8, token_chunk=3
        )
    assert entries == [True]
    loss = ((out["opd"] + 0.5 * out["nca"]) * weights).sum()
    with _FullSizeAllocations(w_s.shape, b_s.shape) as backward:
        got = torch.autograd.grad(loss, (h_x, h_c, weight, bias))
    assert entries == [True, True]
    assert forward.counts == {tuple(w_s.shape): 0, tuple(b_s.shape): 0}
    assert backward.counts == {tuple(w_s.shape): 1, tuple(b_s.shape): 1}
    for name in ("opd", "nca", "view_kl"):
        FLOAT64.close(out[name], ref[name])
    for g, e in zip(got, expected):
        FLOAT64.close(g, e)


def test_empty_completion_and_no_context_view():
    h_x, _, h_t, w_s, w_t = _inputs(n=0)
    out = token_divergences(h_x, h_t, LMHead(w_s), LMHead(w_t), DivergenceSpec())
    assert set(out) == {"opd"} and out["opd"].shape == (0,)
    out["opd"].sum().backward()  # a valid, zero gradient path


def test_bias_scale_and_softcap_match_reference():
    h_x, h_c, h_t, w_s, w_t = _inputs()
    bias = torch.randn(w_s.shape[0], dtype=torch.float64, requires_grad=True)
    head = LMHead(w_s, bias, scale=0.5, softcap=3.0)
    out = token_divergences(h_x, h_t, head, LMHead(w_t), DivergenceSpec(), h_c=h_c, vocab_chunk=10)

    def logits(h):
        return torch.tanh((h @ w_s.T + bias) * 0.5 / 3.0) * 3.0

    lx, lc, lt = F.log_softmax(logits(h_x), -1), F.log_softmax(logits(h_c), -1), F.log_softmax(h_t @ w_t.T, -1)
    opd = (lx.exp() * (lx - lt)).sum(-1)
    nca = (lx.detach().exp() * (lx.detach() - lc)).sum(-1)
    FLOAT64.close(out["opd"], opd)
    FLOAT64.close(out["nca"], nca)
    for o, r in itertools.product((out["opd"].sum() + out["nca"].sum(),), (opd.sum() + nca.sum(),)):
        for g, gr in zip(torch.autograd.grad(o, (bias, w_s)), torch.autograd.grad(r, (bias, w_s))):
            FLOAT64.close(g, gr)


@pytest.mark.parametrize("spec", SPECS[:5], ids=lambda s: str(s)[15:-1])
@pytest.mark.parametrize("wider", ["teacher", "student"])
def test_output_layers_of_different_sizes_use_the_common_rows(spec, wider):
    """Padded output layers (same tokenizer): the divergences run over the first min(V_s, V_t) rows, each
    distribution renormalised there; the student's rows past them get no gradient."""
    h_x, h_c, h_t, w_s, w_t = _inputs()
    padding = 5.0 + torch.randn(8, w_s.shape[1], dtype=torch.float64)  # rows that would dominate if they counted
    w_t = w_t.detach()
    if wider == "teacher":
        w_t = torch.cat([w_t, padding])
    else:
        w_s = torch.cat([w_s.detach(), padding]).requires_grad_()
    ref = reference(h_x, h_c, h_t, w_s[:53], w_t[:53], spec)
    out = token_divergences(h_x, h_t, LMHead(w_s), LMHead(w_t), spec, h_c=h_c, vocab_chunk=8, token_chunk=3)
    for name in ("opd", "nca", "view_kl"):
        FLOAT64.close(out[name], ref[name])
    for name in ("opd", "nca"):
        got = torch.autograd.grad(out[name].sum(), (h_x, h_c, w_s), allow_unused=True, retain_graph=True)
        expected = torch.autograd.grad(ref[name].sum(), (h_x, h_c, w_s), allow_unused=True, retain_graph=True)
        for g, r in zip(got, expected):
            if r is None or not r.abs().sum():
                assert g is None or not g.abs().sum()
            else:
                FLOAT64.close(g, r)
        if wider == "student":
            assert not got[2][53:].abs().sum()


@pytest.mark.parametrize("family", ["gemma2", "granite", "cohere"])
def test_lm_head_matches_the_models_own_logits(family):
    """Softcapping (Gemma2) and logit scaling (Granite divides, Cohere multiplies) are applied as the model does."""
    import transformers

    common = dict(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    config = {
        "gemma2": lambda: transformers.Gemma2Config(**common, final_logit_softcapping=3.0),
        "granite": lambda: transformers.GraniteConfig(**common, logits_scaling=4.0),
        "cohere": lambda: transformers.CohereConfig(**common, logit_scale=0.25),
    }[family]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, 97, (2, 5))
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state
        torch.testing.assert_close(
            LMHead.from_model(model).logits(hidden), model(input_ids=ids).logits.float()
        )  # float32: one matmul, two shapes


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("beta", [1.0, 0.0])
def test_teacher_known_by_its_top_k_equals_the_local_teachers_top_k(beta, renormalize):
    """A teacher given only as its top-k ids and log-probabilities (what a vLLM server returns: `TeacherTopK`) gives
    the terms and gradients of the same teacher's states on its own top-k support (`top_k_of="teacher"`)."""
    h_x, h_c, h_t, w_s, w_t = _inputs()
    w_t = w_t.detach()
    spec = DivergenceSpec(beta=beta, top_k=5, top_k_of="teacher", renormalize=renormalize, temperature=0.8)
    local = token_divergences(h_x, h_t, LMHead(w_s), LMHead(w_t), spec, h_c=h_c, vocab_chunk=8, token_chunk=3)
    full = torch.log_softmax(h_t @ w_t.T / spec.temperature, -1)
    top = full.topk(5, dim=-1)
    served = token_divergences(
        h_x, TeacherTopK(top.indices, top.values), LMHead(w_s), None, spec, h_c=h_c, vocab_chunk=8, token_chunk=3
    )
    for name in ("opd", "nca", "view_kl"):
        FLOAT64.close(served[name], local[name])
    for name in ("opd", "nca"):
        grads = torch.autograd.grad(served[name].sum(), (h_x, h_c, w_s), allow_unused=True, retain_graph=True)
        ref = torch.autograd.grad(local[name].sum(), (h_x, h_c, w_s), allow_unused=True, retain_graph=True)
        for g, r in zip(grads, ref):
            assert (g is None) == (r is None)
            if r is not None:
                FLOAT64.close(g, r)
