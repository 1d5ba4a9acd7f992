"""Harness rollouts (issue 25): agent programs that only know the openai client, trained token-faithfully."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rollwise.config import ConfigError
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.slots import SlotEngine
from rollwise.model.tiny import build_tiny
from rollwise.serve.harness import HarnessSampler, load_harness, segments_of
from rollwise.serve.service import Call, Choice, EpisodeLog
from rollwise.tasks.tool_calls import FORMATS
from rollwise.types import Prompt

pytest.importorskip("openai")


# -- harnesses (no rollwise imports in what they do) ------------------------------------------------
async def two_calls(client, row):
    """Ask, then ask again after the answer: call 2 continues call 1."""
    messages = [{"role": "user", "content": row["prompt"]}]
    first = await client.chat.completions.create(model=row["model"], messages=messages, max_tokens=12)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "and?"}]
    second = await client.chat.completions.create(model=row["model"], messages=messages, max_tokens=12)
    return float(len(second.choices[0].message.content or "") % 2 == 0)


async def rewrites_history(client, row):
    """Call 2 drops call 1 from the conversation: a new segment."""
    await client.chat.completions.create(model=row["model"], messages=[{"role": "user", "content": row["prompt"]}],
                                         max_tokens=6)
    await client.chat.completions.create(model=row["model"], messages=[{"role": "user", "content": "other"}],
                                         max_tokens=6)
    return 1.0


async def raises(client, row):
    await client.chat.completions.create(model=row["model"], messages=[{"role": "user", "content": "x"}], max_tokens=4)
    raise RuntimeError("harness bug")


async def hangs(client, row):
    while True:  # a long generation, then another: always in flight when the timeout strikes
        await client.chat.completions.create(model=row["model"], messages=[{"role": "user", "content": "x"}],
                                             max_tokens=400)


def not_async(client, row):
    return 1.0


@pytest.fixture(scope="module")
def engine_and_tok():
    torch.manual_seed(0)
    model, tok = build_tiny("tiny", seed=0)
    return SlotEngine(model.eval(), pad_token_id=tok.pad_token_id or 0, max_batch_size=16), tok


def sampler(engine_and_tok, harness, timeout=60.0, max_new_tokens=40):
    _, tok = engine_and_tok
    return HarnessSampler(SamplingParams(max_new_tokens=max_new_tokens), tok, FORMATS["plain"], harness, timeout)


def digits_stop(tok):
    """End turns at a digit too, so a random model's turns end with a stop id (and can be continued)."""
    return tuple(tok(c, add_special_tokens=False)["input_ids"][0] for c in "0123456789") + (tok.eos_token_id,)


PROMPTS = [Prompt("p0", "12+7="), Prompt("p1", "3+4=")]


# -- rebuilding trajectories --------------------------------------------------------------------------
def _choice(prompt, ids):
    return Choice(prompt, ids, [-0.5] * len(ids), [3] * len(ids), "stop", ended=True)


def test_calls_that_extend_each_other_are_one_segment_with_the_inserted_ids_masked():
    log = EpisodeLog((0,), [Call([], [_choice([1, 2], [5, 6])]), Call([], [_choice([1, 2, 5, 6, 9, 9], [7])])])
    (seg,) = segments_of(log)
    assert seg.prompt_ids == [1, 2] and seg.ids == [5, 6, 9, 9, 7]
    assert seg.weights == [1, 1, 0, 0, 1] and seg.logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5]
    assert [(t.start, t.end) for t in seg.turns] == [(0, 2), (4, 5)]


def test_a_call_that_does_not_extend_starts_a_new_segment():
    log = EpisodeLog((0,), [Call([], [_choice([1, 2], [5, 6])]), Call([], [_choice([1, 3], [7])])])
    first, second = segments_of(log)
    assert (first.prompt_ids, first.ids) == ([1, 2], [5, 6]) and (second.prompt_ids, second.ids) == ([1, 3], [7])


