"""Harness rollouts (issue 25): agent programs that only know the openai client, trained token-faithfully."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace

import pytest
import torch

from rollwise.config import ConfigError
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.slots import SlotEngine
from rollwise.model.tiny import build_tiny
from rollwise.serve.harness import Endpoint, Endpoints, HarnessSampler, load_harness, segments_of
from rollwise.serve.service import Call, Choice, EpisodeLog
from rollwise.tasks.tool_calls import FORMATS
from rollwise.types import Prompt

pytest.importorskip("openai")


# the harnesses (tests/harness_agents.py) know only the openai client; they run in the harness worker process
from bounded import bounded  # noqa: E402
from harness_agents import (HANG_PROMPT, crc, exits, hangs, main_side_main, n_choices, raises,  # noqa: E402
                            rewrites_forever, rewrites_history, sleeps, spins, two_calls, two_calls_crc)


@pytest.fixture(scope="module")
def engine_and_tok():
    torch.manual_seed(0)
    model, tok = build_tiny("tiny", seed=0)
    return SlotEngine(model.eval(), pad_token_id=tok.pad_token_id or 0, max_batch_size=16), tok


def sampler(engine_and_tok, harness, timeout=60.0, max_new_tokens=40, stop_ids=()):
    _, tok = engine_and_tok
    params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=tuple(stop_ids))
    return HarnessSampler(params, tok, FORMATS["plain"], harness, timeout)


class Stalled:
    """The engine, except that what it runs never finishes: every call stays in flight until it is aborted."""

    def __init__(self, engine):
        self._inner = engine

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def step(self):
        time.sleep(0.01)  # no progress to make (keeps the driver's loop from spinning)
        return []


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


def test_endpoints_are_one_per_engine_shared_by_copies_and_an_idle_old_one_retires():
    class Stub:  # a server and a worker: what closing them did
        closed = False

        def close(self):
            self.closed = True

        kill = close

    made = []

    def make(engine):
        made.append(Endpoint(Stub(), Stub()))
        return made[-1]

    endpoints = Endpoints(keep=2)
    a, b = object(), object()
    assert endpoints.get(a, make) is endpoints.get(a, make)  # one per engine
    endpoints.get(b, make)
    with made[0].lock:  # a batch runs on a's endpoint: it is not retired, though least recently used
        endpoints.get(object(), make)
    assert [ep.server.closed or ep.worker.closed for ep in made] == [False, True, False]
    endpoints.close()
    assert all(ep.server.closed and ep.worker.closed for ep in made)
    with pytest.raises(RuntimeError, match="closed"):  # a producer still running after close starts nothing
        endpoints.get(a, make)


# -- through the endpoint -----------------------------------------------------------------------------
def test_an_episode_is_the_sampled_ids_with_what_came_between(engine_and_tok):
    engine, tok = engine_and_tok
    gen = sampler(engine_and_tok, two_calls_crc, stop_ids=digits_stop(tok))
    try:
        groups, metrics = gen.generate(engine, PROMPTS, [2, 2], seed=5)
        assert metrics["harness/calls_mean"] == 2 and metrics["harness/failed"] == 0
        assert gen.server(engine).service.episodes == {}  # nothing outlives its episode
        finals = set()
        for g in groups:
            for r in g.rollouts:
                # the harness's reward names the last reply it got: the reward is this episode's, and what a
                # verifier reads (the last message, the completion text) is that reply
                final = r.messages[-1]
                assert r.failure is None and final["role"] == "assistant"
                assert r.env_reward == crc(final["content"]) == crc(r.completion_text)
                finals.add(final["content"])
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
        assert len(finals) > 1  # the episodes' replies differ: a reward handed to the wrong episode would show
        again, _ = gen.generate(engine, PROMPTS, [2, 2], seed=5)  # a seed fixes the episodes
        assert [r.completion_ids for g in again for r in g.rollouts] == \
               [r.completion_ids for g in groups for r in g.rollouts]
    finally:
        gen.close()


def test_the_main_segment_is_the_one_holding_the_final_call(engine_and_tok):
    """main → side call → main: the episode's rollout (what the verifier reads) is the main conversation's
    segment, ending with the final call's reply — not the side call's, though that segment was made last."""
    engine, tok = engine_and_tok
    gen = sampler(engine_and_tok, main_side_main, stop_ids=digits_stop(tok))
    try:
        groups, metrics = gen.generate(engine, PROMPTS, [2, 2], seed=3)
    finally:
        gen.close()
    assert metrics["harness/failed"] == 0
    for g in groups:
        for r in g.rollouts:
            assert any("side" in tok.decode(s.prompt_ids) for s in r.segments)  # the side call rides along
            assert "side" not in tok.decode(r.prompt_ids) and g.prompt.text in tok.decode(r.prompt_ids)
            last = r.turns[-1]
            final = tok.decode(r.completion_ids[last.start:last.end], skip_special_tokens=True)
            assert r.env_reward == crc(final) == crc(r.messages[-1]["content"]) == crc(r.completion_text)
    # where the final call continued the first one token for token, main is the segment made first
    assert any(len(r.turns) == 2 for g in groups for r in g.rollouts)


def test_with_n_choices_the_main_segment_is_choice_0_of_the_final_call(engine_and_tok):
    engine, tok = engine_and_tok
    gen = sampler(engine_and_tok, n_choices)
    try:
        groups, metrics = gen.generate(engine, PROMPTS[:1], [2], seed=4)
    finally:
        gen.close()
    assert metrics["harness/failed"] == 0 and metrics["harness/segments_mean"] == 3
    for r in groups[0].rollouts:
        texts = {tok.decode(s.completion_ids, skip_special_tokens=True) for s in [r, *r.segments]}
        assert len(texts) > 1  # the choices differ: the test can tell them apart
        assert r.env_reward == crc(r.completion_text) == crc(r.messages[-1]["content"])


@pytest.mark.parametrize("max_new_tokens, max_segments", [(24, 16), (400, 3)], ids=["tokens", "segments"])
def test_an_episode_stays_within_its_budgets_whatever_its_harness_does(engine_and_tok, max_new_tokens, max_segments):
    """A harness that starts a fresh conversation on every call (each a new segment, each asking for all the
    tokens it may) samples at most rollout.max_new_tokens in the whole episode, over every segment and choice,
    and starts at most rollout.harness_max_segments segments; the call past either ends the episode."""
    engine, tok = engine_and_tok
    params = SamplingParams(max_new_tokens=max_new_tokens)
    gen = HarnessSampler(params, tok, FORMATS["plain"], rewrites_forever, 60.0, max_segments=max_segments)
    try:
        groups, metrics = bounded(gen.generate, engine, PROMPTS[:1], [2], 6)
    finally:
        gen.close()
    for r in groups[0].rollouts:
        rows = [r, *(r.segments or [])]
        sampled = sum(sum(s.loss_weights) if s.loss_weights else len(s.completion_ids) for s in rows)
        assert r.failure is None and 0 < sampled <= max_new_tokens and len(rows) <= max_segments


def test_the_run_endpoint_answers_only_its_key_and_the_episodes_it_opened(engine_and_tok):
    """Nobody else may train the policy: a call without the run's key, or on a tag the run did not open, is
    refused (the harness's own client sends the key; tests/test_serve.py checks the guard itself)."""
    import httpx

    engine, _ = engine_and_tok
    gen, other = sampler(engine_and_tok, two_calls), sampler(engine_and_tok, two_calls)
    try:
        server = gen.server(engine)
        assert gen.api_key != other.api_key and len(gen.api_key) >= 32  # a random key per run
        body = {"model": "policy", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
        url = f"{server.episode_url('0-0-0')}/chat/completions"
        assert httpx.post(url, json=body, timeout=30).status_code == 401
        assert httpx.post(url, json=body, headers={"Authorization": f"Bearer {other.api_key}"},
                          timeout=30).status_code == 401
        assert httpx.post(url, json=body, headers={"Authorization": f"Bearer {gen.api_key}"},
                          timeout=30).status_code == 404  # not an episode the run opened
    finally:
        gen.close()
        other.close()


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


def assert_failed_scores_zero(group, says: str) -> None:
    """Scored by a reward that gives every completion 1, each failed episode of ``group`` scores 0 and says why."""
    from rollwise.filter.rewards import RewardFn, score_groups

    always = RewardFn("always", lambda prompts, completions, **_: [1.0] * len(completions))
    score_groups([group], [always])
    for r in group.rollouts:
        assert says in r.failure and r.reward == 0.0 and says in r.reward_reasons["failure"]


def test_a_harness_that_crashes_scores_zero_with_the_reason(engine_and_tok):
    engine, _ = engine_and_tok
    gen = sampler(engine_and_tok, raises)
    try:
        groups, metrics = gen.generate(engine, PROMPTS[:1], [2], seed=0)
        assert metrics["harness/failed"] == 1.0
        assert gen.server(engine).service.episodes == {}
    finally:
        gen.close()
    assert_failed_scores_zero(groups[0], "raised RuntimeError: harness bug")


def test_a_harness_past_its_timeout_has_its_calls_aborted_in_the_engine(engine_and_tok):
    """Each episode's call is in flight when its timeout strikes (the stalled engine never finishes one): the
    episode scores 0 with the reason, its call is aborted in the engine, and the engine then serves on."""
    engine, _ = engine_and_tok
    gen = sampler(engine_and_tok, hangs, timeout=4.0)
    aborted = engine.stats.aborted
    try:
        groups, metrics = bounded(gen.generate, Stalled(engine), PROMPTS[:1], [2], 0)
    finally:
        gen.close()
    assert metrics["harness/failed"] == 1.0
    assert engine.stats.aborted - aborted == 2  # one call per episode, aborted when its episode ended
    ok = sampler(engine_and_tok, two_calls)  # the engine and a new endpoint still serve
    try:
        assert ok.generate(engine, PROMPTS[:1], [1], seed=0)[1]["harness/failed"] == 0
    finally:
        ok.close()
    assert_failed_scores_zero(groups[0], "ran past rollout.harness_timeout (4 s)")


@pytest.mark.parametrize("harness", [sleeps, spins], ids=["time.sleep", "cpu-loop"])
def test_a_harness_that_blocks_its_event_loop_ends_at_its_timeout_and_the_next_step_runs(engine_and_tok, harness):
    """A blocking call or a loop that never yields, inside the harness coroutine, cannot stall the engine or
    outlive rollout.harness_timeout: the episodes fail with the reason, counted, and the next step works."""
    from rollwise.filter.rewards import RewardFn, score_groups

    engine, _ = engine_and_tok
    gen = sampler(engine_and_tok, harness, timeout=2.0)
    try:
        stuck, metrics = bounded(gen.generate, engine, [Prompt("h", HANG_PROMPT)], [2], 0)
        assert metrics["harness/failed"] == 1.0
        assert metrics["harness/restarts"] == 1  # its process did not answer: killed
        # the next step, on a new process (a copy of the sampler shares its endpoints and processes; a longer
        # timeout so a loaded machine cannot fail these episodes)
        groups, metrics = bounded(replace(gen, timeout=60.0).generate, engine, PROMPTS[:1], [2], 0)
        assert metrics["harness/failed"] == 0 and metrics["harness/calls_mean"] == 2
        assert gen.server(engine).service.episodes == {}
    finally:
        gen.close()
    always = RewardFn("always", lambda prompts, completions, **_: [1.0] * len(completions))
    score_groups(stuck, [always])
    for r in stuck[0].rollouts:
        assert "rollout.harness_timeout (2 s)" in r.failure and r.reward == 0.0


def test_a_harness_whose_process_dies_fails_its_episodes_and_the_next_step_runs(engine_and_tok):
    engine, _ = engine_and_tok
    gen = sampler(engine_and_tok, exits)
    try:
        dead, metrics = bounded(gen.generate, engine, [Prompt("h", HANG_PROMPT)], [2], 0)
        assert metrics["harness/failed"] == 1.0 and metrics["harness/restarts"] == 1
        assert all(r.failure == "the harness process exited (code 3)" for r in dead[0].rollouts)
        assert bounded(gen.generate, engine, PROMPTS[:1], [2], 0)[1]["harness/failed"] == 0
    finally:
        gen.close()


def test_a_row_the_harness_process_cannot_read_fails_only_its_episode(engine_and_tok, monkeypatch):
    """Rows travel pickled one by one: a column of a class only the training process has (here a module made
    at run time) fails that episode with the reason; a column that cannot be pickled at all goes as its repr."""
    import sys
    import types

    here_only = types.ModuleType("made_in_the_training_process")

    class Thing:
        pass

    Thing.__module__, Thing.__qualname__ = here_only.__name__, "Thing"
    here_only.Thing = Thing
    monkeypatch.setitem(sys.modules, here_only.__name__, here_only)
    engine, _ = engine_and_tok
    prompts = [Prompt("odd", "1+1=", columns={"thing": Thing()}), Prompt("ok", "2+2=", columns={"f": lambda: 0})]
    gen = sampler(engine_and_tok, two_calls)
    try:
        groups, metrics = bounded(gen.generate, engine, prompts, [1, 1], 0)
    finally:
        gen.close()
    (odd,), (ok,) = [g.rollouts for g in groups]
    assert "cannot unpickle the row" in odd.failure and ok.failure is None and metrics["harness/failed"] == 0.5


def test_bad_harness_specs_are_config_errors():
    with pytest.raises(ConfigError, match="package.module:function"):
        load_harness("no_colon")
    with pytest.raises(ConfigError, match="cannot import module"):
        load_harness("no_such_module_xyz:rollout")
    with pytest.raises(ConfigError, match="must be an `async def not_async"):
        load_harness("harness_agents:not_async")
    assert asyncio.iscoroutinefunction(load_harness("harness_agents:two_calls"))


# -- training -----------------------------------------------------------------------------------------
BASE = ["task.max_digits=2", "task.eval_size=4", "rollout.prompts_per_step=2", "rollout.num_generations=4",
        "rollout.max_new_tokens=30", "rollout.harness=harness_agents:two_calls", "optim.micro_batch_size=8",
        "model.threads=1", "train.eval_samples=0", "optim.lr=1e-2"]


def test_rl_steps_on_harness_episodes_move_the_policy(tmp_path):
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    with Trainer(load_run_config(None, [f"output_dir={tmp_path}", *BASE])) as trainer:
        trainer.prepare()
        before = [p.detach().clone() for p in trainer.model.parameters()]
        metrics = [trainer.step() for _ in range(3)]
        assert all(m["harness/calls_mean"] == 2 for m in metrics)
        assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
        # the endpoint serves the updated policy: what it samples now carries the new version
        groups, _ = trainer.generator.generate(trainer.engine, PROMPTS[:1], [1], seed=0)
        assert trainer.engine.version == 3
        assert set(groups[0].rollouts[0].versions) == {3}
    for bad, says in [(["rollout.environment=calculator"], "choose one"), (["rollout.strategy=tree"], "strategy=group")]:
        with pytest.raises(ConfigError, match=says):
            Trainer(load_run_config(None, [f"output_dir={tmp_path}/b", "rollout.harness=harness_agents:two_calls",
                                           *bad])).prepare()


def test_async_training_with_evals_keeps_every_endpoint_and_leaks_none(tmp_path):
    """train.mode=async evaluates on the trainer's engine while the producer samples on its own: an eval
    never closes the producer's endpoint (every episode after the first eval would fail and score 0), and
    closing the trainer stops every endpoint and harness process the run started."""
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    cfg = load_run_config(None, [f"output_dir={tmp_path}", *BASE, "train.mode=async", "train.max_staleness=1",
                                 "train.generation_threads=1", "train.eval_every=1", "train.steps=4"])
    threads = set(threading.enumerate())
    steps, evals = [], []
    with Trainer(cfg) as trainer:
        trainer.prepare()
        bounded(trainer.fit, None, lambda step, m: steps.append(m), lambda step, r: evals.append(r), limit=300)
    assert len(steps) == 4 and len(evals) == 5  # at the start and after every step
    assert [m["harness/failed"] for m in steps] == [0.0] * 4
    assert sum(m["reward/mean"] for m in steps[1:]) > 0  # episodes after the first eval still score
    assert not [s["reasons"]["failure"] for e in evals for s in e.samples if "failure" in s["reasons"]]
    started = [t for t in threading.enumerate() if t not in threads and t.name.startswith("rollwise-")]
    for t in started:
        t.join(timeout=30)  # a harness process's reader ends when the process has
    assert not [t.name for t in started if t.is_alive()]  # no endpoint or harness process outlives the run


# -- the same episodes as the in-process environment ----------------------------------------------------
class AlwaysCall(type(FORMATS["plain"])):
    """Every finished turn calls the calculator (a random tiny model never writes a call itself)."""

    def parse(self, text):
        from rollwise.tasks.tool_calls import ToolCall

        return [ToolCall("calculate", {"expression": "6*7"})]


def calculator_pairs(engine, tok, fmt, prompts, seed: int) -> list:
    """Two-turn calculator episodes of ``prompts`` (3 each), sampled in process and through
    examples/calculator_harness.py's agent and the endpoint, paired rollout by rollout (in-process
    first); the harness failed none and continued every episode in one segment."""
    import sys
    from pathlib import Path

    from rollwise.generate.episode import EpisodeSampler
    from rollwise.tasks.environment import episode_envs

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from examples.calculator_harness import rollout

    params = SamplingParams(max_new_tokens=40, stop_token_ids=digits_stop(tok))
    inproc = EpisodeSampler(params, tok, episode_envs("calculator", 10.0, 2000), fmt, max_turns=2)
    harness = HarnessSampler(params, tok, fmt, rollout)
    try:
        want, _ = inproc.generate(engine, prompts, [3] * len(prompts), seed=seed)
        got, metrics = harness.generate(engine, prompts, [3] * len(prompts), seed=seed)
    finally:
        harness.close()
    assert metrics["harness/failed"] == 0 and metrics["harness/segments_mean"] == 1
    return [(a, b) for gw, gg in zip(want, got) for a, b in zip(gw.rollouts, gg.rollouts)]


def assert_same_episodes(pairs: list) -> None:
    """Token-faithful: the same prompt, sampled and inserted ids, masks and behaviour log-probs."""
    assert any(a.loss_weights for a, _ in pairs)  # some episodes did insert a tool result
    for a, b in pairs:
        assert (b.prompt_ids, b.completion_ids, b.loss_weights) == (a.prompt_ids, a.completion_ids, a.loss_weights)
        assert torch.allclose(torch.tensor(b.behavior_logprobs), torch.tensor(a.behavior_logprobs), atol=1e-5)


def test_the_openai_only_harness_samples_exactly_the_in_process_episodes(engine_and_tok):
    """examples/calculator_harness.py through the endpoint and the built-in calculator environment in
    process: the same prompts and seeds give the same ids, masks and behaviour log-probs — token-faithful."""
    engine, tok = engine_and_tok
    assert_same_episodes(calculator_pairs(engine, tok, AlwaysCall(), PROMPTS, seed=11))
