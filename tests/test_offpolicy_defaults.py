"""Off-policy correction by default (issue 22, "Method defaults").

Before: every run defaulted to ``tis_mode: sequence_mask``, a 0/1 filter. With one optimizer
pass the ratio is 1, so a replayed or async-stale sequence whose Π w stayed inside [0, 3]
trained at weight 1 — exactly as with ``tis_mode: none`` — while ``rollwise list objectives``
said "off-policy: yes" for every preset. Now a run that trains stale tokens (async k >= 1,
replay, APRIL) defaults to ``token_truncate`` (cap 2, decoupled PPO) unless the recipe or its
preset chose a mode, replay with ``tis_mode: none`` is a ConfigError, and the listing says
which presets weight stale tokens.
"""

import copy
import math

import pytest
import torch

from rollwise.config import ConfigError
from rollwise.optim.batch import build_batch
from rollwise.optim.correction import behavior_weights
from rollwise.optim.losses import token_weights
from rollwise.optim.objective import ObjectiveConfig, assign_advantages, policy_loss
from rollwise.optim.update import UpdateSpec, _logprobs_no_grad, policy_update
from rollwise.replay import ReplayConfig, check_composition
from rollwise.train.config import load_run_config
from rollwise.types import Prompt, Rollout, RolloutGroup


def objective(*sets) -> ObjectiveConfig:
    return load_run_config(None, list(sets)).objective


# -- the resolved defaults --------------------------------------------------------------------
STALE = [["train.mode=async"], ["train.mode=async", "train.max_staleness=2"], ["replay.method=rollout_replay"],
         ["replay.method=remix"], ["replay.method=rorecomp"], ["rollout.strategy=april"]]
FRESH = [[], ["train.mode=async", "train.max_staleness=0"], ["replay.method=rollout_replay",
                                                             "replay.rollout_replay.share=0"],
         ["replay.method=remix", "replay.remix.share=0"]]


@pytest.mark.parametrize("sets", STALE, ids=lambda s: " ".join(s))
def test_stale_runs_default_to_a_truncated_importance_weight(sets):
    o = objective(*sets)
    assert (o.tis_mode, o.tis_cap) == ("token_truncate", 2.0) and o.corrects_off_policy


@pytest.mark.parametrize("sets", FRESH, ids=lambda s: " ".join(s) or "sync")
def test_on_policy_runs_keep_the_sync_default(sets):
    o = objective(*sets)
    assert (o.tis_mode, o.tis_cap) == ("sequence_mask", 3.0) and not o.corrects_off_policy


def test_explicit_settings_win():
    assert objective("train.mode=async", "objective.tis_mode=sequence_mask").tis_mode == "sequence_mask"
    assert objective("train.mode=async", "objective.tis_mode=none", "train.max_staleness=0").tis_mode == "none"
    assert objective("replay.method=remix", "objective.tis_cap=1.5").tis_cap == 1.5  # the mode filled, the cap kept
    o = objective("replay.method=remix", "objective.method=decoupled_ppo")  # the preset's own choice
    assert (o.tis_mode, o.tis_cap) == ("token_truncate", 2.0)
    o = objective("replay.method=remix")  # remix's other fills survive next to the correction
    assert o.tis_mode == "token_truncate" and o.beta == o.prox_kl_coef == 0.02


def test_sequence_mask_is_not_an_off_policy_correction():
    assert not ObjectiveConfig(tis_mode="sequence_mask").corrects_off_policy
    assert not ObjectiveConfig(tis_mode="none").corrects_off_policy
    for mode in ("token_truncate", "token_mask", "sequence_truncate"):
        assert ObjectiveConfig(tis_mode=mode).corrects_off_policy


# -- replay with tis_mode: none ---------------------------------------------------------------
def test_replay_without_correction_is_a_config_error():
    cfg = load_run_config(None, ["replay.method=rollout_replay", "objective.tis_mode=none"])
    with pytest.raises(ConfigError, match=r"objective.tis_mode=none.*token_truncate"):
        check_composition(cfg.replay, cfg.rollout, cfg.objective)
    off = load_run_config(None, ["replay.method=rollout_replay", "replay.rollout_replay.share=0",
                                 "objective.tis_mode=none"])
    check_composition(off.replay, off.rollout, off.objective)  # share 0 replays nothing: on-policy, allowed
    check_composition(ReplayConfig(method="remix"), off.rollout, objective("replay.method=remix"))


def test_the_trainer_refuses_replay_without_correction(tmp_path):
    from rollwise.train.loop import Trainer

    cfg = load_run_config(None, [f"output_dir={tmp_path}", "model.threads=1", "replay.method=remix",
                                 "objective.tis_mode=none"])
    with pytest.raises(ConfigError, match="replay.method=remix"):
        Trainer(cfg)


