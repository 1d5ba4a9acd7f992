"""``trace`` (control/trace.py + generate/trace_episodes.py): budgets over the turns of episodes."""

from __future__ import annotations

import doctest
import itertools
import zlib

import pytest
import torch

from rollwise.config import ConfigError
from rollwise.control import ControlConfig, PromptStats, build_controller
from rollwise.control import trace as trace_module
from rollwise.control.rounds import extend_rounds
from rollwise.control.trace import (Trace, TraceConfig, node_estimates, prefix_nodes, success_estimate,
                                    trace_allocation)
from rollwise.engine.sampling import SamplingParams
from rollwise.filter.rewards import score_groups
from rollwise.generate.trace_episodes import TraceEpisodeSampler
from rollwise.model.tiny import char_tokenizer
from rollwise.tasks.environment import EpisodeEnv
from rollwise.tasks.envs import Calculator, GuessNumber
from rollwise.tasks.tool_calls import FORMATS, ToolCall
from rollwise.types import Prompt, Rollout, RolloutGroup, Turn
from test_episodes import ScriptedEngine

PLAIN = FORMATS["plain"]


# -- the allocation rule, by hand --------------------------------------------------------------
def test_doctests():
    assert doctest.testmod(trace_module).failed == 0


def test_greedy_order_is_p_one_minus_p_over_one_plus_anchors():
    # scores p(1-p)/(1+n): .25/5 = .05, .09, .25, and p = 0 or 1 never; .25 falls to .125, .083 as it is given
    assert trace_allocation([0.5, 0.9, 0.5, 0.0, 1.0], [4, 0, 0, 0, 0], 4) == [0, 1, 3, 0, 0]
    assert trace_allocation([0.0, 1.0], [0, 0], 3) == [0, 0]  # nothing open: the caller falls back to the root
    assert success_estimate(3, 4, 0.5) == pytest.approx(4 / 6)  # Beta(1, 1) at the root
    assert success_estimate(1, 2, 4 / 6) == pytest.approx((1 + 2 * 4 / 6) / 4)  # prior centred on the parent
    assert success_estimate(0, 3, 0.5) == 0.0 and success_estimate(0, 1, 0.5) == pytest.approx(1 / 3)


def episode(first: list[int], second: list[int], correct: bool) -> Rollout:
    """A two-turn episode: ``first``, one inserted id (9), ``second``."""
    ids = first + [9] + second
    r = Rollout("p", [5], ids, [-0.5] * len(ids), [0] * len(ids), "stop",
                turns=[Turn(0, len(first)), Turn(len(first) + 1, len(ids))],
                messages=[{"role": "assistant", "content": "a"}, {"role": "tool", "name": "t", "content": "r"},
                          {"role": "assistant", "content": "b"}])
    r.score = r.reward = float(correct)
    return r


def test_a_decided_prefix_gets_no_budget():
    a1, a2 = episode([1, 1], [3], True), episode([1, 1], [4], True)  # prefix A: both correct (p = 1)
    b1, b2 = episode([2, 2], [3], True), episode([2, 2], [4], False)  # prefix B: mixed
    group = RolloutGroup(Prompt("p", "q"), [a1, b1, a2, b2])
    nodes = prefix_nodes(group.rollouts)
    assert [(n.turns, n.passed, n.correct, n.started) for n in nodes] == [(0, 4, 3, 4), (1, 2, 2, 0), (1, 2, 1, 0)]
    p = node_estimates(nodes)
    assert p == pytest.approx([4 / 6, 1.0, (1 + 2 * 4 / 6) / 4])
    control = Trace(TraceConfig(), num_generations=8)
    assert control.allocate([group.prompt], PromptStats(), 8) == [4]
    assert control.extend([group], PromptStats(), 4) == [4]
    # B scores .243, .122, .081, .061 against the root's .222/5 = .044: all four restart from B, none from A
    assert [(r is b1, k) for r, k in control.plans["p"]] == [(True, 1)] * 4
    m = control.metrics()
    assert m["control/trace_prefix_rollouts"] == 4 and m["control/trace_fallback_rollouts"] == 0


