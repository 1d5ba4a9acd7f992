"""Group-relative advantage estimators: pure functions of reward tensors.

- ``grpo``: A = (r − mean_group) / (std + 1e-6) — DeepSeekMath, "Pushing the Limits of
  Mathematical Reasoning in Open Language Models" (Shao et al., 2024).
- ``dr_grpo``: the same centring, with ``scale_rewards`` choosing the divisor: ``group``
  (GRPO), ``batch`` (one std over the whole batch) or ``none`` (mean-centring only) —
  "Understanding R1-Zero-Like Training: A Critical Perspective" (Liu et al., 2025).

- ``tree_adv``: advantages for tree rollouts (TreePO, "TreePO: Bridging the Gap of Policy
  Optimization and Efficacy and Inference Efficiency with Heuristic Tree-based Modeling",
  2025; the blend as in PORTool and TreePS-RAG): a node's value V(n) is the mean
  reward of the leaves below it; the trajectory (global) term is V(n) − V(root), the fork
  (local) term V(n) − V(parent); A(n) = (1 − mix)·global + mix·local, ``mix`` = 0.5 by
  default. A leaf's global term is r − mean(leaves), GRPO's centring. Our departure: the
  same ``scale_rewards`` divisor as flat groups (group std of the leaf rewards, batch std,
  or none) so tree and group runs share a learning rate.

- ``rloo``: A_i = r_i − mean_{j≠i} r_j, the leave-one-out baseline ("Buy 4 REINFORCE Samples,
  Get a Baseline for Free!", Kool et al., 2019; "Back to Basics: Revisiting REINFORCE Style
  Optimization for Learning from Human Feedback in LLMs", Ahmadian et al., 2024).
- ``reinforce_pp``: REINFORCE++-baseline ("REINFORCE++: A Simple and Efficient Approach for
  Aligning Large Language Models", Hu, 2025): subtract the group mean, then whiten over every
  token of the batch (OpenRLHF's masked whitening: each rollout's value counts once per token).
- ``median``: MC-GRPO ("MC-GRPO: Median-Centered GRPO for small-rollout RL"): A = r − median
  of the group; the first rollout equal to the median is the pivot, with advantage 0 and no
  gradient (sample G+1 to train on G). No std scaling.
- ``drpo``: DRPO ("Decoupled Reward Policy Optimization"): with p = |P|/G the share of correct
  rollouts, wrong ones get −p and correct ones (1 − p)·|P|·softmax_P(−|y|/mean_P|y|), so a long
  correct answer is never pushed below zero by a length preference and Σ A = 0.

- ``gigpo``: GiGPO ("Group-in-Group Policy Optimization for LLM Agent Training", Feng et al.,
  2025) for multi-turn episodes: A = A^E + A^S. A^E is GRPO over the episodes' rewards; A^S
  z-scores a turn's discounted return R_t = r_t + γ·R_{t+1} among the turns of the same group
  taken from the same anchor state (an environment-given key; groups of ≥ 2, else 0). The
  paper puts the episode's final reward on its last step; we add ``Rollout.reward`` (the
  verifiers' total) to the last turn's step reward, so R_{T-1} = r_{T-1} + reward. Our
  departures: A^E is computed from ``Rollout.reward`` alone (the paper's episode return is the
  sum of its step rewards: the same when step rewards are 0), and follows ``scale_rewards``;
  A^S always divides by the anchor group's Bessel std + 1e-6 (Eq. 7 with F_norm = std; the
  authors' verl-agent code also offers mean-centring only, ``mode: mean_norm``); ω = 1; no
  similarity-based grouping (states group only when their keys are equal). A^S is the one
  term that can move a group whose episode rewards are all equal (step rewards, or γ
  favouring the shorter path to the same reward).

std is Bessel-corrected (METHODS.md conventions); a group of one has std 0 and advantage 0.
Statistics are computed in float64, and a group whose rewards do not spread (std at most
``ZERO_STD`` relative to the rewards' magnitude: equal rewards, up to rounding) gets exactly
zero advantage from every group-centred estimator (GiGPO's A^E included), whatever the dtype
of the rewards: dividing a mean's rounding error by ``std + eps`` would otherwise turn "no
signal" into a large advantage (float32 rewards of 0.7 × 8 gave 0.056 per rollout).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from rollwise.types import ZERO_STD, is_correct, is_zero_signal  # noqa: F401 (re-exported)

ScaleRewards = Literal["group", "batch", "none"]
EPS = 1e-6


def _out_dtype(rewards: torch.Tensor) -> torch.dtype:
    return rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()


def group_stats(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample mean and Bessel-corrected std of its group, in float64. rewards, group_ids: [N]."""
    groups, inverse = torch.unique(group_ids, return_inverse=True)
    rewards = rewards.double()
    zeros = torch.zeros(len(groups), dtype=rewards.dtype, device=rewards.device)
    count = zeros.index_add(0, inverse, torch.ones_like(rewards))
    mean = (zeros.index_add(0, inverse, rewards) / count)[inverse]
    sq = zeros.index_add(0, inverse, (rewards - mean) ** 2)
    var = sq / (count - 1).clamp(min=1)
    return mean, var.sqrt()[inverse]


