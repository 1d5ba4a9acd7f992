"""The report of an agent run (issue 35 item 5): episodes as conversations — the prompt's turns, each assistant
turn with its tool calls marked, each tool result or error, the final answer, the reward and its reasons — and
the tool-use curves per step.

The run directory is made by hand from real parts: the episodes are sampled by the ``EpisodeSampler`` (a
scripted model, the calculator) and logged by ``RolloutLog`` and ``MetricsLog`` as a run logs them; the
metrics are hand-made, so the plotted series are known."""

from __future__ import annotations

import json

import pytest
from test_episodes import ScriptedEngine, sampler
from test_report import parse

from rollwise.eval.accuracy import evaluate
from rollwise.filter.rewards import RewardFn, score_groups
from rollwise.model.tiny import char_tokenizer
from rollwise.report import plots, write_report
from rollwise.train.metrics import MetricsLog
from rollwise.train.rollout_log import RolloutLog, group_record
from rollwise.types import Prompt, Rollout, RolloutGroup

FIRST_TURN = {"A": '<call>calculate("12*34")</call>', "B": "<call>calculate(12*</call>"}  # B: unparseable


def script(text: str) -> str:
    return "408" if "<result>" in text else FIRST_TURN["A" if "A: " in text else "B"]


def exact(prompts, completions, answer, **_):
    from rollwise.types import Score

    return [Score(1.0 if c.strip() == a else 0.0, f"answered {c.strip()}") for c, a in zip(completions, answer)]


