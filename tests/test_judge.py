"""The ``judge`` reward (issue 36 §1): a model grades completions against a rubric.

- a reply's last ``Score: N`` is the reward N/max_score with the reasoning kept; no score → 0
  with a ``judge could not score:`` reason, counted like a reward function that raised;
- every request of a scoring call reaches the backend as one batch; repeats come from the cache
  keyed by (prompt, completion, rubric);
- the judge's tokens are counted (``judge/tokens``);
- the backends: a scripted one, an OpenAI-compatible server (a stdlib server in the test), and
  the tiny model on rollwise's engine (it answers junk: every completion 0 with the reason).
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rollwise.config import ConfigError
from rollwise.filter.judge import Judge, JudgeConfig, parse_verdict
from rollwise.filter.judge_backends import JudgeReply
from rollwise.filter.rewards import RewardFn, reward_failures, score_groups
from rollwise.model.load import ModelConfig
from rollwise.types import Prompt, Rollout, RolloutGroup

SCRIPTED = JudgeConfig(base_url="http://unused.invalid/v1", api_model="m")  # the backend is replaced


class Scripted:
    """A fake backend: replies from a function of the request text; records every batch it got."""

    def __init__(self, reply):
        self.reply, self.batches = reply, []

    def complete(self, texts):
        self.batches.append(list(texts))
        return [JudgeReply(self.reply(t), prompt_tokens=len(t), completion_tokens=3) for t in texts]


def _group(pid, prompt, *completions, answer="4"):
    rollouts = [Rollout(pid, [1], [5], [0.0], [0], "stop", completion_text=c) for c in completions]
    return RolloutGroup(Prompt(pid, prompt, answer=answer), rollouts)


def by_answer(text):
    """A judge that gives 9/10 when the answer line says 4, else a reply with no score."""
    answer = text.split("Answer: ")[1].split("\n")[0]
    return "Right sum. Score: 9" if answer.strip() == "4" else "I am not sure what to say."


def test_parse_verdict_by_hand():
    assert parse_verdict("ok. Score: 7", 10) == pytest.approx(0.7)
    assert parse_verdict("Score: 2\nthen again... **Score:** 6/10", 10) == pytest.approx(0.6)  # the last one
    assert parse_verdict("score = 3/4", 10) == pytest.approx(0.75)  # its own scale
    assert parse_verdict("Score: 1", 1) == 1.0 and parse_verdict("Score: 0.5", 1) == 0.5
    for junk in ("", "no verdict here", "Score: 11", "Score: -3", "Score:"):
        s = parse_verdict(junk, 10)
        assert s == 0.0 and s.reason.startswith("judge could not score:"), junk
    assert parse_verdict("The working is fine. Score: 10", 10).reason == "The working is fine."


def test_scripted_judge_scores_keeps_reasons_and_counts_failures():
    backend = Scripted(by_answer)
    judge = Judge(SCRIPTED, backend=backend)
    groups = [_group("a", "2+2=", "4", "5"), _group("b", "1+3=", "4", "x")]
    metrics = score_groups(groups, [RewardFn("judge", judge)])
    assert [r.reward for g in groups for r in g.rollouts] == pytest.approx([0.9, 0.0, 0.9, 0.0])
    assert groups[0].rollouts[0].reward_reasons["judge"] == "Right sum."
    assert groups[0].rollouts[1].reward_reasons["judge"].startswith("judge could not score: no 'Score: N'")
    assert len(backend.batches) == 1 and len(backend.batches[0]) == 4  # one batch for the whole call
    # an unparseable reply is a reward failure, counted as a function that raised is
    assert metrics["reward/judge/errors"] == 2.0 and metrics["judge/unscored"] == 2.0
    assert reward_failures(groups)["judge"]["errors"] == 2
    assert metrics["judge/requests"] == 4.0
    assert metrics["judge/tokens"] == sum(len(t) + 3 for t in backend.batches[0]) == metrics["judge/tokens_total"]


def test_cache_keyed_by_prompt_completion_and_rubric():
    backend = Scripted(by_answer)
    judge = Judge(SCRIPTED, backend=backend)
    groups = [_group("a", "2+2=", "4", "4", "5")]  # a repeat within the call is sent once
    first = score_groups(groups, [RewardFn("judge", judge)])
    assert len(backend.batches[0]) == 2 and first["judge/cache_hits"] == 0.0
    again = score_groups([_group("a", "2+2=", "4", "5"), _group("c", "3+1=", "4")], [RewardFn("judge", judge)])
    assert backend.batches[1] == [backend.batches[1][0]] and "3+1=" in backend.batches[1][0]  # only the new prompt
    assert again["judge/cache_hits"] == 2.0 and again["judge/tokens"] == len(backend.batches[1][0]) + 3
    other = Judge(SCRIPTED.model_copy(update={"rubric": "Is it short?"}), backend=backend)
    other.cache = judge.cache  # the same entries: another rubric is another key
    score_groups([_group("a", "2+2=", "4")], [RewardFn("judge", other)])
    assert len(backend.batches) == 3


def test_the_cache_and_the_token_total_survive_a_checkpoint():
    """What a checkpoint keeps (state_of) given to a new judge (load_state): a repeat is a cache hit,
    not a request, and tokens_total goes on from the saved count; a judge in a POW3R rubric is
    reached through it."""
    import torch

    from rollwise.filter.pow3r import Pow3r, Pow3rConfig
    from rollwise.filter.rewards import load_state, state_of

    backend = Scripted(by_answer)
    judge = Judge(SCRIPTED, backend=backend)
    first = score_groups([_group("a", "2+2=", "4", "5")], [RewardFn("judge", judge)])
    saved = torch.load(_roundtrip(state_of(judge)), weights_only=False)
    fresh = Judge(SCRIPTED, backend=backend)
    load_state(fresh, saved)
    again = score_groups([_group("a", "2+2=", "4", "5")], [RewardFn("judge", fresh)])
    assert len(backend.batches) == 1 and again["judge/cache_hits"] == 2.0 and again["judge/requests"] == 0.0
    assert again["judge/tokens_total"] == first["judge/tokens_total"] > 0
    rubric = Pow3r(Pow3rConfig(criteria=[{"name": "arith"}, {"name": "judge", "judge": SCRIPTED.model_dump()}]), [("arith", len), ("judge", judge)])
    rubric.weights = [0.7, 0.3]
    inner = Judge(SCRIPTED, backend=backend)
    other = Pow3r(rubric.cfg, [("arith", len), ("judge", inner)])
    load_state(other, state_of(rubric))
    assert other.weights == [0.7, 0.3] and list(inner.cache) == list(judge.cache)


def _roundtrip(state):
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_the_template_reads_dataset_columns_and_names_a_missing_one():
    backend = Scripted(lambda t: "Score: 10" if "reference: 4" in t else "Score: 0")
    cfg = SCRIPTED.model_copy(update={"template": "{prompt} {completion} reference: {answer}. Score: N?"})
    g = _group("a", "2+2=", "four")
    score_groups([g], [RewardFn("judge", Judge(cfg, backend=backend))])
    assert g.rewards == [1.0]
    bad = SCRIPTED.model_copy(update={"template": "{prompt} {solution} Score?"})
    g = _group("a", "2+2=", "4")
    metrics = score_groups([g], [RewardFn("judge", Judge(bad, backend=backend))])
    assert g.rewards == [0.0] and metrics["reward/judge/errors"] == 1.0
    assert "judge.template names {solution}" in g.rollouts[0].reward_reasons["judge"]


def test_judge_config_errors_name_the_fix():
    from rollwise.train.config import load_run_config

    with pytest.raises(ConfigError, match="judge reward needs its section"):
        load_run_config(None, ["rewards=[{name: judge}]"])
    with pytest.raises(ConfigError, match="exactly one of judge.model"):
        load_run_config(None, ["rewards=[{name: judge, judge: {}}]"])
    with pytest.raises(ConfigError, match="api_model"):
        load_run_config(None, ["rewards=[{name: judge, judge: {base_url: 'http://x/v1'}}]"])
    cfg = load_run_config(None, ["rewards=[{name: arith}, {name: judge, weight: 0.5, judge: {model: {}}}]"])
    assert cfg.rewards[1].judge.model.preset == "tiny"


class _Server(BaseHTTPRequestHandler):
    fail_for = "FAIL"

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = body["messages"][0]["content"]
        if self.fail_for in text:
            self.send_response(400)
            self.end_headers()
            return
        reply = {"choices": [{"message": {"role": "assistant", "content": "Fine. Score: 5"}}],
                 "usage": {"prompt_tokens": 11, "completion_tokens": 4}}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_openai_compatible_backend_reads_usage_and_reports_a_failed_request():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        cfg = JudgeConfig(base_url=f"http://127.0.0.1:{server.server_port}/v1", api_model="judge-model")
        judge = Judge(cfg)
        g = _group("a", "2+2=", "4", "FAIL")
        metrics = score_groups([g], [RewardFn("judge", judge)])
    finally:
        server.shutdown()
        server.server_close()
    assert g.rewards == [0.5, 0.0]
    assert g.rollouts[1].reward_reasons["judge"].startswith("judge could not score: request failed (HTTP 400")
    assert metrics["judge/tokens"] == 15.0 and metrics["reward/judge/errors"] == 1.0
    assert len(judge.cache) == 1  # a failed request is not cached: it is asked again next time


def test_tiny_model_as_local_judge_answers_junk_scored_zero_with_reasons():
    # the tiny preset on rollwise's engine: its replies hold no score, so every completion scores 0
    # with the reason and the counters move (a real judge: docs/tasks.md, SmolLM2-135M, weak)
    cfg = JudgeConfig(model=ModelConfig(preset="tiny", threads=1), max_new_tokens=6)
    judge = Judge(cfg)
    groups = [_group("a", "2+2=", "4", "5"), _group("b", "1+3=", "4")]
    metrics = score_groups(groups, [RewardFn("judge", judge)])
    rollouts = [r for g in groups for r in g.rollouts]
    assert [r.reward for r in rollouts] == [0.0, 0.0, 0.0]
    assert all(r.reward_reasons["judge"].startswith("judge could not score:") for r in rollouts)
    assert metrics["judge/requests"] == 3.0 and metrics["reward/judge/errors"] == 3.0
    assert metrics["judge/completion_tokens"] > 0 and metrics["judge/tokens"] > metrics["judge/completion_tokens"]
    assert reward_failures(groups)["judge"]["errors"] == 3


def test_a_run_with_a_judge_reward_logs_its_tokens(tmp_path):
    # one config line in a recipe: the judge beside the task's verifier; its tokens in metrics.jsonl
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer
    from rollwise.train.metrics import read_metrics

    cfg = load_run_config(None, [
        f"output_dir={tmp_path}", "task.max_digits=1", "task.eval_size=2", "rollout.prompts_per_step=2",
        "rollout.num_generations=2", "rollout.max_new_tokens=8", "train.eval_samples=0", "model.threads=1",
        "train.steps=1", "train.checkpoint_every=0", "sft.steps=0",
        "rewards=[{name: arith}, {name: judge, weight: 0.5, judge: {model: {threads: 1}, max_new_tokens: 4}}]"])
    with Trainer(cfg) as t:
        t.prepare()
        t.fit()
        logged = [m for m in read_metrics(t.run_dir) if "judge/tokens" in m]
    assert len(logged) == 1 and logged[0]["judge/tokens"] > 0 and logged[0]["judge/requests"] == 4.0
    assert logged[0]["reward/judge/errors"] == 4.0  # the tiny judge's junk: scored 0, counted