def no_spread(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """[N] bool: the sample's group has no reward spread — ``rollwise.types.is_zero_signal`` of
    its group's rewards (the one definition dynamic sampling and replay use too).

    >>> no_spread(torch.tensor([3.0034791813909303] * 3 + [1., 0]), torch.tensor([0, 0, 0, 1, 1]))
    tensor([ True,  True,  True, False, False])
    """
    out = torch.zeros(len(rewards), dtype=torch.bool, device=rewards.device)
    for ix in _groups(group_ids):
        out[ix.to(rewards.device)] = is_zero_signal(rewards[ix.to(rewards.device)].double().tolist())
    return out


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, scale_rewards: ScaleRewards = "group"):
    """Advantages [N] for rewards [N] whose group membership is group_ids [N].

    >>> group_advantages(torch.tensor([1., 0, 0, 0]), torch.zeros(4, dtype=torch.long))
    tensor([ 1.5000, -0.5000, -0.5000, -0.5000])
    """
    mean, _ = group_stats(rewards, group_ids)
    adv = (rewards.double() - mean) / reward_scale(rewards, group_ids, scale_rewards)
    return adv.masked_fill(no_spread(rewards, group_ids), 0.0).to(_out_dtype(rewards))


def reward_scale(rewards: torch.Tensor, group_ids: torch.Tensor, scale_rewards: ScaleRewards) -> torch.Tensor:
    """The divisor [N] (float64) of each sample's centred reward: group std + eps, batch std + eps, or 1."""
    rewards = rewards.double()
    if scale_rewards == "group":
        return group_stats(rewards, group_ids)[1] + EPS
    if scale_rewards == "batch":
        # one sample has no spread: an infinite divisor gives it advantage 0
        std = rewards.std() if rewards.numel() > 1 else torch.tensor(float("inf"), dtype=torch.float64)
        return torch.full_like(rewards, float(std) + EPS)
    if scale_rewards == "none":
        return torch.ones_like(rewards)
    raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")


def tree_node_advantages(parents: dict[int, int | None], leaf_nodes: list[int], rewards: list[float],
                         mix: float = 0.5) -> dict[int, float]:
    """Unscaled ``tree_adv`` advantage of every node that has a leaf below it (the root gets none).

    ``parents`` maps node id → parent id (None for the root); ``leaf_nodes[i]`` is the leaf
    node of the rollout with reward ``rewards[i]``.

    >>> parents = {0: None, 1: 0, 2: 0, 3: 1, 4: 1, 5: 2, 6: 2}
    >>> adv = tree_node_advantages(parents, [3, 4, 5, 6], [1, 1, 0, 1])
    >>> [adv[n] for n in (1, 2, 5, 6)]
    [0.25, -0.25, -0.625, 0.375]
    """
    if is_zero_signal(list(rewards)):  # equal leaf rewards: no node is better than another
        return {n: 0.0 for leaf in leaf_nodes for n in _path(parents, leaf) if parents[n] is not None}
    total: dict[int, float] = {}
    count: dict[int, int] = {}
    for leaf, r in zip(leaf_nodes, rewards):
        node = leaf
        while node is not None:
            total[node] = total.get(node, 0.0) + float(r)
            count[node] = count.get(node, 0) + 1
            node = parents[node]
    value = {n: total[n] / count[n] for n in total}
    root = next(n for n, p in parents.items() if p is None)
    return {n: (1 - mix) * (v - value[root]) + mix * (v - value[parents[n]])
            for n, v in value.items() if n != root}


