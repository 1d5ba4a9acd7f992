"""``scope`` (generate/scope.py): the steps of a failed rollout before its first wrong one kept token for
token, the reference solution writes the rest, kept only if it verifies.

METHODS.md's test idea: the prefix is kept token-for-token; an error at step 1 replaces the whole
rollout; each token has the right on-/off-policy flag (``Rollout.corrected_from``). And the objective:
the kept prefix trains with the group advantage, the corrector's tokens as SFT with weight .1.
"""

import math

import pytest

from rollwise.config import ConfigError
from rollwise.engine.sampling import SamplingParams
from rollwise.filter.arith import arith_reward
from rollwise.generate.scope import ScopeConfig, ScopeSampler, first_error, kept_tokens
from rollwise.optim.objective import assign_advantages
from rollwise.tasks.arith import make_prompt, solve
from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer
from rollwise.types import Rollout, RolloutGroup

EOS = 3
CHUNKS = {1000: " 7+8", 1001: "+0=15 4", 1002: "+5+0", 1003: "=09 3+0+1=04 #495", 1004: " 8+8+0=16 #16"}


def decode(ids):
    return "".join(CHUNKS.get(i, chr(i)) for i in ids if i != EOS)


class FakeRounds:
    """Char-level encoding, the arith task's demonstration and verifier; behaviour log-probs −0.5."""

    def __init__(self, verifies=True):
        self.verifies, self.scored = verifies, []

    def demonstrate(self, prompt):
        c = prompt.columns
        return solve(c["a"], c["op"], c["b"])

    def encode_text(self, text):
        return [ord(ch) for ch in text]

    def logprobs(self, prompt_ids, completion_ids):
        return [-0.5] * len(completion_ids)

    def score(self, groups):
        for g in groups:
            for r in g.rollouts:
                ok = self.verifies and arith_reward([""], [r.completion_text], answer=[g.prompt.answer])[0]
                r.reward = r.score = float(ok)
                self.scored.append(r)
        return {}


def sampled(ids, reward=0.0):
    ids = list(ids) + [EOS]
    r = Rollout("p", [9, 9], ids, [-1.0 - i for i in range(len(ids))], [4] * len(ids), "stop",
                completion_text=decode(ids))
    r.reward = r.score = reward
    return r


def sampler(**kw):
    return ScopeSampler(SamplingParams(stop_token_ids=(EOS,)), decode, scope=ScopeConfig(**kw), group_size=4)


def group(*rollouts):
    return RolloutGroup(make_prompt("p", 347, "+", 58), list(rollouts))


def test_the_prefix_is_kept_token_for_token():
    """" 7+8+0=15 4+5+0=09 3+0+1=04 #495": steps 7 + 8 + 0 =15 4 + 5 + 0 …; the reference's 11th step is 1 (the
    carry): the first error is step 11 (index 10). Kept: the tokens " 7+8", "+0=15 4" (" 7+8+0=15 4+5+" is where
    the steps end; "+5+0" straddles it); the corrector writes "+5+" + "1=10 3+0+1=04 #405"."""
    bad = sampled([1000, 1001, 1002, 1003])
    g = group(bad, sampled([1004]), sampled([1004]), sampled([1004]))
    metrics = sampler(max_corrected=1).revise([g], FakeRounds())
    fixed = g.rollouts[0]
    assert fixed.completion_ids[:2] == [1000, 1001] and fixed.corrected_from == 2  # token for token
    assert fixed.completion_ids[2:] == [ord(c) for c in "+5+1=10 3+0+1=04 #405"] + [EOS]
    assert fixed.completion_text == " 7+8+0=15 4+5+1=10 3+0+1=04 #405" == solve(347, "+", 58)
    assert fixed.reward == 1.0 and fixed.finish_reason == "stop"
    n = len(fixed.completion_ids)
    assert fixed.behavior_logprobs == bad.behavior_logprobs[:2] + [-0.5] * (n - 2)  # own, then the policy's
    assert fixed.versions == [4] * n and metrics["scope/corrected"] == 1
    assert g.rollouts[1].corrected_from is None  # max_corrected = 1: the latest first error was chosen


