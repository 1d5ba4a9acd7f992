"""``guide`` (generate/guide.py): hinted rollouts for groups that all failed, trained on the bare prompt.

METHODS.md's test idea: guidance triggers only on all-zero groups; stored prompt ids are the
unguided ones; an empty hint gives weights of 1 (plain GRPO). And the off-policy correction by
hand: the update weights a guided token by min(π_θ(y_t|x)/π_old(y_t|x⊕h), 2).
"""

import math

import pytest
import torch

from rollwise import seeds
from rollwise.config import ConfigError
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.slots import SlotEngine
from rollwise.generate import check_guidance
from rollwise.generate.group import GroupSampler
from rollwise.generate.guide import GuideConfig, GuideSampler, with_context
from rollwise.model.logprobs import token_logprobs_and_entropy
from rollwise.optim.correction import behavior_weights
from rollwise.optim.losses import token_weights
from rollwise.optim.objective import assign_advantages, policy_loss
from rollwise.train.config import load_run_config
from rollwise.types import Prompt, Rollout, RolloutGroup


def rollout(prompt_ids, reward, text="", context=None):
    r = Rollout("p", list(prompt_ids), [5, 6], [-1.0, -1.0], [0, 0], "stop", completion_text=text, context=context)
    r.reward = r.score = reward
    return r


class FakeRounds:
    """Sampling under a hint that holds the answer gives the answer; otherwise a wrong one."""

    def __init__(self):
        self.asked = []

    def encode(self, prompt):
        return [ord(c) for c in (prompt.messages[-1]["content"] if prompt.messages else prompt.text)]

    def demonstrate(self, prompt):
        return f"{prompt.answer} is the sum"

    def sample(self, prompts, budgets, salt, observe=True):
        self.asked.append((prompts, budgets, salt, observe))
        groups = []
        for p, n in zip(prompts, budgets):
            hinted = p.answer in "".join(map(chr, p.token_ids))
            groups.append(RolloutGroup(p, [rollout(p.token_ids, 1.0 if hinted else 0.0) for _ in range(n)]))
        return groups, {}, 2 * sum(budgets)


def group(pid, text, answer, rewards):
    prompt = Prompt(pid, text, token_ids=[ord(c) for c in text], answer=answer)
    return RolloutGroup(prompt, [rollout(prompt.token_ids, r) for r in rewards])


def sampler(**guide):
    return GuideSampler(SamplingParams(), lambda ids: "", guide=GuideConfig(**guide), group_size=4)


def test_guidance_only_on_groups_that_all_failed_and_trained_on_the_bare_prompt():
    groups = [group("a", "2+3=", "5", [0, 0, 0, 0]), group("b", "1+1=", "2", [0, 1, 0, 0])]
    rounds = FakeRounds()
    metrics = sampler().revise(groups, rounds)
    (prompts, budgets, salt, observe), = rounds.asked
    assert [p.id for p in prompts] == ["a"] and budgets == [2] and salt == seeds.GUIDED_ROUND and not observe
    assert "".join(map(chr, prompts[0].token_ids)) == "Hint: 5\n2+3="  # sampled under x⊕h ...
    assert prompts[0].text == "2+3="  # ... scored as x
    a, b = groups
    assert len(a.rollouts) == 6 and len(b.rollouts) == 4  # the union: 4 failures + G/2 guided
    for r in a.rollouts[4:]:
        assert r.prompt_ids == [ord(c) for c in "2+3="] and r.context == "5"  # stored prompt ids: the unguided ones
    assert [r.context for r in a.rollouts[:4]] == [None] * 4
    assert metrics["guide/guided_groups"] == 1 and metrics["guide/guided_correct"] == 1.0


def test_guidance_differs_from_grpo_advantages_over_the_union():
    """Plain GRPO has no signal on an all-failed group; guide's union [0,0,0,0,1,1] has (by hand:
    mean 1/3, Bessel std sqrt(4/15), A = (r − 1/3)/std)."""
    cfg = load_run_config(None, ["rollout.strategy=guide"]).objective
    plain = [group("a", "2+3=", "5", [0, 0, 0, 0])]
    assign_advantages(plain, cfg)
    assert all(r.advantage == [0.0, 0.0] for r in plain[0].rollouts)
    guided = [group("a", "2+3=", "5", [0, 0, 0, 0])]
    sampler().revise(guided, FakeRounds())
    assign_advantages(guided, cfg)
    std = math.sqrt(4 / 15)
    want = [-1 / 3 / std] * 4 + [2 / 3 / std] * 2
    assert [r.advantage[0] for r in guided[0].rollouts] == pytest.approx(want, abs=1e-5)


def test_hints_from_the_demonstration_a_column_or_none():
    g = group("a", "2+3=", "5", [0, 0])
    g.prompt.columns["tip"] = "add"
    rounds = FakeRounds()
    sampler(hint="demonstration").revise([g], rounds)
    assert "".join(map(chr, rounds.asked[0][0][0].token_ids)) == "Hint: 5 is the sum\n2+3="
    rounds = FakeRounds()
    sampler(hint="tip", template="{prompt} ({hint})").revise([group("a", "2+3=", "5", [0])], rounds)
    assert rounds.asked == []  # the column is absent on this prompt: not guided
    g = group("a", "2+3=", "5", [0])
    g.prompt.columns["tip"] = "add"
    sampler(hint="tip", template="{prompt} ({hint})").revise([g], rounds)
    assert "".join(map(chr, rounds.asked[0][0][0].token_ids)) == "2+3= (add)"