# -- through the endpoint -----------------------------------------------------------------------------
def test_an_episode_is_the_sampled_ids_with_what_came_between(engine_and_tok):
    engine, tok = engine_and_tok
    gen = sampler(engine_and_tok, two_calls)
    gen._serve(engine).service.stop_ids = digits_stop(tok)
    try:
        groups, metrics = gen.generate(engine, PROMPTS, [2, 2], seed=5)
        assert metrics["harness/calls_mean"] == 2 and metrics["harness/failed"] == 0
        assert gen._server.service.episodes == {}  # nothing outlives its episode
        for g in groups:
            for r in g.rollouts:
                assert r.failure is None and r.env_reward in (0.0, 1.0)
                assert not r.segments
                inserted = [i for i, w in zip(r.completion_ids, r.loss_weights) if w == 0]
                # a first turn ended by a stop id is continued from its ids; one cut by max_tokens is rendered
                # afresh, closed by EOS — which still extends the sampled ids, so it is one segment too
                assert tok.decode(inserted) in ("and?", "<eos>and?")
                sampled = torch.tensor([w == 1 for w in r.loss_weights])
                ids = torch.tensor([r.prompt_ids + r.completion_ids])
                with torch.no_grad():
                    logits = engine.model(ids).logits[0, len(r.prompt_ids) - 1:-1]
                own = logits.log_softmax(-1).gather(-1, torch.tensor(r.completion_ids)[:, None])[:, 0]
                assert torch.allclose(torch.tensor(r.behavior_logprobs)[sampled], own[sampled], atol=1e-4)
        again, _ = gen.generate(engine, PROMPTS, [2, 2], seed=5)  # a seed fixes the episodes
        assert [r.completion_ids for g in again for r in g.rollouts] == \
               [r.completion_ids for g in groups for r in g.rollouts]
    finally:
        gen.close()


def test_a_rewritten_history_trains_as_two_segments_of_one_episode(engine_and_tok):
    from rollwise.optim.batch import build_batch
    from rollwise.optim.objective import ObjectiveConfig, assign_advantages

    engine, _ = engine_and_tok
    gen = sampler(engine_and_tok, rewrites_history)
    try:
        groups, metrics = gen.generate(engine, PROMPTS, [2, 2], seed=1)
    finally:
        gen.close()
    assert metrics["harness/segments_mean"] == 2
    for i, g in enumerate(groups):
        for j, r in enumerate(g.rollouts):
            r.reward = float((i + j) % 2)
    assign_advantages(groups, ObjectiveConfig(method="grpo"))
    batch = build_batch(groups, 0)
    assert len(batch) == 8  # 4 episodes x 2 segments
    r = groups[0].rollouts[1]
    assert r.segments[0].advantage == [r.advantage[0]] * len(r.segments[0].completion_ids)


@pytest.mark.parametrize("harness, timeout, says", [(raises, 60.0, "raised RuntimeError: harness bug"),
                                                     (hangs, 0.2, "ran past rollout.harness_timeout")])
def test_a_harness_that_crashes_or_hangs_scores_zero_with_the_reason(engine_and_tok, harness, timeout, says):
    from rollwise.filter.rewards import RewardFn, score_groups

    engine, _ = engine_and_tok
    gen = sampler(engine_and_tok, harness, timeout=timeout)
    try:
        groups, metrics = gen.generate(engine, PROMPTS[:1], [2], seed=0)
        assert metrics["harness/failed"] == 1.0
        assert gen._server.service.episodes == {}
        ok = sampler(engine_and_tok, two_calls)  # the engine and a new endpoint still serve
        assert ok.generate(engine, PROMPTS[:1], [1], seed=0)[1]["harness/failed"] == 0
        ok.close()
    finally:
        gen.close()
    always = RewardFn("always", lambda prompts, completions, **_: [1.0] * len(completions))
    score_groups(groups, [always])
    for r in groups[0].rollouts:
        assert says in r.failure and r.reward == 0.0 and says in r.reward_reasons["failure"]


