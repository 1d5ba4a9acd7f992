"""``old_logit_repair`` (optim/old_logits.py): the ratio against the sampling version's trainer log-probs.

METHODS.md's test idea: a synchronous run gives the plain ratios; a missing version raises an error.
The mechanism is tested with an engine whose log-probs are perturbed (behaviour = the trainer's − .3).
"""

import copy
import math

import pytest
import torch

from rollwise.optim.batch import build_batch
from rollwise.optim.objective import ObjectiveConfig, policy_loss
from rollwise.optim.old_logits import completion_logprobs, record_old_logprobs
from rollwise.optim.update import UpdateSpec, policy_update
from rollwise.types import Prompt, Rollout, RolloutGroup

CFG = ObjectiveConfig(method="old_logit_repair")


def test_the_factors_are_corrected_apart_by_hand():
    """ℓ^θ = −1.0, ℓ^old,train = −1.2, ℓ^μ = −1.5, A = 1, token_truncate C = 2, ε = .2.
    Repaired: r = e^.2 = 1.221 → clipped to 1.2; weight min(e^.3, 2) = 1.350; loss −1.2·1.350 = −1.620.
    Plain (ratio against π_prox = π_θ, one pass): r = 1, weight min(e^.5, 2) = 1.649; loss −1.649."""
    theta, old, mu = torch.tensor([[-1.0]]), torch.tensor([[-1.2]]), torch.tensor([[-1.5]])
    ones = torch.ones(1, 1)
    repaired, _ = policy_loss(theta, old, ones, ones, ones, CFG, behavior_logprobs=mu)
    plain, _ = policy_loss(theta, theta, ones, ones, ones, CFG, behavior_logprobs=mu)
    assert float(repaired) == pytest.approx(-1.2 * math.exp(0.3), abs=1e-4)
    assert float(plain) == pytest.approx(-math.exp(0.5), abs=1e-4)


def rollouts_of(model, tok, shift=0.0, versions=(0, 0, 0)):
    prompt, completion = [5, 6, 7], [8, 9, 10]
    own = completion_logprobs(model, [Rollout("p", prompt, completion, [0.0] * 3, [0] * 3, "stop")], {},
                              tok.pad_token_id)[0]
    rs = []
    for reward in (1.0, 0.0):  # behaviour = the trainer's log-probs − shift: a perturbed engine
        r = Rollout("p", prompt, completion, [x - shift for x in own], list(versions), "stop", reward=reward,
                    score=reward)
        r.advantage = [reward - 0.5] * 3
        rs.append(r)
    return [RolloutGroup(Prompt("p", "x"), rs)]


def test_a_missing_version_raises(tiny):
    model, tok = tiny
    groups = rollouts_of(model, tok, versions=(3, 3, 4))
    with pytest.raises(ValueError, match=r"version\(s\) \[4\]"):
        record_old_logprobs(groups, {3: model}, {}, tok.pad_token_id)


def test_sync_gives_the_plain_ratios_and_the_gap_is_the_engines(tiny):
    """Synchronous (the snapshot is the policy being trained): the update's loss is the plain one;
    the recorded old log-probs sit .3 above the perturbed engine's."""
    model, tok = tiny
    groups = rollouts_of(model, tok, shift=0.3)
    metrics = record_old_logprobs(groups, {0: model}, {}, tok.pad_token_id)
    assert metrics["old_logits/abs_gap_to_behavior"] == pytest.approx(0.3, abs=1e-5)
    repaired = build_batch(groups, tok.pad_token_id)
    for r in groups[0].rollouts:
        r.old_logprobs = None
    plain = build_batch(groups, tok.pad_token_id)
    assert plain.old_logprobs is None and repaired.old_logprobs is not None
    spec = UpdateSpec(objective=CFG, micro_batch_size=8)
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    la = policy_update(a, torch.optim.SGD(a.parameters(), lr=0.0), repaired, spec)["loss"]
    lb = policy_update(b, torch.optim.SGD(b.parameters(), lr=0.0), plain, spec)["loss"]
    assert la == pytest.approx(lb, abs=1e-5)