# -- the two passes on a scripted "model" -----------------------------------------------------------
class SeededEngine(ScriptedEngine):
    """test_episodes' scripted "model", writing ``script(prompt_text, seed)``: the request's seed picks its text."""

    def write(self, text, request):
        return self.script(text, request.params.seed)


def guesser(text: str, seed: int) -> str:
    """Guesses 1, 2 or 3 by its seed until told it is correct."""
    return "done" if text.endswith("<result>correct</result>") else f"<call>guess({1 + seed % 3})</call>"


def episodes(tok, env=GuessNumber, planner=None, max_turns=3, max_new_tokens=120):
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop_token_ids=(tok.eos_token_id,))
    return TraceEpisodeSampler(params, tok, lambda: EpisodeEnv(env(), 5.0, 2000), PLAIN, max_turns, planner=planner)


def collect(control, sampler, engine, prompts, budget):
    """What Trainer.collect does with a controller that extends: allocate, sample + score, extend."""
    stats = PromptStats()
    first = control.allocate(prompts, stats, budget)
    groups, _ = sampler.generate(engine, prompts, first, seed=1)
    score_groups(groups, [])

    def run_round(ps, bs, salt):
        more, _ = sampler.generate(engine, ps, bs, seed=100 + salt)
        score_groups(more, [])
        return more, 0

    firsts = [list(g.rollouts) for g in groups]
    extend_rounds(control, stats, groups, run_round, budget - sum(first))
    return first, firsts, groups, control.metrics()


def test_the_first_pass_is_half_and_the_budget_is_spent_exactly():
    tok = char_tokenizer()
    control = Trace(TraceConfig(), num_generations=7)
    sampler = episodes(tok, planner=control)
    prompts = [Prompt(f"p{s}", "guess ", columns={"secret": s}) for s in (1, 2, 3)]
    first, firsts, groups, m = collect(control, sampler, SeededEngine(tok, guesser), prompts, 20)
    assert first == [3, 3, 3]  # G = 7, 7, 6: the first pass is ⌊G/2⌋
    assert [len(g.rollouts) for g in groups] == [7, 7, 6]
    assert [g.rollouts[: len(f)] == f for g, f in zip(groups, firsts)] == [True] * 3
    assert m["control/trace_prefix_rollouts"] + m["control/trace_root_rollouts"] == 20 - 9
    assert m["control/trace_prefix_restarts"] == m["control/trace_prefix_rollouts"] > 0  # the test restarts
    assert m["control/trace_replay_mismatches"] == 0
    children = [r for g in groups for r in g.rollouts if r.loss_weights and r.loss_weights[0] == 0]
    assert len(children) == m["control/trace_prefix_restarts"]


def test_with_no_open_prefix_the_rest_are_fresh_episodes():
    tok = char_tokenizer()
    control = Trace(TraceConfig(), num_generations=6)
    always_right = lambda text, seed: "done" if "<result>" in text else "<call>guess(2)</call>"  # noqa: E731
    first, _, (group,), m = collect(control, episodes(tok, planner=control), SeededEngine(tok, always_right),
                                    [Prompt("p", "guess ", columns={"secret": 2})], 6)
    assert first == [3] and len(group.rollouts) == 6 and all(r.correct for r in group.rollouts)
    assert m["control/trace_fallback_rollouts"] == 3 and m["control/trace_no_open_prefix"] == 1
    assert m["control/trace_prefix_restarts"] == 0 and all(r.loss_weights[0] == 1 for r in group.rollouts)


class Planned:
    """A planner that restarts every episode from ``(parent, k)`` and keeps what the sampler reports."""

    def __init__(self, parent, k):
        self.start, self.noted = (parent, k), (0, 0)

    def restarts(self, prompt_id, n):
        return [self.start] * n

    def note_restarts(self, restarted, mismatched):
        self.noted = (restarted, mismatched)


class Tally:
    """A deterministic environment: each call's answer is the running total."""

    def reset(self, **row):
        self.total = 0

    def add(self, n: int) -> str:
        """Add to the total.

        Args:
            n: how much
        """
        self.total += n
        return str(self.total)

    def observation_key(self) -> str:
        return str(self.total)


CLOCK = itertools.count()


