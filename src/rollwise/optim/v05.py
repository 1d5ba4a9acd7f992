"""``v05``: a value prior fused with a few rollouts' mean as the advantage baseline (V_{0.5}).

V_{0.5}, "Generalist Value Model as a Prior for Sparse RL Rollouts": the baseline adaptively
fuses a pretrained generalist value model's prediction V_0 (no synchronous updates) with the
empirical mean of a few rollouts, to minimise the baseline's MSE; a real-time hypothesis test
adds rollouts when the prior looks unreliable.

The rule (``rollwise.control.v05.v05_baseline``, the controller's; METHODS.md's choices), for a group of n rewards with mean r̄:

- σ² = p̃(1 − p̃), w = (σ²/n) / (σ²/n + τ²), b = w·V_0 + (1 − w)·r̄;
- τ² is the running mean of (V_0 − r̄)² over groups with n ≥ 16 (``control.v05``);
- if |r̄ − V_0| > 1.96·sqrt(σ²/n + τ²) the prior is rejected: w = 0 and the group gets n more
  rollouts (the controller's extend round);
- the advantage is A_i = r_i − b (``v05_advantages``; no std scaling), so a group whose
  rollouts all failed still trains when the prior expected some to succeed.

p̃ is r̄ clipped to [1/(2n), 1 − 1/(2n)] (our choice: the paper's variance would be 0 for an
all-equal group, which would make w = 0 exactly where a prior helps most).

Where we depart: the paper's V_0 is a pretrained generalist value model; it is not available
here. V_0 is pluggable (``control.v05.prior``): by default the prompt's own mean reward when it
was seen in an earlier step, else the running mean reward over earlier groups — a stand-in that
carries no knowledge of a new prompt. Its effect (stable training at group size 4 on hard math)
needs that model, or one of your own (``package.module:function``), and a bigger policy.
"""

from __future__ import annotations

import torch


def v05_advantages(rollouts, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """A_i = r_i − b of its group: ``Rollout.value_baseline`` (set by the v05 controller), else the group
    mean (a group the controller did not see: GRPO without std scaling).

    >>> from types import SimpleNamespace as R
    >>> v05_advantages([R(value_baseline=.6)] * 2, torch.tensor([1., 0.]), torch.tensor([0, 0]))
    tensor([ 0.4000, -0.6000])
    """
    out = torch.empty_like(rewards, dtype=torch.float64)
    for g in group_ids.unique():
        idx = (group_ids == g).nonzero().flatten()
        known = [rollouts[i].value_baseline for i in idx.tolist() if rollouts[i].value_baseline is not None]
        b = known[0] if known else float(rewards[idx].double().mean())
        out[idx] = rewards[idx].double() - b
    return out
