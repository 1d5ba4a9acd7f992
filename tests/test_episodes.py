"""Multi-turn episodes (issue 24): tool-call formats, tool containment, the episode loop, the mask."""

from __future__ import annotations

import time

import pytest

from rollwise.config import ConfigError
from rollwise.engine.engine import Completion
from rollwise.engine.sampling import SamplingParams
from rollwise.generate.episode import EpisodeSampler
from rollwise.model.tiny import char_tokenizer
from rollwise.tasks.environment import EpisodeEnv, call_tool, load_environment, tools_of
from rollwise.tasks.envs import Calculator, GuessNumber, arithmetic
from rollwise.tasks.tool_calls import FORMATS, ToolCall, tool_format
from rollwise.types import Prompt

HERMES, PLAIN = FORMATS["hermes"], FORMATS["plain"]


# -- formats ----------------------------------------------------------------------------------
def test_hermes_reads_one_or_several_calls():
    text = ('I will call.<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+2"}}\n</tool_call>'
            '<tool_call>{"name": "guess", "arguments": "{\\"number\\": 5}"}</tool_call>')
    assert HERMES.parse(text) == [ToolCall("calculate", {"expression": "2+2"}), ToolCall("guess", {"number": 5})]
    assert HERMES.parse("no call here") == []


@pytest.mark.parametrize("body, says", [
    ("{not json}", "not valid JSON"),
    ('{"arguments": {}}', '"name" string'),
    ('{"name": "f", "arguments": [1]}', "must be a JSON object"),
    ('{"name": "f", "arguments": "[1"}', "not a JSON object"),
])
def test_hermes_malformed_calls_come_back_with_a_reason(body, says):
    (call,) = HERMES.parse(f"<tool_call>{body}</tool_call>")
    assert call.error is not None and says in call.error


def test_unclosed_calls_are_errors_not_silence():
    assert HERMES.parse('<tool_call>{"name": "f"')[0].error.startswith("a <tool_call> without")
    assert PLAIN.parse("<call>f(1)")[0].error.startswith("a <call> without")


def test_plain_reads_literals_and_never_evaluates():
    assert PLAIN.parse('x<call>calculate("3*4")</call>y<call>f(1, k=[2])</call>') == [
        ToolCall("calculate", {}, ("3*4",)), ToolCall("f", {"k": [2]}, (1,))]
    (bad,) = PLAIN.parse("<call>f(__import__('os').system('true'))</call>")
    assert bad.error == "arguments must be literals (numbers, strings, lists, dicts)"
    assert PLAIN.parse("<call>1 +</call>")[0].error.startswith("cannot read the call")


def test_auto_format_follows_the_chat_template():
    tok = char_tokenizer()
    assert tool_format("auto", tok) is PLAIN
    with pytest.raises(ValueError, match="has none; use rollout.tool_format=plain"):
        tool_format("hermes", tok)


# -- tools --------------------------------------------------------------------------------------
class Hostile:
    def reset(self, **row):
        return None

    def slow(self, seconds: float) -> str:
        """Sleep.

        Args:
            seconds: how long
        """
        time.sleep(seconds)
        return "woke"

    def boom(self) -> str:
        """Raise."""
        raise RuntimeError("tool bug")

    def huge(self) -> str:
        """Ten megabytes."""
        return "x" * 10_000_000


def test_tools_come_from_public_methods_with_their_schemas():
    tools = tools_of(Calculator())
    assert list(tools) == ["calculate"]
    fn = tools["calculate"].schema["function"]
    assert fn["name"] == "calculate" and fn["parameters"]["required"] == ["expression"]


def test_a_tool_without_a_docstring_is_a_config_error():
    class NoDoc:
        def reset(self, **row):
            return None

        def tool(self, x: int) -> int:
            return x

    with pytest.raises(ConfigError, match="NoDoc.tool: cannot build its schema"):
        tools_of(NoDoc())