# -- rollwise list objectives -----------------------------------------------------------------
def test_list_objectives_says_where_stale_tokens_are_weighted(monkeypatch):
    from rollwise.cli import _off_policy_note
    from rollwise.optim import objective as objective_module

    assert _off_policy_note("decoupled_ppo") == "off-policy: yes, tis_mode=token_truncate"
    assert "in async/replay/april runs; sequence_mask in sync" in _off_policy_note("grpo")
    # a preset that chose the 0/1 mask itself is not an off-policy correction, and is listed so
    monkeypatch.setitem(objective_module.PRESETS, "grpo", {"tis_mode": "sequence_mask"})
    assert _off_policy_note("grpo").startswith("off-policy: no")


# -- the weights on a mixed batch, one optimizer pass ------------------------------------------
def _groups(tok):
    ids = list(range(4, 30))
    groups = []
    for gi, rewards in enumerate([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0]]):
        rollouts = [Rollout("p", ids[gi : gi + 3], ids[gi + j : gi + j + 4 + j], [0.0] * (4 + j), [0] * (4 + j), "stop",
                            reward=r, score=r) for j, r in enumerate(rewards)]
        groups.append(RolloutGroup(Prompt(f"p{gi}", "x"), rollouts))
    return groups


def mixed_batch(model, tok):
    """Group 0 fresh (behaviour = the current policy), group 1 stale: sampled by an older policy
    whose log-probs differ by ±.4 per token, and by −1 on one token (w = e > 2: truncated);
    each stale sequence's Π w stays inside [0, 3], where the old sequence_mask default kept it at 1."""
    groups = _groups(tok)
    assign_advantages(groups, ObjectiveConfig())
    batch = build_batch(groups, tok.pad_token_id)
    current = _logprobs_no_grad(model, batch, UpdateSpec(ObjectiveConfig(), micro_batch_size=len(batch)))
    trained = batch.trained_mask
    gap = torch.zeros_like(current)  # ℓ^current − ℓ^μ
    for row in range(4, 8):
        cols = trained[row].nonzero().squeeze(-1)
        gap[row, cols] = torch.tensor([0.4 if k % 2 else -0.4 for k in range(len(cols))])
    gap[5, trained[5].nonzero()[0, 0]] = 1.0
    batch.behavior_logprobs = (current - gap) * trained
    return batch, current, gap


def update(model, batch, obj):
    m = copy.deepcopy(model)
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    metrics = policy_update(m, opt, copy.deepcopy(batch),
                            UpdateSpec(obj, passes=1, micro_batch_size=16, max_grad_norm=1e9, max_len=24))
    step = torch.cat([(p0 - p1).flatten() for p0, p1 in zip(model.parameters(), m.parameters())])
    return step, metrics


def test_the_default_weights_stale_groups_with_one_optimizer_pass(tiny):
    model, tok = tiny
    batch, current, gap = mixed_batch(model, tok)
    trained = batch.trained_mask
    default = objective("replay.method=rollout_replay")
    # the weight compares the behaviour log-probs with the proximal policy (here the current one)
    w, _ = behavior_weights(current, batch.behavior_logprobs, trained, default.tis_mode, default.tis_cap)
    expected = torch.where(trained > 0, torch.exp(gap).clamp(max=2.0), torch.ones_like(gap))
    assert torch.allclose(w, expected, atol=1e-6)
    assert torch.all(w[:4] == 1) and (w[4:][trained[4:] > 0] != 1).all()  # fresh rows 1, stale rows not
    assert float(w[5][trained[5] > 0].max()) == 2.0  # e truncated at the cap
    seq = torch.exp((gap * trained).sum(-1))[4:]
    assert ((seq > 0) & (seq < 3)).all()  # the precondition of the old default's blind spot

    step_default, m_default = update(model, batch, default)
    step_none, _ = update(model, batch, ObjectiveConfig(tis_mode="none"))
    step_mask, m_mask = update(model, batch, ObjectiveConfig(tis_mode="sequence_mask"))
    assert m_default["tis/weight_mean"] != pytest.approx(1.0, abs=1e-3)
    assert m_default["tis/truncated_tokens"] > 0
    assert (step_default - step_none).norm() > 1e-3 * step_none.norm()  # the default corrects ...
    # ... where the old default did not: stale groups at weight 1, the update of tis_mode=none
    assert m_mask["tis/masked_sequences"] == 0
    assert torch.allclose(step_mask, step_none, atol=1e-7)


def test_the_weight_uses_the_proximal_not_the_trained_policy():
    """Two optimizer passes: the weight stays exp(ℓ^prox − ℓ^μ), whatever the policy has become."""
    cfg = ObjectiveConfig(method="ppo_clip", tis_mode="token_truncate")
    mask = torch.ones(1, 3)
    prox, mu = torch.tensor([[-1.0, -1.0, -1.0]]), torch.tensor([[-1.5, -0.6, -1.0]])
    lw = token_weights(mask, "token_mean")
    stats = [policy_loss(prox + shift, prox, torch.ones(1, 3), mask, lw, cfg, behavior_logprobs=mu)[1]
             for shift in (0.0, 0.1, -0.1)]
    expected = (math.exp(0.5) + math.exp(-0.4) + 1) / 3
    assert all(float(s["tis/weight_mean"]) == pytest.approx(expected) for s in stats)