def test_a_conversational_prompt_gets_the_hint_in_its_last_user_message():
    p = Prompt("a", "q", messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+3?"}])
    guided = with_context(p, "5", "Hint: {hint}\n{prompt}", FakeRounds().encode)
    assert "".join(map(chr, guided.token_ids)) == "Hint: 5\n2+3?" and p.messages[1]["content"] == "2+3?"
    assert with_context(p, "", "Hint: {hint}\n{prompt}", FakeRounds().encode) is p  # empty hint: x itself


def test_the_correction_by_hand():
    """Guided tokens with π_θ(y|x) = [.5, .9], π_old(y|x⊕h) = [.8, .3], A = 1, one row: the update weights
    them min(π_θ/π_old, 2) = [.625, 2] (3 truncated at 2), and seq_mean_token_mean gives each token 1/2:
    dL/dℓ_θ = −A·w/2 = [−.3125, −1]. (The default sync correction, sequence_mask, would give
    [−.5, −.5].)"""
    cfg = load_run_config(None, ["rollout.strategy=guide"]).objective
    assert (cfg.tis_mode, cfg.tis_cap) == ("token_truncate", 2.0)
    policy = torch.log(torch.tensor([[0.5, 0.9]])).requires_grad_()
    behavior = torch.log(torch.tensor([[0.8, 0.3]]))
    mask = torch.ones(1, 2)
    weights = token_weights(mask, cfg.loss_agg, 2, lengths=mask.sum(-1), num_sequences=1)
    loss, _ = policy_loss(policy, policy.detach(), torch.ones(1, 2), mask, weights, cfg, behavior_logprobs=behavior)
    loss.backward()
    assert policy.grad.tolist()[0] == pytest.approx([-0.3125, -1.0])


def test_a_guided_strategy_needs_an_is_weight():
    cfg = load_run_config(None, ["rollout.strategy=guide", "objective.tis_mode=sequence_mask"])
    with pytest.raises(ConfigError, match="objective.tis_mode=sequence_mask"):
        check_guidance(cfg.rollout, cfg.objective)
    check_guidance(cfg.rollout.model_copy(update={"strategy": "group"}), cfg.objective)


class EngineRounds(FakeRounds):
    """Real sampling on the tiny model; every rollout scores 0 (so each group is guided)."""

    def __init__(self, tiny, params):
        super().__init__()
        self.model, self.tok = tiny
        self.engine = SlotEngine(self.model, pad_token_id=self.tok.pad_token_id)
        self.params = params

    def encode(self, prompt):
        return self.tok(prompt.text)["input_ids"]

    def sample(self, prompts, budgets, salt, observe=True):
        groups, _ = GroupSampler(self.params, lambda ids: "").generate(self.engine, prompts, budgets, seed=salt)
        for g in groups:
            for r in g.rollouts:
                r.reward = r.score = 0.0
        return groups, {}, 0


def teacher_forced(model, prompt_ids, completion_ids):
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        lp, _ = token_logprobs_and_entropy(model, ids, torch.ones_like(ids), with_entropy=False)
    return lp[:, len(prompt_ids) - 1:]


@pytest.mark.parametrize("hint", ["", "407"])
def test_behaviour_logprobs_are_the_hinted_contexts_and_an_empty_hint_weighs_1(tiny, hint):
    """On the tiny model: a guided rollout's behaviour log-probs are π(y|x⊕h) (teacher-forced on the hinted
    ids), its stored prompt the bare x, so the update's weight is π(y|x)/π(y|x⊕h) — exactly 1 for h = ''."""
    model, tok = tiny
    params = SamplingParams(max_new_tokens=6, stop_token_ids=(tok.eos_token_id,))
    rounds = EngineRounds(tiny, params)
    x = Prompt("a", "12+3=", token_ids=tok("12+3=")["input_ids"], columns={"tip": hint})
    g = RolloutGroup(x, [rollout(x.token_ids, 0.0)])
    sampler(hint="tip").revise([g], rounds)
    guided = g.rollouts[1:]
    assert len(guided) == 2
    hinted_ids = tok(f"Hint: {hint}\n12+3=")["input_ids"] if hint else x.token_ids
    for r in guided:
        assert r.prompt_ids == x.token_ids
        under_hint = teacher_forced(model, hinted_ids, r.completion_ids)
        assert torch.allclose(torch.tensor([r.behavior_logprobs]), under_hint, atol=1e-4)
        bare = teacher_forced(model, x.token_ids, r.completion_ids)
        w, _ = behavior_weights(bare, torch.tensor([r.behavior_logprobs]), torch.ones_like(bare), "token_truncate", 2.0)
        want = torch.exp(bare - under_hint).clamp(max=2.0)
        assert torch.allclose(w, want, atol=1e-4)
        if not hint:
            assert torch.allclose(w, torch.ones_like(w), atol=1e-4)
    if hint:  # the hint changes the distribution the rollouts came from
        assert any(not torch.allclose(teacher_forced(model, hinted_ids, r.completion_ids),
                                      teacher_forced(model, x.token_ids, r.completion_ids), atol=1e-3)
                   for r in guided)