def test_failing_tools_become_messages_with_their_kind():
    tools = tools_of(Hostile())
    unknown = call_tool(tools, ToolCall("nope"), 1.0, 100)
    assert unknown.error == "unknown_tool" and "boom, huge, slow" in unknown.text
    assert call_tool(tools, ToolCall("slow", {"minutes": 1}), 1.0, 100).error == "bad_arguments"
    raised = call_tool(tools, ToolCall("boom"), 1.0, 100)
    assert raised.error == "raised" and "RuntimeError: tool bug" in raised.text
    hung = call_tool(tools, ToolCall("slow", {"seconds": 30.0}), 0.05, 100)  # the tool really ran and hung
    assert hung.error == "timeout" and "timed out after 0.05 s" in hung.text
    big = call_tool(tools, ToolCall("huge"), 5.0, 100)
    assert big.truncated and len(big.text) < 200 and "9999900 more characters cut" in big.text
    assert call_tool(tools, ToolCall("x", error="bad json"), 1.0, 100).error == "parse"


def test_calculator_is_exact_and_refuses_code():
    assert arithmetic("123456789 * 987654321") == 121932631112635269
    assert Calculator().calculate("(12 + 7) * 3") == "57"
    for bad in ("__import__('os')", "2 ** 10 ** 9", "x + 1"):
        with pytest.raises(ValueError):
            arithmetic(bad)


def test_guess_number_answers_and_scores():
    env = GuessNumber()
    env.reset(secret=42)
    assert [env.guess(50), env.guess(30), env.guess(42)] == ["lower", "higher", "correct"]
    assert env.get_reward() == 1.0 and env.observation_key() == "50:lower|30:higher|42:correct"


def test_load_environment_names_the_problem():
    assert load_environment("calculator") is Calculator
    with pytest.raises(ConfigError, match="neither a built-in"):
        load_environment("nothing")
    with pytest.raises(ConfigError, match="cannot import module"):
        load_environment("no_such_module_xyz:Env")
    with pytest.raises(ConfigError, match="no reset"):
        load_environment("rollwise.tasks.envs:arithmetic")


# -- the episode loop, with a scripted "model" ---------------------------------------------------
class ScriptedEngine:
    """A TokenEngine whose "model" writes ``script(prompt_text) -> text`` then EOS (log-prob -0.5 per id)."""

    version = 0

    def __init__(self, tok, script):
        self.tok, self.script, self.queue, self.prompts, self.prompt_ids = tok, script, {}, [], []

    def submit(self, requests):
        handles = []
        for r in requests:
            text = self.tok.decode(r.prompt_ids, skip_special_tokens=False)
            self.prompts.append(text)
            self.prompt_ids.append(list(r.prompt_ids))
            out = self.write(text, r)  # text, or the exact ids the "model" samples
            ids = (out if isinstance(out, list) else self.tok(out, add_special_tokens=False)["input_ids"]) + [
                self.tok.eos_token_id]
            ids = ids[: r.params.max_new_tokens]
            reason = "stop" if ids[-1] == self.tok.eos_token_id else "length"
            h = len(self.prompts)
            self.queue[h] = Completion(h, list(r.prompt_ids), ids, [-0.5] * len(ids), [0] * len(ids), reason)
            handles.append(h)
        return handles

    def write(self, text, request):
        return self.script(text)

    def run_until(self, condition=None):
        done, self.queue = self.queue, {}
        return done


def calculator_script(prompt_text: str) -> str:
    return "408" if "<result>" in prompt_text else '<call>calculate("12*34")</call>'


def sampler(tok, env=Calculator, max_new_tokens=64, max_turns=4):
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop_token_ids=(tok.eos_token_id,))
    return EpisodeSampler(params, tok, lambda: EpisodeEnv(env(), 5.0, 2000), PLAIN, max_turns=max_turns)