def as_correct(values: torch.Tensor) -> torch.Tensor:
    """[N] bool: a bool tensor as is; scores judged by ``rollwise.types.is_correct``."""
    if values.dtype == torch.bool:
        return values
    return torch.tensor([is_correct(float(v)) for v in values], dtype=torch.bool)


def _path(parents: dict[int, int | None], node: int | None) -> list[int]:
    out = []
    while node is not None:
        out.append(node)
        node = parents[node]
    return out


def _groups(group_ids: torch.Tensor) -> list[torch.Tensor]:
    """Indices of each group's members, in order of first appearance."""
    seen: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids.tolist()):
        seen.setdefault(g, []).append(i)
    return [torch.tensor(ix, dtype=torch.long) for ix in seen.values()]


def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """A_i = r_i − mean of the other members of its group (0 in a group of one).

    >>> rloo_advantages(torch.tensor([1., 0, 0, 0]), torch.zeros(4, dtype=torch.long))
    tensor([ 1.0000, -0.3333, -0.3333, -0.3333])
    """
    out = torch.zeros(len(rewards), dtype=torch.float64)
    for ix in _groups(group_ids):
        r = rewards[ix].double()
        if len(ix) > 1:
            out[ix] = r - (r.sum() - r) / (len(ix) - 1)
    return out.masked_fill(no_spread(rewards, group_ids), 0.0).to(torch.get_default_dtype())


def reinforce_pp_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, token_counts: torch.Tensor) -> torch.Tensor:
    """Group-mean-centred rewards whitened over the batch's tokens (mean and Bessel std, each
    rollout weighted by its ``token_counts``).

    >>> reinforce_pp_advantages(torch.tensor([1., 0, 1, 1]), torch.tensor([0, 0, 1, 1]), torch.ones(4))
    tensor([ 1.2247, -1.2247,  0.0000,  0.0000])
    """
    mean, _ = group_stats(rewards, group_ids)
    centred = (rewards.double() - mean).masked_fill(no_spread(rewards, group_ids), 0.0)  # no rounding noise
    w = token_counts.double()
    n = w.sum()
    if n < 2:
        return torch.zeros_like(centred).to(torch.get_default_dtype())
    mu = (centred * w).sum() / n
    var = (w * (centred - mu) ** 2).sum() / (n - 1)
    return ((centred - mu) / (var.sqrt() + EPS)).to(torch.get_default_dtype())