class Clock(Tally):
    """Not deterministic: answers with a counter shared by every instance."""

    def add(self, n: int) -> str:
        """Add to the total.

        Args:
            n: how much
        """
        return str(next(CLOCK))


def adder(text: str, seed: int) -> str:
    return f"<call>add({1 + seed % 5})</call>"


def running_totals(messages: list[dict]) -> list[int]:
    """What ``Tally`` should have answered to the calls in ``messages`` (each assistant turn one ``add(n)``)."""
    totals, total = [], 0
    for said, answer in zip(messages, messages[1:]):
        if said["role"] == "assistant" and answer["role"] == "tool":
            total += int(said["content"][len("<call>add("):-len(")</call>")])
            totals.append(total)
    return totals


def test_replay_reproduces_the_observations_and_the_child_continues_the_exact_prefix():
    tok = char_tokenizer()
    prompt = Prompt("p", "add ")
    (group,), _ = episodes(tok, env=Tally).generate(SeededEngine(tok, adder), [prompt], [1], seed=0)
    (parent,) = group.rollouts
    assert len(parent.turns) == 3
    for k in (1, 2):
        engine, planner = SeededEngine(tok, adder), Planned(parent, k)
        (children,), _ = episodes(tok, env=Tally, planner=planner).generate(engine, [prompt], [2], seed=7)
        assert planner.noted == (2, 0)  # two restarts, no mismatch
        cut = parent.turns[k].start
        for child in children.rollouts:
            assert child.completion_ids[:cut] == parent.completion_ids[:cut]  # the prefix's exact ids
            assert child.behavior_logprobs[:cut] == parent.behavior_logprobs[:cut]
            assert child.loss_weights[:cut] == [0] * cut  # trained once, in the parent
            assert child.loss_weights[cut: child.turns[k].end] == [1] * (child.turns[k].end - cut)
            assert child.turns[:k] == parent.turns[:k] and len(child.turns) == 3
            # the replayed environment is where the parent's was: same anchor state, same observations
            assert child.turns[k].state == parent.turns[k].state
            tools = [m for m in child.messages if m["role"] == "tool"]
            assert tools[:k] == [m for m in parent.messages if m["role"] == "tool"][:k]
            assert [int(m["content"]) for m in tools] == running_totals(child.messages)  # it went on from there
        # the model was asked to continue after exactly the prefix (prompt + prefix text, no re-rendering)
        assert engine.prompts[0] == tok.decode(parent.prompt_ids + parent.completion_ids[:cut])


def test_an_environment_that_does_not_replay_gets_a_fresh_episode():
    tok = char_tokenizer()
    prompt = Prompt("p", "add ")
    (group,), _ = episodes(tok, env=Clock).generate(SeededEngine(tok, adder), [prompt], [1], seed=0)
    planner = Planned(group.rollouts[0], 1)
    (children,), _ = episodes(tok, env=Clock, planner=planner).generate(SeededEngine(tok, adder), [prompt], [2], seed=7)
    assert planner.noted == (0, 2)  # both replays mismatched
    assert all(r.loss_weights[0] == 1 for r in children.rollouts)  # fresh from the root: nothing shared


# -- on the slot engine: a restart prefills the prefix and samples token-faithfully -------------------
class AlwaysCall(type(PLAIN)):
    """Every finished turn calls the calculator (a random tiny model never writes a call itself)."""

    def parse(self, text):
        return [ToolCall("calculate", {"expression": "6*7"})]


def slot_episodes():
    """(model, a SlotEngine on the tiny model, sampler(cls, planner)): turns end at a letter or digit."""
    from rollwise.engine.slots import SlotEngine
    from rollwise.model.tiny import build_tiny

    model, tok = build_tiny("tiny", seed=0)
    engine = SlotEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=8, seed=0)
    stops = tuple(tok(c, add_special_tokens=False)["input_ids"][0] for c in "abcdefghij0123456789")
    params = SamplingParams(temperature=1.0, max_new_tokens=120, stop_token_ids=stops + (tok.eos_token_id,))
    envs = lambda: EpisodeEnv(Calculator(), 5.0, 2000)  # noqa: E731
    make = lambda cls=TraceEpisodeSampler, **kw: cls(params, tok, envs, AlwaysCall(), 3, **kw)  # noqa: E731
    return model, engine, make