def test_a_scripted_episode_is_exactly_the_sampled_and_inserted_ids():
    tok = char_tokenizer()
    prompt = Prompt("p0", "What is 12*34? ", answer="408")
    (group,), metrics = sampler(tok).generate(ScriptedEngine(tok, calculator_script), [prompt], [1], seed=0)
    (r,) = group.rollouts
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = tok.eos_token_id
    turn1, inserted, turn2 = ids('<call>calculate("12*34")</call>') + [eos], ids("<result>408</result>"), ids("408") + [eos]
    assert r.completion_ids == turn1 + inserted + turn2
    assert r.loss_weights == [1] * len(turn1) + [0] * len(inserted) + [1] * len(turn2)
    assert r.behavior_logprobs == [-0.5] * len(turn1) + [0.0] * len(inserted) + [-0.5] * len(turn2)
    assert [(t.start, t.end) for t in r.turns] == [(0, len(turn1)), (len(turn1 + inserted), len(r.completion_ids))]
    assert r.messages == [{"role": "assistant", "content": '<call>calculate("12*34")</call>'},
                          {"role": "tool", "name": "calculate", "content": "408"},
                          {"role": "assistant", "content": "408"}]
    assert r.finish_reason == "stop" and metrics["episode/tool_calls"] == 1.0


def test_errors_are_counted_and_turns_are_bounded():
    tok = char_tokenizer()
    script = lambda text: "<call>nope(1)</call>"  # noqa: E731 — a model that never stops calling a missing tool
    (group,), metrics = sampler(tok, max_new_tokens=400, max_turns=3).generate(
        ScriptedEngine(tok, script), [Prompt("p", "q ")], [2], seed=0)
    assert all(len(r.turns) == 3 for r in group.rollouts)
    assert metrics["episode/unknown_tool"] == 4.0  # two episodes × the two turns that were answered
    assert "unknown tool 'nope'" in group.rollouts[0].messages[1]["content"]


def test_the_token_budget_counts_inserted_ids():
    tok = char_tokenizer()
    (group,), _ = sampler(tok, max_new_tokens=40).generate(
        ScriptedEngine(tok, calculator_script), [Prompt("p", "q ")], [1], seed=0)
    (r,) = group.rollouts
    assert len(r.completion_ids) <= 40 and r.finish_reason == "length"


def test_the_environment_reward_is_a_component():
    from rollwise.filter.rewards import score_groups

    tok = char_tokenizer()
    script = lambda text: "<call>guess(7)</call>" if "<result>" not in text else "done"  # noqa: E731
    groups, _ = sampler(tok, env=GuessNumber).generate(
        ScriptedEngine(tok, script), [Prompt("a", "guess ", columns={"secret": 7}),
                                      Prompt("b", "guess ", columns={"secret": 9})], [1, 1], seed=0)
    score_groups(groups, [])
    assert [g.rollouts[0].reward for g in groups] == [1.0, 0.0]
    assert groups[0].rollouts[0].reward_components == {"environment": 1.0}
    assert groups[0].rollouts[0].turns[1].state == "7:correct"


def no_answer_script(prompt_text: str) -> str:
    """Asks the calculator for the right number, then answers without it."""
    return "I cannot say" if "<result>" in prompt_text else '<call>calculate("12*34")</call>'


def test_the_verifier_reads_the_final_turn_not_the_tool_output():
    """The calculator's result holds the right number and the final turn does not: scored 0 (before, the
    verifier read every message joined, and a lenient reader took the tool's 408 as the answer)."""
    from rollwise.filter.math_answer import math_answer
    from rollwise.filter.rewards import RewardFn, score_groups

    tok = char_tokenizer()
    (group,), _ = sampler(tok).generate(ScriptedEngine(tok, no_answer_script),
                                        [Prompt("p", "What is 12*34? ", answer="408")], [1], seed=0)
    (r,) = group.rollouts
    assert r.messages[1]["content"] == "408" and r.messages[-1] == {"role": "assistant", "content": "I cannot say"}
    assert r.completion_text == "I cannot say"  # the final turn's sampled ids, decoded alone
    score_groups([group], [RewardFn("math", math_answer)])
    assert r.reward == 0.0
    (right,), _ = sampler(tok).generate(ScriptedEngine(tok, calculator_script),
                                        [Prompt("p", "What is 12*34? ", answer="408")], [1], seed=0)
    score_groups([right], [RewardFn("math", math_answer)])
    assert right.rollouts[0].reward == 1.0  # the same verifier on a final turn that answers


