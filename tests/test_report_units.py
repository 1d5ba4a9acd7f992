"""The report's pure parts, without a run: which curves (merged, flat, key), smoothing, the metric
groups, the evenly spaced steps, and the training rollout log (rollouts.jsonl) on hand-made groups."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rollwise.report.curves import group_metrics, plan_curves, smooth, smoothing_weight
from rollwise.report.rollouts import evenly_spaced
from rollwise.report.runs import Run


def jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def run(name: str, metrics: list[dict]) -> Run:
    return Run(name, Path(name), metrics)


def steps(**series) -> list[dict]:
    """metrics.jsonl lines from per-metric value lists: step i+1 logs each list's i-th value (None: not logged)."""
    n = max(len(v) for v in series.values())
    return [{"step": i + 1, **{k: v[i] for k, v in series.items() if i < len(v) and v[i] is not None}}
            for i in range(n)]


def test_equal_series_are_one_curve_and_flat_ones_are_folded():
    r = run("a", steps(**{"reward/mean": [0.0, 0.5, 1.0], "reward/f": [0.0, 0.5, 1.0],
                          "train/pass_rate": [0.0, 0.5000000000001, 1.0], "reward/std": [0.1, 0.2, 0.1],
                          "staleness/max": [0.0, 0.0, 0.0], "update/skipped": [0.0, 0.0, 0.0],
                          "lr": [1e-4, 1e-4, 1e-4], "time/step": [0.3, 0.2, 0.4], "kl": [0.0, 0.01, 0.02]}))
    plan = plan_curves([r])
    assert [c.names for c in plan.key] == [["reward/mean", "train/pass_rate", "reward/f"], ["reward/std"], ["kl"]]
    assert plan.key[0].title == "reward/mean = train/pass_rate = reward/f"
    assert {g: [c.names for c in cs] for g, cs in plan.more.items()} == {"time": [["time/step"]]}
    assert sorted((sorted(n), v) for n, v in plan.flat) == [(["lr"], 1e-4), (["staleness/max", "update/skipped"], 0.0)]


def test_several_runs_merge_only_what_is_equal_in_every_run():
    a = run("a", steps(**{"reward/mean": [0.0, 1.0], "reward/f": [0.0, 1.0], "c": [2.0, 2.0]}))
    b = run("b", steps(**{"reward/mean": [0.0, 1.0], "reward/f": [1.0, 1.0], "c": [3.0, 3.0]}))
    plan = plan_curves([a, b])
    assert [c.names for c in plan.key] == [["reward/mean"], ["reward/f"]]
    assert [c.names for c in plan.more["other"]] == [["c"]]  # constant in each run, but not one value: plotted
    assert plan.flat == []


def test_long_series_are_smoothed_over_their_raw_values():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rollwise.report.plots import _draw

    noisy = [float(i % 2) for i in range(40)]
    smoothed = smooth(noisy, smoothing_weight(40))
    assert max(smoothed[10:]) - min(smoothed[10:]) < 0.5 and smoothed[0] == 0.0  # debiased: starts at the data
    fig, ax = plt.subplots()
    _draw(ax, list(enumerate(noisy)), "#1f77b4", "a")
    raw, avg = ax.get_lines()
    assert raw.get_alpha() < 0.5 and list(raw.get_ydata()) == noisy and list(avg.get_ydata()) == smoothed
    ax.clear()
    _draw(ax, list(enumerate(noisy[:5])), "#1f77b4", "a")  # short: raw only
    assert len(ax.get_lines()) == 1
    plt.close(fig)
    assert smoothing_weight(19) == 0.0 and all(math.isclose(v, 0.3) for v in smooth([0.3] * 50, 0.9))


def test_evenly_spaced_keeps_first_and_last():
    assert evenly_spaced(list(range(1, 31)), 8) == [1, 5, 9, 13, 18, 22, 26, 30]
    assert evenly_spaced([], 8) == [] and evenly_spaced([3], 8) == [3]


def test_metrics_go_to_their_groups():
    names = ["kl", "kl_prox", "reward/mean", "dist/workers", "time/weight_sync", "staleness/max", "zzz",
             "episode/parse", "episodes/failed", "harness/calls_mean"]
    grouped = group_metrics(names)
    assert grouped == {"reward": ["reward/mean"],
                       "episodes": ["episode/parse", "episodes/failed", "harness/calls_mean"],
                       "kl": ["kl", "kl_prox"], "strategy": ["staleness/max"],
                       "dist": ["dist/workers"], "time": ["time/weight_sync"], "other": ["zzz"]}


def _group(i: int, rewards: list[float], text: str = "x", messages=None):
    from rollwise.types import Prompt, Rollout, RolloutGroup

    rollouts = [Rollout(f"p{i}", [1], [2], [0.0], [0], "stop", completion_text=text, reward=r, score=r,
                        reward_components={"f": r}, reward_reasons={"f": f"why {r}"}, advantage=[r - 0.5],
                        messages=messages) for r in rewards]
    return RolloutGroup(Prompt(f"p{i}", f"prompt {i}", answer="a"), rollouts)


