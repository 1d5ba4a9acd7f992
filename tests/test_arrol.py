"""``arrol``: the balanced keep rule and AUC by hand; the slot engine's hidden states equal HF's
and ``abort`` leaves no completion; pruning inside generation keeps G of 2G per prompt, and the
pruned rollouts are in no group; the probe learns a separable signal and only then prunes."""

import torch

from rollwise.control import ControlConfig, build_controller
from rollwise.control.arrol import Arrol, ArrolConfig, auc, balanced_keep, pruning_point
from rollwise.engine.engine import Request
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.slots import SlotEngine
from rollwise.generate.pruned import PrunedSampler
from rollwise.types import Prompt, Rollout, RolloutGroup


def test_balanced_keep_by_hand():
    assert balanced_keep([0.9, 0.8, 0.7, 0.6, 0.4, 0.3, 0.2, 0.1], 4) == [0, 1, 6, 7]  # {.9, .8, .2, .1}
    assert balanced_keep([0.1, 0.9, 0.5], 3) == [0, 1, 2]
    assert balanced_keep([0.5, 0.9, 0.1, 0.7, 0.3], 3) == [1, 2, 3]  # ceil(3/2)=2 highest (.9, .7), 1 lowest (.1)


def test_auc_by_hand():
    assert auc([0.9, 0.8, 0.3, 0.1], [True, False, True, False]) == 0.75
    assert auc([0.9, 0.1], [True, False]) == 1.0 and auc([0.5, 0.5], [True, False]) == 0.5
    assert auc([0.3, 0.2], [True, True]) == 0.5


def test_engine_keeps_hf_hidden_states_and_aborts(tiny):
    model, tok = tiny
    ids = tok("12+34=")["input_ids"]
    engine = SlotEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=8, seed=0)
    params = SamplingParams(temperature=1.0, max_new_tokens=6, keep_hidden=True, seed=3)
    (h,) = engine.submit([Request(ids, params)])
    engine.step(), engine.step()  # prefill + first token, then one decode
    view = engine.peek(h)
    with torch.no_grad():
        ref = model.model(input_ids=torch.tensor([ids + view.token_ids[:-1]])).last_hidden_state[0, -1]
    assert torch.allclose(view.hidden, ref, atol=1e-4), (view.hidden - ref).abs().max()
    (other,) = engine.submit([Request(ids, SamplingParams(max_new_tokens=6, seed=4))])  # not asking: no hidden
    engine.step()
    assert engine.peek(other).hidden is None
    engine.abort([h])
    done = engine.run_until()
    assert h not in done and other in done
    assert engine.stats.aborted == 1 and engine.stats.aborted_tokens == 3


class ByNorm:
    """A stub pruner: always ready, scores a rollout by its hidden state's first coordinate."""

    def __init__(self):
        self.calls = []

    def ready(self):
        return True

    def keep(self, features, budget):
        self.calls.append(features.shape[0])
        return balanced_keep(features[:, 0].tolist(), budget)


def test_pruned_sampler_keeps_g_of_2g_and_leaves_no_tokens(tiny):
    model, tok = tiny
    prompts = [Prompt(f"p{i}", t, token_ids=tok(t)["input_ids"]) for i, t in enumerate(["1+2=", "35+7=", "9-4="])]
    engine = SlotEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=64, seed=0)
    pruner = ByNorm()
    sampler = PrunedSampler(SamplingParams(max_new_tokens=24, stop_token_ids=(tok.eos_token_id,)),
                            lambda ids: tok.decode(ids), pruner, over_provision=2, segment_len=4)
    groups, metrics = sampler.generate(engine, prompts, [4, 4, 2], seed=0)
    assert [len(g.rollouts) for g in groups] == [4, 4, 2] and pruner.calls == [8, 8, 4]
    assert metrics["arrol/pruned_rollouts"] == 10 and metrics["arrol/pruning"] == 1
    kept_tokens = sum(r.num_tokens for g in groups for r in g.rollouts)
    # every sampled token is in a kept rollout or was pruned: nothing pruned reaches a group
    assert engine.stats.decode_tokens == kept_tokens + metrics["arrol/pruned_tokens"]
    assert engine.stats.aborted_tokens <= metrics["arrol/pruned_tokens"]
    assert len(sampler.features) == 10 and all(f.shape == (model.config.hidden_size,) for f in sampler.features.values())