def test_messages_end_with_the_final_turn_when_the_budget_cuts_the_results():
    tok = char_tokenizer()
    (group,), _ = sampler(tok, max_new_tokens=40).generate(
        ScriptedEngine(tok, calculator_script), [Prompt("p", "q ")], [1], seed=0)
    (r,) = group.rollouts
    assert r.finish_reason == "length"
    assert r.messages == [{"role": "assistant", "content": '<call>calculate("12*34")</call>'}]


# -- hermes through a chat template (ChatML, which ignores `tools`, as SmolLM2's does) ----------------
@pytest.fixture(scope="module")
def chat_tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from qwen2model import build_qwen2

    return AutoTokenizer.from_pretrained(build_qwen2(tmp_path_factory.mktemp("qwen2") / "model"))


def test_hermes_episode_inserts_the_templates_tool_message_ids(chat_tok):
    tok = chat_tok
    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "12*34"}}</tool_call>'
    script = lambda text: "408" if "<|im_start|>tool" in text else call  # noqa: E731
    params = SamplingParams(temperature=1.0, max_new_tokens=200, stop_token_ids=(tok.eos_token_id,))
    episodes = EpisodeSampler(params, tok, lambda: EpisodeEnv(Calculator(), 5.0, 2000), HERMES)
    engine = ScriptedEngine(tok, script)
    (group,), _ = episodes.generate(engine, [Prompt("p", "What is 12*34?", messages=[
        {"role": "user", "content": "What is 12*34?"}])], [1], seed=0)
    (r,) = group.rollouts
    # the template ignores tools, so they are described in a system message the model sees first
    assert engine.prompts[0].startswith("<|im_start|>system\nYou can call these tools.")
    assert '"name": "calculate"' in engine.prompts[0]
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    first_end = r.turns[0].end
    inserted = r.completion_ids[first_end: r.turns[1].start]
    assert inserted == ids("\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n")
    # the second turn's prompt is the first prompt + the exact ids so far, never re-tokenized text
    assert r.completion_ids[:first_end] == ids(call) + [tok.eos_token_id]
    assert r.loss_weights[first_end: r.turns[1].start] == [0] * len(inserted)
    assert r.messages[1] == {"role": "tool", "name": "calculate", "content": "408"}


# -- on the slot engine: turns continue from the kept cache, token-faithfully --------------------
class AlwaysCall(type(PLAIN)):
    """Every finished turn calls the calculator (a random tiny model never writes a call itself)."""

    def parse(self, text):
        return [ToolCall("calculate", {"expression": "6*7"})]


class NoResume:
    """The engine without ``resume``: the episode loop re-submits the whole conversation each turn."""

    def __init__(self, engine):
        self.engine = engine

    def submit(self, requests):
        return self.engine.submit(requests)

    def run_until(self, condition=None):
        return self.engine.run_until(condition)