PROMPTS = [Prompt("pa", "A: what is 12*34?", answer="408"), Prompt("pb", "B: what is 12*34?", answer="408")]
CURVES = {  # step 1, 2, 3
    "episode/tool_calls_mean": [1.0, 0.5, 1.25], "episode/parse_failure_rate": [0.5, 0.0, 0.2],
    "episode/call_error_rate": [0.0, 0.25, 0.1], "episode/turns_mean": [2.0, 1.5, 2.25], "episodes/failed": [0, 1, 0],
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("agent")
    tok = char_tokenizer()
    episodes = sampler(tok, max_new_tokens=200, max_turns=3)
    groups, _ = episodes.generate(ScriptedEngine(tok, script), PROMPTS, [1, 1], seed=0)
    judge = RewardFn("exact", exact)
    score_groups(groups, [judge])
    RolloutLog(root, groups_per_step=2, decode=lambda ids: tok.decode(ids) + " <the rendering>").log(3, groups)
    log = MetricsLog(root)
    for i in range(3):
        log.log(i + 1, {"reward/mean": 0.1 * (i + 1), **{k: v[i] for k, v in CURVES.items()}})
    result = evaluate(ScriptedEngine(tok, script), PROMPTS, judge, tok.decode, max_new_tokens=200,
                      stop_token_ids=[tok.eos_token_id], episodes=episodes)
    log.log(3, result.metrics())
    log.log_samples(3, result.samples)
    return root


@pytest.fixture(scope="module")
def drawn(run_dir):
    """The report, and the points each plotted curve was drawn with (metric -> [(x, y)])."""
    seen, current = {}, []
    render_curve, draw = plots.render_curve, plots._draw

    def spy_curve(runs, curve, axes, fig_id, x_of):
        current[:] = [curve.names[0], axes]
        return render_curve(runs, curve, axes, fig_id, x_of)

    def spy_draw(ax, points, colour, label):
        if current[1] == ["step"]:
            seen.setdefault(current[0], []).extend(points)
        return draw(ax, points, colour, label)

    mp = pytest.MonkeyPatch()
    mp.setattr(plots, "render_curve", spy_curve)
    mp.setattr(plots, "_draw", spy_draw)
    try:
        out = write_report([run_dir])
    finally:
        mp.undo()
    return parse(out), seen


def _turns(el) -> list[tuple[str, str]]:
    return [(t.find_all("span", cls="role")[0].text(), t.find_all("pre")[0].text())
            for t in el.find_all("div", cls="turn")]


def test_a_training_episode_reads_as_its_conversation_in_order(drawn):
    """The prompt as the user's turn, the call turn with the call marked, the tool's result, the final answer;
    the reward and the reward function's reason in the same row."""
    dom, _ = drawn
    group = next(g for g in dom.by_id("rollouts").find_all("div", cls="group") if g.attrs["data-prompt-id"] == "pa")
    (row,) = group.find_all("tr", cls="rollout")
    assert _turns(group) == [
        ("user", "A: what is 12*34?"),
        ("assistant · tool call", '<call>calculate("12*34")</call>'),
        ("tool result · calculate", "408"),
        ("assistant · final turn (what the reward reads)", "408")]
    (call,) = row.find_all("mark", cls="call")
    assert call.text() == '<call>calculate("12*34")</call>'
    assert row.attrs["data-correct"] == "true" and "answered 408" in row.find_all("td", cls="reasons")[0].text()
    assert "2 turns · 1 tool result" in row.text()


def test_the_prompt_as_the_model_saw_it_is_one_click_away(drawn, run_dir):
    """An episode group logs its prompt ids as rendered (chat template, system message, tool schemas), collapsed
    under the prompt's turn; a single-completion group logs none."""
    dom, _ = drawn
    logged = [json.loads(ln) for ln in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert [g["prompt_rendered"] for g in logged] == [f"<bos>{p.text} <the rendering>" for p in PROMPTS]
    group = next(g for g in dom.by_id("rollouts").find_all("div", cls="group") if g.attrs["data-prompt-id"] == "pa")
    (rendered,) = group.find_all("details", cls="rendered-prompt")
    assert "open" not in rendered.attrs and rendered.find_all("pre")[0].text() == (
        "<bos>A: what is 12*34? <the rendering>")
    assert rendered.find_all("summary")[0].text().startswith("the prompt as the model saw it")
    single = RolloutGroup(PROMPTS[0], [Rollout("pa", [1], [2], [0.0], [0], "stop", completion_text="408")])
    assert "prompt_rendered" not in group_record(1, 1, single, decode=lambda ids: "rendered")


def test_an_unparseable_call_is_shown_with_its_error(drawn):
    dom, _ = drawn
    group = next(g for g in dom.by_id("rollouts").find_all("div", cls="group") if g.attrs["data-prompt-id"] == "pb")
    turns = group.find_all("div", cls="turn")
    (error,) = [t for t in turns if "error" in t.classes()]
    assert error.find_all("span", cls="role")[0].text() == "tool error"
    assert error.find_all("pre")[0].text().startswith("Error: cannot read the call 'calculate(12*'")
    assert "1 tool result (1 error)" in group.find_all("tr", cls="rollout")[0].text()


def test_an_eval_episode_reads_as_its_conversation(drawn):
    dom, _ = drawn
    card = next(c for c in dom.by_id("samples").find_all("details", cls="eval-prompt") if "A: what" in c.text())
    assert [role for role, _ in _turns(card)] == [
        "user", "assistant · tool call", "tool result · calculate", "assistant · final turn (what the reward reads)"]


def test_the_tool_use_curves_are_key_and_plotted_from_the_metrics(drawn, run_dir):
    """Tool calls per episode, parse failures, call errors, turns, failed episodes: each a key curve over steps,
    drawn with the logged values; the eval's tool use sits in the eval group."""
    dom, seen = drawn
    key = [f.attrs["data-metrics"] for f in dom.by_id("curves").find_all("figure") if f.attrs["id"].startswith(
        "curve-key-")]
    assert key[key.index("reward/mean") + 1:][:5] == list(CURVES)
    for name, values in CURVES.items():
        assert seen[name] == [(float(s), float(v)) for s, v in zip((1, 2, 3), values)]
    curves = dom.by_id("curves")  # one eval: its values are flat, listed (not plotted)
    names = {m for el in curves.find_all("figure") + curves.find_all("tr") for m in el.attrs.get("data-metrics",
                                                                                                 "").split()}
    assert {"eval/tool_calls_mean", "eval/parse_failure_rate", "eval/turns_mean", "eval/failed_episodes"} <= names
    logged = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert logged["eval/tool_calls_mean"] == 1.0 and logged["eval/parse_failure_rate"] == 0.5


def test_a_calculator_run_logs_its_episodes_prompt_as_rendered(tmp_path):
    """A one-step run of recipes/tiny_calculator.yaml (no SFT): its logged episode groups carry the prompt ids
    decoded with the tokenizer's special tokens."""
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    sets = [f"output_dir={tmp_path}", "name=calc", "sft.steps=0", "train.steps=1", "train.eval_every=0",
            "task.eval_size=2", "rollout.prompts_per_step=2", "rollout.num_generations=2", "rollout.max_new_tokens=16"]
    with Trainer(load_run_config("recipes/tiny_calculator.yaml", sets)) as trainer:
        trainer.prepare()
        trainer.fit()
        groups = [json.loads(ln) for ln in (tmp_path / "calc" / "rollouts.jsonl").read_text().splitlines()]
        tok = trainer.tokenizer
    assert groups and all(g["prompt_rendered"] == tok.decode(tok(g["prompt"])["input_ids"]) for g in groups)
    assert all(g["prompt_rendered"].startswith(tok.bos_token) for g in groups)