def test_the_pruning_point_is_a_fraction_of_the_length_budget():
    assert pruning_point(0.25, 32) == 8 and pruning_point(0.25, 8) == 2 and pruning_point(0.25, 2048) == 512
    assert pruning_point(0.01, 8) == 1  # never before the first token
    for budget, point in ((16, 4), (512, 128)):  # the trainer's controller takes rollout.max_new_tokens
        rollout = type("R", (), {"num_generations": 4, "strategy": "group", "engine": "auto",
                                 "max_new_tokens": budget})()
        assert build_controller(ControlConfig(method="arrol"), rollout, seed=0).segment_len == point


def test_a_short_task_prunes_before_its_rollouts_finish(tiny):
    """The bug of issue 22: a fixed 8-token pruning point on an 8-token task is the end of every
    rollout, so all 2G ran to completion and pruning saved nothing. At a quarter of the length
    budget the pruned rollouts are aborted after 2 tokens: fewer tokens sampled for the same G."""
    model, tok = tiny
    prompts = [Prompt(f"p{i}", t, token_ids=tok(t)["input_ids"]) for i, t in enumerate(["1+2=", "35+7=", "9-4="])]
    params = SamplingParams(max_new_tokens=8, stop_token_ids=(tok.eos_token_id,))
    sampled = {}
    for name, point in (("fixed 8", 8), ("quarter", Arrol(ArrolConfig(), max_new_tokens=8).segment_len)):
        engine = SlotEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=64, seed=0)
        sampler = PrunedSampler(params, lambda ids: tok.decode(ids), ByNorm(), over_provision=2, segment_len=point)
        groups, metrics = sampler.generate(engine, prompts, [4, 4, 4], seed=0)
        assert [len(g.rollouts) for g in groups] == [4, 4, 4] and metrics["arrol/pruned_rollouts"] == 12
        sampled[name] = (engine.stats.decode_tokens, engine.stats.aborted_tokens)
    assert sampled["fixed 8"][1] == 0  # every pruned rollout had already finished: its tokens were wasted
    assert 0 < sampled["quarter"][1] <= 12 * 2  # aborted at the pruning point, 2 tokens each
    assert sampled["quarter"][0] < sampled["fixed 8"][0]


def _rollout(correct):
    return Rollout(prompt_id="p", prompt_ids=[1], completion_ids=[2], behavior_logprobs=[-1.0], versions=[0],
                   finish_reason="stop", score=float(correct), reward=float(correct))


def test_probe_learns_a_separable_signal_then_prunes():
    c = Arrol(ArrolConfig(min_examples=40, probe_steps=200))
    gen = torch.Generator().manual_seed(0)
    assert not c.ready()
    for _ in range(3):
        rollouts = [_rollout(i % 2 == 0) for i in range(20)]
        c.features = {id(r): torch.randn(8, generator=gen) + (2.0 if r.correct else -2.0) * torch.eye(8)[0]
                      for r in rollouts}
        c.observe_step([RolloutGroup(Prompt("p", "p"), rollouts)], None)
    assert len(c.y) == 60 and c.held_out_auc > 0.9 and c.ready()
    p = c.predict(torch.stack([torch.eye(8)[0] * 3, -torch.eye(8)[0] * 3])).tolist()
    assert p[0] > 0.9 > 0.1 > p[1]
    state = c.state_dict()
    again = Arrol(ArrolConfig())
    again.load_state_dict(state)
    assert again.ready() and torch.equal(again.w, c.w)