def _tiny_episodes(engine_wrap=lambda e: e, max_new_tokens=120, max_turns=3):
    import torch

    from rollwise.engine.slots import SlotEngine
    from rollwise.model.tiny import build_tiny

    model, tok = build_tiny("tiny", seed=0)
    engine = SlotEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=8, seed=0)
    stops = tuple(tok(c, add_special_tokens=False)["input_ids"][0] for c in "abcdefghij0123456789")
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop_token_ids=stops + (tok.eos_token_id,))
    envs = lambda: EpisodeEnv(Calculator(), 5.0, 2000)  # noqa: E731
    sampler = EpisodeSampler(params, tok, envs, AlwaysCall(), max_turns=max_turns)
    prompts = [Prompt(f"p{i}", f"q{i}: ", token_ids=[]) for i in range(2)]
    groups, _ = sampler.generate(engine_wrap(engine), prompts, [2, 2], seed=3)
    return model, tok, engine, groups, torch


def test_slot_engine_episodes_keep_the_cache_and_equal_the_naive_loop():
    model, tok, engine, groups, torch = _tiny_episodes()
    _, _, naive_engine, naive, _ = _tiny_episodes(NoResume)
    rollouts = [r for g in groups for r in g.rollouts]
    assert [r.completion_ids for r in rollouts] == [r.completion_ids for g in naive for r in g.rollouts]
    assert all(len(r.turns) == 3 for r in rollouts)  # three turns, two insertions each
    # only the appended ids (and each turn's last sampled id) are prefilled after the first turn
    assert engine.stats.prefill_tokens < naive_engine.stats.prefill_tokens
    assert engine.stats.restored_tokens > 0 and naive_engine.stats.restored_tokens == 0
    # every sampled id's behaviour log-prob is the model's own on the exact ids; inserted ids are masked
    for r in rollouts:
        ids = torch.tensor([r.prompt_ids + r.completion_ids])
        with torch.no_grad():
            logp = model(ids).logits[0, len(r.prompt_ids) - 1: -1].float().log_softmax(-1)
        own = logp.gather(-1, torch.tensor(r.completion_ids)[:, None])[:, 0]
        sampled = torch.tensor(r.loss_weights, dtype=torch.bool)
        assert torch.allclose(torch.tensor(r.behavior_logprobs)[sampled], own[sampled], atol=1e-4)
        assert all(lp == 0.0 for lp, w in zip(r.behavior_logprobs, r.loss_weights) if w == 0)
        assert tok.decode([i for i, w in zip(r.completion_ids, r.loss_weights) if w == 0]).count("<result>42</result>") == 2


def test_max_new_tokens_bounds_an_episodes_sampled_and_inserted_ids_together():
    """rollout.max_new_tokens is an episode's budget across all its turns (one chain in one slot), on
    the slot engine (turns resumed from the cache) and on the naive loop alike."""
    for wrap in (lambda e: e, NoResume):
        _, _, _, groups, _ = _tiny_episodes(wrap, max_new_tokens=30, max_turns=6)
        rollouts = [r for g in groups for r in g.rollouts]
        assert all(len(r.completion_ids) <= 30 for r in rollouts)
        assert max(len(r.turns) for r in rollouts) >= 2  # several turns share the one budget


# -- training on episodes ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [[], ["train.mode=async", "train.max_staleness=1", "train.generation_threads=1"],
                                  ["replay.method=rollout_replay"]], ids=["sync", "async", "replay"])