def test_rollout_log_picks_groups_that_trained_first_and_logs_episodes(tmp_path):
    from rollwise.train.rollout_log import RolloutLog

    log = RolloutLog(tmp_path, groups_per_step=2)
    episode = [{"role": "assistant", "content": "<tool_call>{}</tool_call>"}, {"role": "tool", "name": "calc",
                                                                           "content": "42"}]
    log.log(1, [_group(0, [1.0, 1.0]), _group(1, [0.0, 1.0], messages=episode), _group(2, [1.0, 0.0])])
    records = jsonl(tmp_path / "rollouts.jsonl")
    assert [r["prompt_id"] for r in records] == ["p1", "p2"]  # spread first, in sampled order
    assert records[0]["rollouts"][0]["messages"] == episode and "messages" not in records[1]["rollouts"][0]
    assert records[0]["rollouts"][1] | {} == {
        "completion": "x", "reward": 1.0, "score": 1.0, "components": {"f": 1.0}, "reasons": {"f": "why 1.0"},
        "advantage": 0.5, "tokens": 1, "finish_reason": "stop", "correct": True, "messages": episode}
    assert RolloutLog(tmp_path, groups_per_step=0) and not jsonl(tmp_path / "rollouts.jsonl")  # fresh run: empty


def test_rollout_log_stays_within_its_budget_and_resumes(tmp_path):
    """Past train.rollouts_mb every other logged step is dropped and the stride doubles: an even sample of
    the whole run in a bounded file; a resumed log drops lines after the checkpoint and keeps the stride."""
    from rollwise.train.rollout_log import TEXT_CHARS, RolloutLog

    budget_mb = 0.05  # ~52 KB; each step ~ 2 groups x 2 rollouts x ~4 KB
    log = RolloutLog(tmp_path, groups_per_step=2, budget_mb=budget_mb)
    for step in range(1, 41):
        log.log(step, [_group(0, [0.0, 1.0], "y" * 9000), _group(1, [1.0, 0.0], "z" * 9000)])
        assert (tmp_path / "rollouts.jsonl").stat().st_size <= budget_mb * 1024 * 1024
    records = jsonl(tmp_path / "rollouts.jsonl")
    steps = sorted({r["step"] for r in records})
    every = log.every
    assert every > 1 and all(r["every"] == every for r in records)
    assert steps == list(range(every, 41, every)) and len(steps) >= 2  # first to last, evenly
    text = records[0]["rollouts"][0]["completion"]
    assert text.startswith("y" * TEXT_CHARS) and text.endswith("[5,000 more characters not logged]")
    resumed = RolloutLog(tmp_path, groups_per_step=2, budget_mb=budget_mb, resume_from_step=steps[1])
    assert resumed.every == every and [r["step"] for r in jsonl(tmp_path / "rollouts.jsonl")] == [steps[0]] * 2 + [
        steps[1]] * 2


def test_episode_messages_with_calls_and_content_parts(tmp_path):
    """A harness turn that only calls a tool (content None) and OpenAI content parts log and render as text;
    the calls are shown as the model made them."""
    from rollwise.report.html import completion_html
    from rollwise.train.rollout_log import RolloutLog

    calls = [{"type": "function", "function": {"name": "calculate", "arguments": "{\"expression\": \"6*7\"}"}}]
    messages = [{"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "name": "calculate", "content": [{"type": "text", "text": "4"}, {"text": "2"}]},
                {"role": "assistant", "content": "42"}]
    RolloutLog(tmp_path, groups_per_step=1).log(1, [_group(0, [0.0, 1.0], messages=messages)])
    logged = jsonl(tmp_path / "rollouts.jsonl")[0]["rollouts"][0]["messages"]
    assert [m["content"] for m in logged] == ["", "42", "42"] and logged[0]["tool_calls"] == calls
    for html in (completion_html({"messages": messages}), completion_html({"messages": logged})):
        assert "None" not in html and html.count("<pre>42</pre>") == 2 and "tool result · calculate" in html
        assert "calculate({&quot;expression&quot;: &quot;6*7&quot;})" in html  # the call as made, escaped


def test_the_headline_says_when_a_reward_failed_or_nothing_trained():
    from rollwise.report.page import summary_section

    r = run("a", steps(**{"reward/f/errors": [0.0, 2.0, 1.0], "reward/f/non_finite": [1.0, 0.0, 0.0],
                          "reward/g/errors": [0.0, 0.0, 0.0], "groups/zero_signal": [1.0, 0.5, 0.75],
                          "eval/accuracy": [0.25, None, 0.5]}))
    html = summary_section([r])
    assert "reward function <code>f</code> failed on 4 completions" in html and "<code>g</code>" not in html
    assert "75% of groups had no reward spread" in html
    assert "25.0% → 50.0%</b> (+25.0 points)" in html
    recorded = run("c", [])
    recorded.summary = {"steps": 3, "generated_tokens": 1234, "wall_seconds": 90.0,
                        "cpu": {"model": "Some CPU @ 2GHz", "cores": 2, "flags": ["avx2"]}}
    assert "3 RL steps · 1,234 generated tokens · 1.5 min RL wall time · CPU: Some CPU @ 2GHz, 2 cores" in (
        summary_section([recorded]))
    quiet = summary_section([run("b", steps(**{"groups/zero_signal": [0.25, 0.5]}))])
    assert "failed on" not in quiet and "no reward spread" not in quiet
