"""`plan_views`: which student views a batch runs, with gradient or not, on which random stream, whether a live
self-teacher may reuse the context view, and which terms, for each setting of the objective."""

import pytest

from trl_nca.trainers.objective import ViewPlan, plan_views


NCA_TERMS = ("opd", "nca", "view_kl")


def need_context(nca_active, nca_monitor, measure_gradients):
    """`NCAObjective.need_context`: what the trainers pass."""
    return nca_active or nca_monitor or measure_gradients


# (nca_active, nca_monitor, joint_forward, measure_gradients) -> (context, joint, context_grad, side_stream, reuse)
CASES = {
    "opd only": ((False, False, False, False), (False, False, False, False, False)),
    "opd only, joint forward set": ((False, False, True, False), (False, False, False, False, False)),
    "nca": ((True, False, False, False), (True, False, True, False, True)),
    "nca, joint forward": ((True, False, True, False), (True, True, True, False, True)),
    "nca, measuring": ((True, False, False, True), (True, False, True, False, True)),
    "nca_monitor": ((False, True, False, False), (True, False, False, False, True)),
    "nca_monitor, joint forward set": ((False, True, True, False), (True, False, False, False, True)),
    "nca_monitor, measuring": ((False, True, False, True), (True, False, True, False, True)),
    "measuring, nca off": ((False, False, False, True), (True, False, True, True, False)),
    "measuring, nca off, joint forward set": ((False, False, True, True), (True, False, True, True, False)),
}


@pytest.mark.parametrize("entropy", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_whole_batch_plan(case, entropy):
    (active, monitor, joint_forward, measure), (context, joint, grad, side, reuse) = CASES[case]
    plan = plan_views(active, monitor, joint_forward, need_context(active, monitor, measure), measure, entropy)
    terms = (NCA_TERMS if context else ("opd",)) + (("entropy",) if entropy else ())
    assert plan == ViewPlan(
        no_context=True,
        context=context,
        joint=joint,
        context_grad=grad,
        side_stream=side,
        teacher=True,
        teacher_reuses_context=reuse,
        terms=terms,
    )


def test_explicit_need_context_without_nca():
    """A caller asking for the context view with the NCA term, monitoring and measuring off (the tests' terms): it
    runs without gradient, on the main stream, and a live self-teacher may reuse it."""
    assert plan_views(False, False, False, True) == ViewPlan(True, True, False, False, False, True, True, NCA_TERMS)


@pytest.mark.parametrize("measure", [False, True])
@pytest.mark.parametrize("entropy", [False, True])
def test_halves_in_sequence(measure, entropy):
    """The no-context half: its view and the teacher, "opd"; the context half: its view with gradient, no teacher,
    "nca" and "view_kl". Neither runs jointly, on the side stream, or lets a teacher reuse the context view."""
    first = plan_views(True, False, False, True, measure, entropy, half="no_context")
    assert first == ViewPlan(
        True, False, False, False, False, True, False, ("opd",) + (("entropy",) if entropy else ())
    )
    second = plan_views(True, False, False, True, measure, entropy, half="context")
    assert second == ViewPlan(False, True, False, True, False, False, False, ("nca", "view_kl"))


def test_unknown_half():
    with pytest.raises(ValueError, match="half"):
        plan_views(True, False, False, True, half="both")