def test_without_a_plan_it_samples_what_the_episode_sampler_samples():
    from rollwise.generate.episode import EpisodeSampler

    prompts = [Prompt(f"p{i}", f"q{i}: ", token_ids=[]) for i in range(2)]
    _, engine, make = slot_episodes()
    plain, _ = make(EpisodeSampler).generate(engine, prompts, [2, 2], seed=3)
    _, engine, make = slot_episodes()
    traced, _ = make(planner=None).generate(engine, prompts, [2, 2], seed=3)
    fields = lambda groups: [(r.completion_ids, r.behavior_logprobs, r.loss_weights, r.turns)  # noqa: E731
                             for g in groups for r in g.rollouts]
    assert fields(traced) == fields(plain) and all(len(r.turns) == 3 for g in plain for r in g.rollouts)


def test_slot_engine_restarts_keep_the_prefix_and_sample_with_the_models_log_probs():
    model, engine, make = slot_episodes()
    prompt = Prompt("p", "q: ", token_ids=[])
    (group,), _ = make().generate(engine, [prompt], [1], seed=3)
    (parent,) = group.rollouts
    planner = Planned(parent, 1)
    (children,), _ = make(planner=planner).generate(engine, [prompt], [3], seed=4)
    assert planner.noted == (3, 0)
    cut = parent.turns[1].start
    for r in children.rollouts:
        assert r.completion_ids[:cut] == parent.completion_ids[:cut] and len(r.turns) == 3
        ids = torch.tensor([r.prompt_ids + r.completion_ids])
        with torch.no_grad():
            logp = model(ids).logits[0, len(r.prompt_ids) - 1: -1].float().log_softmax(-1)
        own = logp.gather(-1, torch.tensor(r.completion_ids)[:, None])[:, 0]
        sampled = [i for i in range(cut, len(r.completion_ids)) if r.loss_weights[i]]
        assert sampled and torch.allclose(torch.tensor(r.behavior_logprobs)[sampled], own[sampled], atol=1e-4)
    assert len({tuple(r.completion_ids) for r in children.rollouts}) > 1  # each child samples on with its own seed


# -- config and the trainer ------------------------------------------------------------------------------
def test_trace_without_an_environment_names_the_fix():
    from rollwise.train.config import RolloutConfig

    with pytest.raises(ConfigError, match="set rollout.environment"):
        build_controller(ControlConfig(method="trace"), RolloutConfig(), seed=0)


class Flip:
    """A coin flipped by the text it is given (deterministic): the episode's reward is the last flip."""

    def reset(self, **row):
        self.last = None

    def flip(self, text: str) -> str:
        """Flip a coin.

        Args:
            text: what seeds it
        """
        self.last = "heads" if zlib.crc32(text.encode()) % 2 else "tails"
        return self.last

    def get_reward(self) -> float:
        return float(self.last == "heads")


class FlipEveryTurn(type(PLAIN)):
    def parse(self, text):
        return [ToolCall("flip", {"text": text})]


def test_trace_trains_on_episodes(tmp_path):
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    cfg = load_run_config(None, [
        f"output_dir={tmp_path}", "name=trace", "sft.steps=30", "task.max_digits=1", "task.eval_size=4",
        "rollout.prompts_per_step=4", "rollout.num_generations=4", "rollout.max_new_tokens=96",
        "rollout.environment=test_trace:Flip", "rollout.max_turns=3", "control.method=trace",
        "train.eval_samples=0", "optim.micro_batch_size=8", "model.threads=1"])
    trainer = Trainer(cfg)
    assert isinstance(trainer.generator, TraceEpisodeSampler) and trainer.generator.planner is trainer.controller
    trainer.generator.fmt = FlipEveryTurn()  # the tiny model writes no calls itself
    trainer.prepare()
    before = [p.detach().clone() for p in trainer.model.parameters()]
    restarts = 0
    for _ in range(2):
        m = trainer.step()
        assert all(v == v for v in m.values())  # no NaN
        restarts += m["control/trace_prefix_restarts"]
    assert restarts > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