def test_stale_version_changes_the_ratio(tiny):
    """The version that sampled differs from the policy being trained: the ratio is against it, so the loss
    differs from the plain objective's (which would take π_prox = π_θ and fold the gap into the weight)."""
    model, tok = tiny
    sampler = copy.deepcopy(model)
    with torch.no_grad():
        for p in sampler.parameters():
            p.mul_(1.05)  # another version of the weights
    groups = rollouts_of(sampler, tok, shift=0.1)
    record_old_logprobs(groups, {0: sampler}, {}, tok.pad_token_id)
    repaired = build_batch(groups, tok.pad_token_id)
    for r in groups[0].rollouts:
        r.old_logprobs = None
    plain = build_batch(groups, tok.pad_token_id)
    spec = UpdateSpec(objective=CFG, micro_batch_size=8)
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    la = policy_update(a, torch.optim.SGD(a.parameters(), lr=0.0), repaired, spec)["loss"]
    lb = policy_update(b, torch.optim.SGD(b.parameters(), lr=0.0), plain, spec)["loss"]
    assert la != pytest.approx(lb, abs=1e-4)


def test_a_run_records_old_logits(tmp_path):
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    overrides = [f"output_dir={tmp_path}", "task.max_digits=1", "task.eval_size=4",
                 "objective.method=old_logit_repair", "rollout.prompts_per_step=2", "rollout.num_generations=2",
                 "rollout.max_new_tokens=8", "train.eval_samples=0", "model.threads=1", "train.steps=1",
                 "train.eval_every=0", "train.checkpoint_every=0"]
    trainer = Trainer(load_run_config(None, overrides))
    trainer.prepare()
    metrics = trainer.step()
    assert metrics["old_logits/abs_gap_to_behavior"] < 1e-3  # in-process fp32 engine: kernel noise only


def test_old_logit_repair_is_a_ledger_arm():
    from rollwise.bench.ablate import arm_lines, default_arms

    assert {"objective:old_logit_repair", "objective:old_logit_repair@async1"} <= set(default_arms())
    assert arm_lines("objective:old_logit_repair") == ["objective.method=old_logit_repair"]


def test_old_logits_are_recorded_in_the_updates_precision(tmp_path):
    """With the update in bf16 (optim.compute_dtype, autocast), the recorded old log-probs are the bf16
    forward's — the precision the update's own log-probs have, so the ratio at unchanged weights is 1 —
    not an fp32 forward's, which would put the precision gap into every ratio."""
    from rollwise.optim.update import compute
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    overrides = [f"output_dir={tmp_path}", "task.max_digits=1", "task.eval_size=4", "optim.compute_dtype=bfloat16",
                 "objective.method=old_logit_repair", "rollout.prompts_per_step=2", "rollout.num_generations=2",
                 "rollout.max_new_tokens=8", "train.eval_samples=0", "model.threads=1", "train.eval_every=0",
                 "train.checkpoint_every=0"]
    with Trainer(load_run_config(None, overrides)) as trainer:
        trainer.prepare()
        rollouts = [r for g in trainer.collect(0, 0, trainer.engine).groups for r in g.rollouts]
        sampling, pad = trainer.update_spec(0).sampling, trainer.tokenizer.pad_token_id
        with compute(trainer.model, torch.bfloat16):
            bf16 = completion_logprobs(trainer.model, rollouts, sampling, pad)
        fp32 = completion_logprobs(trainer.model, rollouts, sampling, pad)
    recorded = [x for r in rollouts for x in r.old_logprobs]
    assert recorded == pytest.approx([x for lp in bf16 for x in lp], abs=1e-6)
    assert max(abs(a - b) for a, b in zip(recorded, (x for lp in fp32 for x in lp))) > 1e-3