def median_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(A = r − group median, pivot [N] bool): the first member equal to the median is the pivot.

    >>> median_advantages(torch.tensor([.2, .9, .4]), torch.zeros(3, dtype=torch.long))
    (tensor([-0.2000,  0.5000,  0.0000]), tensor([False, False,  True]))
    """
    out = torch.zeros_like(rewards, dtype=torch.get_default_dtype())
    pivot = torch.zeros(len(rewards), dtype=torch.bool)
    for ix in _groups(group_ids):
        r = rewards[ix].double()
        med = r.median()  # the lower middle value: always one of the samples
        out[ix] = (r - med).to(out.dtype)
        pivot[ix[int((r == med).nonzero()[0])]] = True
    return out.masked_fill(no_spread(rewards, group_ids), 0.0), pivot  # rounding-level spread is no signal


def drpo_advantages(correct: torch.Tensor, lengths: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """DRPO's decoupled advantages; ``correct`` [N] bool (float scores are judged by ``is_correct``).

    >>> drpo_advantages(torch.tensor([True, True, False]), torch.tensor([100., 300, 50]), torch.zeros(3, dtype=torch.long))
    tensor([ 0.4874,  0.1793, -0.6667])
    """
    correct_all = as_correct(correct)
    out = torch.zeros(len(correct_all), dtype=torch.float64)
    for ix in _groups(group_ids):
        correct = correct_all[ix]
        n_pos, size = int(correct.sum()), len(ix)
        if n_pos in (0, size):  # all wrong or all right: no signal
            continue
        p = n_pos / size
        out[ix[~correct]] = -p
        pos_len = lengths[ix][correct].double()
        mean_len = pos_len.mean()
        # empty correct completions (mean length 0) share the positive mass equally instead of 0/0
        logits = -pos_len / mean_len if mean_len > 0 else torch.zeros_like(pos_len)
        out[ix[correct]] = (1 - p) * n_pos * torch.softmax(logits, 0)
    return out.to(torch.get_default_dtype())


def discounted_returns(step_rewards: list[float], final_reward: float, gamma: float) -> list[float]:
    """GiGPO's per-turn returns R_t = r_t + γ·R_{t+1}, the episode's ``final_reward`` added to the
    last turn's step reward: R_{T-1} = r_{T-1} + final_reward.

    >>> discounted_returns([0.0, -0.25, 0.0], 1.0, 0.5)
    [0.125, 0.25, 1.0]
    """
    returns = [float(r) for r in step_rewards]
    if returns:
        returns[-1] += float(final_reward)
    for t in range(len(returns) - 2, -1, -1):
        returns[t] += gamma * returns[t + 1]
    return returns


def anchor_advantages(returns: list[float], states: list[str | None]) -> list[float]:
    """GiGPO's A^S: each return z-scored (Bessel std + 1e-6) among the returns with the same state
    key; 0 where the key is None, is met once, or its returns do not spread (``is_zero_signal``).

    >>> [round(a, 4) for a in anchor_advantages([1.0, 0.0, 5.0, 2.0], ["s", "s", "t", None])]
    [0.7071, -0.7071, 0.0, 0.0]
    """
    members: dict[str, list[int]] = {}
    for i, s in enumerate(states):
        if s is not None:
            members.setdefault(s, []).append(i)
    out = [0.0] * len(returns)
    for ix in members.values():
        values = [float(returns[i]) for i in ix]
        if is_zero_signal(values):  # a state met once, or equal returns: no action was better
            continue
        mean = math.fsum(values) / len(values)
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
        for i, v in zip(ix, values):
            out[i] = (v - mean) / (std + EPS)
    return out


def gigpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, turn_rewards: list[list[float] | None],
                     turn_states: list[list[str | None] | None], gamma: float = 0.95,
                     scale_rewards: ScaleRewards = "group") -> tuple[torch.Tensor, list[list[float] | None]]:
    """(A^E [N], A^S per turn): GiGPO's two terms for episodes with rewards [N] in groups group_ids [N].

    ``turn_rewards[i]`` / ``turn_states[i]`` are episode i's step rewards and anchor-state keys,
    one per turn (None: a single completion, no step term). A turn's advantage is A^E[i] +
    A^S[i][t]; anchor groups form within a group only.

    >>> ep, step = gigpo_advantages(torch.tensor([1., 0]), torch.zeros(2, dtype=torch.long),
    ...                             [[0., 0.], [0., 0.]], [["s0", "a"], ["s0", "b"]], gamma=0.5)
    >>> ep, [[round(a, 4) for a in s] for s in step]
    (tensor([ 0.7071, -0.7071]), [[0.7071, 0.0], [-0.7071, 0.0]])
    """
    episode = group_advantages(rewards, group_ids, scale_rewards)
    step: list[list[float] | None] = [None] * len(rewards)
    for ix in _groups(group_ids):
        flat_returns: list[float] = []
        flat_states: list[str | None] = []
        for i in ix.tolist():
            if turn_rewards[i] is not None:
                flat_returns += discounted_returns(turn_rewards[i], float(rewards[i]), gamma)
                flat_states += list(turn_states[i])
        flat = iter(anchor_advantages(flat_returns, flat_states))
        for i in ix.tolist():
            if turn_rewards[i] is not None:
                step[i] = [next(flat) for _ in turn_rewards[i]]
    return episode, step