def test_bad_harness_specs_are_config_errors():
    with pytest.raises(ConfigError, match="package.module:function"):
        load_harness("no_colon")
    with pytest.raises(ConfigError, match="cannot import module"):
        load_harness("no_such_module_xyz:rollout")
    with pytest.raises(ConfigError, match="must be an `async def not_async"):
        load_harness("test_harness:not_async")
    assert asyncio.iscoroutinefunction(load_harness("test_harness:two_calls"))


# -- training -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [[], ["train.mode=async", "train.max_staleness=1", "train.generation_threads=1"]],
                         ids=["sync", "async"])
def test_rl_steps_on_harness_episodes_move_the_policy(tmp_path, mode):
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    cfg = load_run_config(None, [f"output_dir={tmp_path}", "task.max_digits=2", "task.eval_size=4",
                                 "rollout.prompts_per_step=2", "rollout.num_generations=4", "rollout.max_new_tokens=30",
                                 "rollout.harness=test_harness:two_calls", "optim.micro_batch_size=8",
                                 "model.threads=1", "train.eval_samples=0", "optim.lr=1e-2", *mode])
    with Trainer(cfg) as trainer:
        trainer.prepare()
        before = [p.detach().clone() for p in trainer.model.parameters()]
        metrics = [trainer.step() for _ in range(3)]
        assert all(m["harness/calls_mean"] == 2 for m in metrics)
        assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
        if not mode:  # the endpoint serves the updated policy: what it samples now carries the new version
            groups, _ = trainer.generator.generate(trainer.engine, PROMPTS[:1], [1], seed=0)
            assert trainer.engine.version == 3
            assert set(groups[0].rollouts[0].versions) == {3}
    for bad, says in [(["rollout.environment=calculator"], "choose one"), (["rollout.strategy=tree"], "strategy=group")]:
        with pytest.raises(ConfigError, match=says):
            Trainer(load_run_config(None, [f"output_dir={tmp_path}/b", "rollout.harness=test_harness:two_calls",
                                           *bad])).prepare()


# -- the same episodes as the in-process environment ----------------------------------------------------
class AlwaysCall(type(FORMATS["plain"])):
    """Every finished turn calls the calculator (a random tiny model never writes a call itself)."""

    def parse(self, text):
        from rollwise.tasks.tool_calls import ToolCall

        return [ToolCall("calculate", {"expression": "6*7"})]


def test_the_openai_only_harness_samples_exactly_the_in_process_episodes(engine_and_tok):
    """examples/calculator_harness.py through the endpoint and the built-in calculator environment in
    process: the same prompts and seeds give the same ids, masks and behaviour log-probs — token-faithful."""
    import sys
    from pathlib import Path

    from rollwise.generate.episode import EpisodeSampler
    from rollwise.tasks.environment import episode_envs

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from examples.calculator_harness import rollout

    engine, tok = engine_and_tok
    params = SamplingParams(max_new_tokens=40, stop_token_ids=digits_stop(tok))
    fmt = AlwaysCall()
    inproc = EpisodeSampler(params, tok, episode_envs("calculator", 10.0, 2000), fmt, max_turns=2)
    harness = HarnessSampler(params, tok, fmt, rollout)
    try:
        want, _ = inproc.generate(engine, PROMPTS, [3, 3], seed=11)
        got, metrics = harness.generate(engine, PROMPTS, [3, 3], seed=11)
    finally:
        harness.close()
    assert metrics["harness/failed"] == 0 and metrics["harness/segments_mean"] == 1
    pairs = [(a, b) for gw, gg in zip(want, got) for a, b in zip(gw.rollouts, gg.rollouts)]
    assert any(a.loss_weights for a, _ in pairs)  # some episodes did insert a tool result
    for a, b in pairs:
        assert (b.prompt_ids, b.completion_ids, b.loss_weights) == (a.prompt_ids, a.completion_ids, a.loss_weights)
        assert torch.allclose(torch.tensor(b.behavior_logprobs), torch.tensor(a.behavior_logprobs), atol=1e-5)
