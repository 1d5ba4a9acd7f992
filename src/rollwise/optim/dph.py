"""``dph_rl``: a mass-covering divergence to the initial policy, from a pool of its own samples.

DPH-RL, "The Choice of Divergence: A Neglected Key to Mitigating Diversity Collapse in RLVR"
(2025): reverse KL(π_θ‖π_ref) — or none — lets the policy drop modes of the initial policy π_0
(pass@k falls while pass@1 rises). Mass-covering f-divergences (forward KL, JS) to π_0 act as
rehearsal: they keep probability on what π_0 could do. They are computed from samples of π_0, so
no reference model runs online.

The rule (METHODS.md's choice): a pool D_0 of completions sampled by π_0; each update adds
coef·(−mean over D_0 of the length-normalised log-likelihood ℓ^θ(y|x)/|y|), coef = .05. Its
gradient is that of KL(π_0‖π_θ) = E_{π_0}[log π_0 − log π_θ] (the first term has no θ); no
reference model is loaded.

How it runs: the pool is the run's first rollouts whose every token version 0 sampled (the first
batch is a sample of π_0; ``objective.dph_pool`` of them), so it costs no extra generation. Each
optimizer pass adds the term's gradient over ``objective.dph_batch`` pool items (drawn with the
step's seed) to the policy-gradient one before clipping and the step (``Rehearsal`` wraps the
optimizer: ``zero_grad`` puts the term's gradient in). ``dph/rehearsal_nll`` logs the term's
mean per-token NLL.

Where we depart: forward KL only (the paper also studies JS and others); the pool is the first
batch's rollouts rather than a separate pre-sampling pass, so its size is bounded by what version
0 sampled (``dph/pool`` logs it); the checkpoint keeps the pool (``dph_pool.pt``): a resumed run rehearses the same one. The effect on diversity (pass@k) needs a bigger model and longer runs.
"""

from __future__ import annotations

import random
from contextlib import nullcontext

import torch

from rollwise.model.logprobs import token_logprobs_and_entropy
from rollwise.optim.auxiliary import AuxiliaryTerm
from rollwise.types import RolloutGroup


def forward_kl(p0: torch.Tensor, p: torch.Tensor) -> float:
    """KL(π_0‖π_θ) = Σ π_0 log(π_0/π_θ) of two categorical distributions.

    >>> round(forward_kl(torch.tensor([.5, .5]), torch.tensor([.7, .3])), 4)
    0.0872
    """
    p0, p = p0.double(), p.double()
    keep = p0 > 0
    return float((p0[keep] * (p0[keep] / p[keep]).log()).sum())


def extend_pool(pool: list[tuple[list[int], list[int]]], groups: list[RolloutGroup], size: int) -> None:
    """Add the (prompt ids, completion ids) of rollouts sampled entirely by version 0, up to ``size``."""
    for g in groups:
        for r in g.rollouts:
            if len(pool) >= size:
                return
            if r.completion_ids and r.failure is None and r.segments is None and set(r.versions) == {0}:
                pool.append((list(r.prompt_ids), list(r.completion_ids)))


def rehearsal_nll(model, items: list[tuple[list[int], list[int]]], sampling: dict, pad_token_id: int) -> torch.Tensor:
    """−mean over ``items`` of Σ_t ℓ^θ/|y| (with gradient): the forward-KL term before its coefficient."""
    width = max(len(p) + len(c) for p, c in items)
    ids = torch.full((len(items), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    scored = torch.zeros((len(items), width - 1))
    for i, (p, c) in enumerate(items):
        ids[i, : len(p) + len(c)], mask[i, : len(p) + len(c)] = torch.tensor(p + c), 1
        scored[i, len(p) - 1 : len(p) - 1 + len(c)] = 1.0 / len(c)  # length-normalised
    device = next(model.parameters()).device
    lp, _ = token_logprobs_and_entropy(model, ids.to(device), mask.to(device), with_entropy=False, **sampling)
    return -(lp * scored.to(device)).sum() / len(items)


class Rehearsal(AuxiliaryTerm):
    """An optimizer whose ``zero_grad`` leaves the rehearsal term's gradient (coef · ``rehearsal_nll`` on
    ``items``) in place of zeros, so every pass's step includes it; the rest is the wrapped optimizer's."""

    def __init__(self, optimizer, model, items, coef: float, sampling: dict, pad_token_id: int,
                 context=nullcontext) -> None:
        super().__init__(optimizer, lambda: rehearsal_nll(model, items, sampling, pad_token_id) if items else None,
                         coef, "dph/rehearsal_nll", context)


def draw(pool: list, k: int, seed: int) -> list:
    """``k`` pool items drawn without replacement by ``seed`` (all of them when the pool is smaller)."""
    return random.Random(seed).sample(pool, min(k, len(pool)))


def step_optimizer(pool: list, groups: list[RolloutGroup], optimizer, model, objective, seed: int, sampling: dict,
                   pad_token_id: int, context=nullcontext):
    """This step's optimizer: ``optimizer`` itself without the term (``objective.dph_coef`` 0), else the pool
    extended by the step's version-0 rollouts and a ``Rehearsal`` over ``dph_batch`` items of it."""
    if objective.dph_coef <= 0:
        return optimizer
    extend_pool(pool, groups, objective.dph_pool)
    return Rehearsal(optimizer, model, draw(pool, objective.dph_batch, seed), objective.dph_coef, sampling,
                     pad_token_id, context)