def test_rl_steps_on_episodes_train_the_sampled_ids_only(tmp_path, mode, monkeypatch):
    """Through the real build path (the trainer's build_batch), every batch row trains exactly the ids
    the engine sampled (each turn's span) and none of the ids the environment inserted."""
    from dataclasses import replace

    import torch

    import rollwise.train.loop as loop
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    built = []  # (groups, batch) of every update
    real_build = loop.build_batch
    monkeypatch.setattr(loop, "build_batch", lambda groups, *a, **k: built.append((groups, real_build(groups, *a, **k)))
                        or built[-1][1])
    cfg = load_run_config(None, [f"output_dir={tmp_path}", "task.max_digits=2", "task.eval_size=4",
                                 "rollout.prompts_per_step=2", "rollout.num_generations=4", "rollout.max_new_tokens=60",
                                 "rollout.environment=calculator", "rollout.max_turns=3", "optim.micro_batch_size=8",
                                 "model.threads=1", "train.eval_samples=0", "optim.lr=1e-2", *mode])
    with Trainer(cfg) as trainer:
        trainer.prepare()
        tok = trainer.tokenizer
        stops = tuple(tok(c, add_special_tokens=False)["input_ids"][0] for c in "0123456789")
        gen = trainer.generator
        assert isinstance(gen, EpisodeSampler) and gen.fmt is PLAIN  # the tiny model has no chat template
        gen.fmt, gen.params = AlwaysCall(), replace(gen.params, stop_token_ids=stops + (tok.eos_token_id,))
        from rollwise.filter.rewards import RewardFn  # a reward with signal for a random model: even length

        trainer.reward_fns = [RewardFn("even", lambda prompts, completions, **_: [float(len(c) % 2 == 0)
                                                                                for c in completions])]
        before = [p.detach().clone() for p in trainer.model.parameters()]
        metrics = [trainer.step() for _ in range(2)]
        assert all(m["episode/tool_calls"] > 0 and m["episode/turns_mean"] > 1 for m in metrics)
        assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert built and any(r.turns and len(r.turns) > 1 for groups, _ in built for g in groups for r in g.rollouts)
    inserted_seen = 0
    for groups, batch in built:
        rows = [r for g in groups for r in g.rollouts]
        assert batch.loss_weights.shape[0] == len(rows)
        for i, r in enumerate(rows):
            p, c = len(r.prompt_ids), len(r.completion_ids)
            assert batch.input_ids[i, p: p + c].tolist() == r.completion_ids  # the exact ids, not re-tokenized
            sampled = torch.zeros_like(batch.loss_weights[i], dtype=torch.bool)
            for t in r.turns:  # column p-1+j scores completion id j
                sampled[p - 1 + t.start: p - 1 + t.end] = True
            trained = batch.loss_weights[i] > 0
            assert torch.equal(trained, sampled), f"row {i}: trained positions differ from the sampled ones"
            inserted = [r.completion_ids[j] for j in range(c) if not sampled[p - 1 + j]]
            inserted_seen += len(inserted)
            assert tok.decode(inserted).count("<result>42</result>") == len(r.turns) - 1
    assert inserted_seen > 0
    # a wrong config is refused with the fix
    with pytest.raises(ConfigError, match="rollout.strategy=group"):
        Trainer(load_run_config(None, [f"output_dir={tmp_path}/b", "rollout.environment=calculator",
                                       "rollout.strategy=tree"])).prepare()


# -- rollout workers: the environment runs where sampling runs ------------------------------------
def test_a_worker_shard_samples_the_episodes_the_whole_step_samples():
    """A worker gets the step's whole prompt list with budget 0 for the others' prompts: its episodes
    are the ones the in-process run samples for those prompts (seeds follow the prompt's slot)."""
    from rollwise.engine.slots import SlotEngine
    from rollwise.model.tiny import build_tiny

    model, tok = build_tiny("tiny", seed=0)
    stops = tuple(tok(c, add_special_tokens=False)["input_ids"][0] for c in "abcdefghij0123456789")
    params = SamplingParams(temperature=1.0, max_new_tokens=80, stop_token_ids=stops + (tok.eos_token_id,))
    prompts = [Prompt(f"p{i}", f"q{i}: ") for i in range(4)]

    def sample(budgets):
        sampler = EpisodeSampler(params, tok, lambda: EpisodeEnv(Calculator(), 5.0, 2000), AlwaysCall(), max_turns=2)
        engine = SlotEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=8, seed=0)
        groups, _ = sampler.generate(engine, prompts, budgets, seed=5)
        return [[r.completion_ids for r in g.rollouts] for g in groups]

    whole, left, right = sample([2, 2, 2, 2]), sample([2, 0, 2, 0]), sample([0, 2, 0, 2])
    assert [left[0], right[1], left[2], right[3]] == whole and left[1] == right[0] == []


