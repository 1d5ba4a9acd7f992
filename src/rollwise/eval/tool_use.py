"""What an eval reports of an environment task's episodes besides accuracy, and the table ``rollwise eval``
prints.

Measured on the greedy episodes (one per eval prompt), from the counts the episode sampler keeps
(``generate.episode.tool_use_metrics``):

- ``eval/tool_calls_mean``: tool calls per episode;
- ``eval/parse_failure_rate``: the share of those calls the tool format could not read;
- ``eval/call_error_rate``: the share read but answered with an error (an unknown tool, bad
  arguments, the tool raised or timed out);
- ``eval/turns_mean``: model turns per episode (a failed episode has none);
- ``eval/failed_episodes``: the share of episodes that failed (their environment or harness did:
  scored 0, with the reason in ``samples.jsonl``).

The two rates are left out when the episodes made no tool call (not a vacuous 0%). Calls are
counted when they got an answer: a call on an episode's last allowed turn is not run. A harness
(``rollout.harness``) makes its tool calls itself, out of sight: its eval reports model calls per
episode (``eval/model_calls_mean``) and failed episodes.
"""

from __future__ import annotations

EPISODE_KEYS = {"episode/tool_calls_mean": "eval/tool_calls_mean", "episode/parse_failure_rate":
                "eval/parse_failure_rate", "episode/call_error_rate": "eval/call_error_rate",
                "episode/turns_mean": "eval/turns_mean", "harness/calls_mean": "eval/model_calls_mean"}


def tool_use(generator_metrics: dict[str, float], groups) -> dict[str, float]:
    """The eval's tool-use metrics from one episode ``generate`` call's metrics and its groups."""
    out = {name: float(generator_metrics[k]) for k, name in EPISODE_KEYS.items() if k in generator_metrics}
    rollouts = [r for g in groups for r in g.rollouts]
    out["eval/failed_episodes"] = sum(r.failure is not None for r in rollouts) / max(len(rollouts), 1)
    return out


def _pct(v: float) -> str:
    return f"{v:.1%}"


def _of_calls(metrics: dict, key: str) -> str:
    return f"{metrics[key]:.1%} of tool calls" if key in metrics else "— (no tool calls)"


def table_rows(metrics: dict[str, float], prompts: int) -> list[tuple[str, str]]:
    """``(label, value)`` lines of an eval's metrics (``EvalResult.metrics()``) over ``prompts`` prompts."""
    rows = [("accuracy (greedy)", _pct(metrics["eval/accuracy"]))]
    rows += [(k.removeprefix("eval/"), _pct(v)) for k, v in metrics.items()
             if k.startswith(("eval/pass@", "eval/maj@"))]
    rows.append(("mean length", f"{metrics['eval/mean_length']:.1f} tokens"))
    if "eval/tool_calls_mean" in metrics:
        rows += [("tool calls per episode", f"{metrics['eval/tool_calls_mean']:.3g}"),
                 ("unparseable tool calls", _of_calls(metrics, "eval/parse_failure_rate")),
                 ("tool calls answered with an error", _of_calls(metrics, "eval/call_error_rate"))]
    if "eval/model_calls_mean" in metrics:
        rows.append(("model calls per episode", f"{metrics['eval/model_calls_mean']:.3g}"))
    if "eval/turns_mean" in metrics:
        rows.append(("turns per episode", f"{metrics['eval/turns_mean']:.3g}"))
    if "eval/failed_episodes" in metrics:
        share = metrics["eval/failed_episodes"]
        rows.append(("failed episodes", f"{share:.1%} ({round(share * prompts)} of {prompts})"))
    return rows