def test_an_error_at_step_one_replaces_the_whole_rollout():
    g = group(sampled([1004]), sampled([1004]))
    sampler().revise([g], FakeRounds())
    for r in g.rollouts[:2]:
        assert r.corrected_from == 0 and r.completion_text == solve(347, "+", 58)
    assert all(lp == -0.5 for lp in g.rollouts[0].behavior_logprobs)


def test_only_groups_that_all_failed_and_only_what_verifies():
    ok = group(sampled([1004]), sampled([ord(c) for c in solve(347, "+", 58)], reward=1.0))
    rounds = FakeRounds()
    sampler().revise([ok], rounds)
    assert rounds.scored == [] and ok.rollouts[0].corrected_from is None
    failed = group(sampled([1004]), sampled([1004]))
    before = list(failed.rollouts)
    metrics = sampler().revise([failed], FakeRounds(verifies=False))
    assert failed.rollouts == before and metrics == {"scope/corrected": 0.0, "scope/tried": 2.0,
                                                     "scope/corrector_tokens": 0.0}


def test_advantages_prefix_on_policy_suffix_sft():
    """Group [fixed 1, 0, 0, 0]: mean .25, std sqrt(.25) = .5: the fixed rollout's own tokens get
    (1 − .25)/.5 = 1.5, the corrector's .1; plain GRPO on the failed group has no signal."""
    cfg = load_run_config(None, ["rollout.strategy=scope"]).objective
    g = group(sampled([1000, 1001, 1002, 1003]), sampled([1004]), sampled([1004]), sampled([1004]))
    assign_advantages([g], cfg)
    assert all(a == 0 for r in g.rollouts for a in r.advantage)
    sampler(max_corrected=1).revise([g], FakeRounds())
    assign_advantages([g], cfg)
    fixed = g.rollouts[0]
    std = math.sqrt(0.25)  # Bessel over [1, 0, 0, 0]: sqrt((.5625 + 3·.0625)/3)
    assert fixed.advantage[:2] == pytest.approx([0.75 / std] * 2, abs=1e-5)
    assert fixed.advantage[2:] == pytest.approx([0.1] * (len(fixed.advantage) - 2))
    assert g.rollouts[1].advantage[0] == pytest.approx(-0.25 / std, abs=1e-5)


def test_first_error_and_token_boundaries():
    assert first_error(list("12"), list("13")) == 1 and first_error(list("1"), list("1")) is None
    assert first_error(list("123"), list("12")) == 2  # an extra step is wrong
    assert kept_tokens([1000, 1001], " 7+8+0", decode) == 1  # "+0=15 4" straddles the end


def test_a_bad_step_pattern_is_refused():
    with pytest.raises(ConfigError, match="step_pattern"):
        load_run_config(None, ["rollout.strategy=scope", "rollout.scope.step_pattern=("])


def test_one_step_in_the_trainer(tmp_path, warm):
    """The real Rounds (train/collect.py): corrected rollouts verify and carry the flag; metrics logged."""
    sets = [f"output_dir={tmp_path}", f"model.path={warm}", "task.max_digits=2", "task.eval_size=4",
            "model.threads=1", "train.eval_samples=0", "rollout.prompts_per_step=6", "rollout.num_generations=2",
            "rollout.max_new_tokens=24", "train.eval_every=0", "train.checkpoint_every=0",
            "rollout.strategy=scope"]
    with Trainer(load_run_config(None, sets)) as t:
        t.prepare()
        batch = t.collect(0, 0, t.engine)
        metrics = t.train_on(batch)
    assert {"scope/corrected", "scope/tried"} <= set(batch.metrics) and "loss" in metrics
    fixed = [r for g in batch.groups for r in g.rollouts if r.corrected_from is not None]
    assert batch.metrics["scope/corrected"] == len(fixed)
    for r in fixed:
        assert r.correct and len(r.behavior_logprobs) == len(r.completion_ids)
