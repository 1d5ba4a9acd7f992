"""``v05`` (issue 36 §1): a value prior V_0 fused with the group mean as the baseline.

METHODS.md's test idea by hand: n = 4, r̄ = .5, τ² = .0625, V_0 = .7 → w = .5, b = .6,
z = .57, the prior is kept. Then the controller: a rejected prior gets n more rollouts and w = 0;
the baseline reaches the advantages (they differ from GRPO's); τ² learns from groups of 16+.
"""

import pytest
import torch

from rollwise.control.v05 import V05, V05Config
from rollwise.optim.objective import ObjectiveConfig, assign_advantages
from rollwise.control.v05 import v05_baseline
from rollwise.optim.v05 import v05_advantages
from rollwise.types import Prompt, Rollout, RolloutGroup


def _group(pid, rewards):
    rs = [Rollout(pid, [1], [5], [0.0], [0], "stop", reward=r, score=r) for r in rewards]
    return RolloutGroup(Prompt(pid, "x"), rs)


def test_baseline_by_hand():
    b, w, stat, rejected = v05_baseline(0.5, 4, 0.7, 0.0625)
    assert (b, w, round(stat, 2), rejected) == (pytest.approx(0.6), pytest.approx(0.5), 0.57, False)
    # |.5 - .05| / sqrt(.0625 + 0) = 1.8 <= 1.96: kept; |.5 - 0| / .25 = 2.0 > 1.96: rejected, w = 0, b = r̄
    assert v05_baseline(0.5, 4, 0.05, 0.0)[3] is False
    b, w, _, rejected = v05_baseline(0.5, 4, 0.0, 0.0)
    assert rejected and w == 0.0 and b == 0.5
    # an all-failed group: p̃ = 1/(2n) keeps a variance, so the prior still moves the baseline
    b, w, _, _ = v05_baseline(0.0, 4, 0.3, 0.0625)
    var = (1 / 8) * (7 / 8) / 4
    assert w == pytest.approx(var / (var + 0.0625)) and b == pytest.approx(w * 0.3)


def test_advantages_subtract_the_baseline():
    rollouts = [Rollout("p", [1], [5], [0.0], [0], "stop", value_baseline=0.6) for _ in range(2)]
    adv = v05_advantages(rollouts, torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    assert adv.tolist() == pytest.approx([0.4, -0.6])


def test_controller_rejects_extends_and_sets_the_baseline():
    c = V05(V05Config(), num_generations=4)
    c.groups_seen, c.total = 1, 0.7  # earlier groups averaged .7: the running prior V_0 = .7
    keep, reject = _group("a", [1, 0, 1, 0]), _group("b", [0, 0, 0, 0])
    assert c.extend([keep, reject], None, 0) == [0, 4]  # |0 - .7| / sqrt(.0273 + .0625) = 2.34 > 1.96
    assert c.extend([keep, reject], None, 0) == [0, 0]  # one test per step
    reject.rollouts += _group("b", [1, 0, 0, 0]).rollouts  # the extend round merged in
    c.observe_step([keep, reject], None)
    assert [r.value_baseline for r in keep.rollouts] == [pytest.approx(0.6)] * 4  # w = .5: (.7 + .5) / 2
    assert [r.value_baseline for r in reject.rollouts] == [pytest.approx(1 / 8)] * 8  # w = 0: its own mean
    assert c.metrics()["control/v05_rejected"] == 1.0 and c.metrics()["control/v05_w"] == pytest.approx(0.25)
    # the step's outcomes become priors only afterwards; τ² waits for a group of 16
    assert c.prior(keep) == pytest.approx(0.5) and c.tau2 == 0.0625
    state = c.state_dict()
    again = V05(V05Config(), num_generations=4)
    again.load_state_dict(state)
    assert again.prior(keep) == c.prior(keep) and again.groups_seen == 3


def test_tau2_is_the_running_mean_over_groups_of_16():
    c = V05(V05Config(), num_generations=16)
    c.groups_seen, c.total = 1, 0.5
    c.step = 0
    g = _group("a", [1.0] * 4 + [0.0] * 12)  # r̄ = .25 against V_0 = .5
    c.extend([g], None, 0)
    c.observe_step([g], None)
    assert c.tau2 == pytest.approx(0.0625)  # (.5 - .25)²


def test_v05_advantages_differ_from_grpo():
    c = V05(V05Config(), num_generations=4)
    c.groups_seen, c.total = 1, 0.7
    g, base = _group("a", [1, 0, 1, 0]), _group("a", [1, 0, 1, 0])
    c.extend([g], None, 0)
    c.observe_step([g], None)
    cfg = ObjectiveConfig(method="v05")
    assert cfg.advantage == "v05" and cfg.scale_rewards == "none"
    assign_advantages([g], cfg)
    assign_advantages([base], ObjectiveConfig(method="grpo", scale_rewards="none"))
    assert [r.advantage[0] for r in g.rollouts] == pytest.approx([0.4, -0.6, 0.4, -0.6])
    assert [r.advantage[0] for r in base.rollouts] == pytest.approx([0.5, -0.5, 0.5, -0.5])


def test_v05_is_one_config_line_and_an_arm():
    from rollwise.bench.ablate import default_arms
    from rollwise.train.config import load_run_config

    cfg = load_run_config(None, ["objective.method=v05"])
    assert cfg.control.method == "v05" and cfg.objective.advantage == "v05"
    assert "objective:v05" in default_arms()