def test_a_rollout_worker_builds_the_runs_environment(tmp_path):
    from rollwise.dist.worker import RolloutWorker
    from rollwise.train.config import RunConfig, load_run_config

    cfg = load_run_config(None, [f"output_dir={tmp_path}", "rollout.environment=guess_number", "model.threads=1",
                                 "rollout.max_turns=3"])
    worker = RolloutWorker(cfg.model_dump(mode="json"), RunConfig, score=False)
    assert isinstance(worker.generator, EpisodeSampler) and worker.generator.max_turns == 3
    assert worker.generator.envs.cls is GuessNumber  # its episodes' instances live in the env worker process


def test_a_reset_that_raises_names_the_environment_and_the_row():
    """The environment's bug is this episode's failure (0 with the reason, not trained), not the run's end."""
    class Broken:
        def reset(self, **row):
            raise KeyError("secret")

    tok = char_tokenizer()
    (group,), metrics = sampler(tok, env=Broken).generate(ScriptedEngine(tok, calculator_script),
                                                         [Prompt("p", "q", answer="1")], [1], 0)
    (r,) = group.rollouts
    assert r.failure == "Broken.reset raised KeyError: 'secret' (on a row with columns ['answer'])"
    assert r.completion_ids == [] and metrics["episode/env_failed"] == 1.0


def test_sampled_ids_are_kept_even_where_decode_then_encode_differs(chat_tok):
    """Token-faithful (TRL #5224): a "model" that samples "apples" letter by letter, which the BPE
    tokenizer would encode as fewer ids, keeps exactly those ids in the rollout and in the next turn's
    prompt — nothing is decoded and re-tokenized."""
    tok = chat_tok
    split = [tok.convert_tokens_to_ids(c) for c in "apples"]
    canonical = tok(tok.decode(split), add_special_tokens=False)["input_ids"]
    assert tok.decode(split) == "apples" and canonical != split  # decode -> encode is not the identity here
    call = tok('<tool_call>{"name": "calculate", "arguments": {"expression": "1+1"}}</tool_call>',
               add_special_tokens=False)["input_ids"]
    script = lambda text: split if "<|im_start|>tool" in text else split + call  # noqa: E731
    params = SamplingParams(temperature=1.0, max_new_tokens=300, stop_token_ids=(tok.eos_token_id,))
    engine = ScriptedEngine(tok, script)
    episodes = EpisodeSampler(params, tok, lambda: EpisodeEnv(Calculator(), 5.0, 2000), HERMES)
    (group,), _ = episodes.generate(engine, [Prompt("p", "hi", messages=[{"role": "user", "content": "hi"}])], [1], 0)
    (r,) = group.rollouts
    first = split + call + [tok.eos_token_id]
    assert r.completion_ids[: len(first)] == first and r.completion_ids[-len(split) - 1:] == split + [tok.eos_token_id]
    # the second turn was asked with the first prompt + the exact ids so far (naive path: no resume)
    assert engine.prompt_ids[1] == engine.prompt_ids[0] + r.completion_ids[: r.turns[1].start]


def test_python_tool_runs_in_the_sandbox_and_reports_failures(tmp_path):
    from rollwise.tasks.envs import PythonTool

    class Quick(PythonTool):
        timeout_s = 1.0

    tool = Quick()
    assert tool.run_python("print(6 * 7)") == "42"
    assert tool.run_python("print('partial')\nraise ValueError('bad input')") == "partial\nValueError: bad input"
    assert tool.run_python("while True: pass") == "timed out after 1 s"  # the loop really ran until killed
    # the sandbox's filesystem is not the trainer's: a write there leaves nothing here
    target = tmp_path / "leak.txt"
    tool.run_python(f"open({str(target)!r}, 'w').write('x')")
    assert not target.exists()
