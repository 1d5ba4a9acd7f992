"""One definition of "no signal" (``rollwise.types.is_zero_signal``): dynamic sampling's accept,
the advantage estimators, the update's row skipping and replay's store agree on every group —
including the boundary cases where dynamic sampling's old absolute tolerance (population
std > 1e-6) and the optimizer's relative one (Bessel std <= 1e-6·max(1, |mean|)) disagreed."""

import math

import pytest
import torch

from rollwise.control.dynamic_sampling import DynamicSampling, DynamicSamplingConfig
from rollwise.optim.advantages import is_zero_signal as optim_is_zero_signal
from rollwise.optim.advantages import no_spread
from rollwise.optim.batch import build_batch
from rollwise.optim.objective import ObjectiveConfig, assign_advantages
from rollwise.optim.update import rows_with_signal
from rollwise.replay.rollout_replay import has_signal
from rollwise.types import Prompt, Rollout, RolloutGroup, is_zero_signal


def group(rewards: list[float]) -> RolloutGroup:
    rollouts = [Rollout("p", [1, 2], [5, 6, 7], [-0.5] * 3, [0] * 3, "stop", reward=r, score=r) for r in rewards]
    return RolloutGroup(Prompt("p", "x"), rollouts)


def old_dynamic_informative(rewards):  # dynamic_sampling.py before: population std > 1e-6, absolute
    mean = sum(rewards) / len(rewards)
    return math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) > 1e-6


# [10, 10 + 1e-5]: population std 5e-6 > 1e-6 (old dynamic sampling kept it) but Bessel std 7.1e-6
#   <= 1e-5 relative (the optimizer gave it advantage 0): a kept group that trained nothing.
# [0, 1.6e-6]: population std 8e-7 <= 1e-6 (old dynamic sampling dropped it) but Bessel std 1.13e-6
#   > 1e-6 (the optimizer trained it at advantage ±.707): a dropped group that had a signal.
BOUNDARY = [([10.0, 10.0 + 1e-5], True), ([0.0, 1.6e-6], False)]
CASES = BOUNDARY + [([0.0, 1.0, 0.0], False), ([1.0, 1.0, 1.0], True), ([0.3, 0.3 + 1e-9], True), ([1.0], True),
                    ([1e6, 1e6 + 0.5], True), ([1e6, 1e6 + 10.0], False)]


@pytest.mark.parametrize("rewards, zero", BOUNDARY)
def test_the_boundary_cases_are_where_the_old_definitions_disagreed(rewards, zero):
    """The precondition: these groups really split the two old rules."""
    optimizer_zero = bool(no_spread(torch.tensor(rewards, dtype=torch.float64), torch.zeros(len(rewards))).all())
    assert optimizer_zero == zero
    assert old_dynamic_informative(rewards) == zero  # the old accept said the opposite of "no signal"


@pytest.mark.parametrize("rewards, zero", CASES)
def test_every_stage_agrees_on_no_signal(rewards, zero):
    assert is_zero_signal(rewards) is zero
    assert optim_is_zero_signal is is_zero_signal  # the optimizer's name is the same function
    g = group(rewards)
    assert DynamicSampling(DynamicSamplingConfig()).accept(g) is (not zero)
    metrics = assign_advantages([g], ObjectiveConfig(method="grpo"))
    assert metrics["groups/zero_signal"] == float(zero)
    trains = any(a != 0 for r in g.rollouts for a in r.advantage)
    assert trains is (not zero)
    assert has_signal(g) is (not zero)  # replay stores exactly the groups with signal
    batch = build_batch([g], pad_token_id=0)
    assert bool(rows_with_signal(batch).any()) is (not zero)  # the update runs exactly those rows


@pytest.mark.parametrize("method", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "mc_grpo"])
def test_every_estimator_zeroes_exactly_the_no_signal_groups(method):
    groups = [group(r) for r, _ in CASES if len(r) > 1]
    assign_advantages(groups, ObjectiveConfig(method=method))
    for g in groups:
        assert all(a == 0 for r in g.rollouts for a in r.advantage) is is_zero_signal(g.rewards), g.rewards
