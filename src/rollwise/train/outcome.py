"""What a run tells its user besides the curves: a note at start for each choice made on their
behalf (the eval judge, the chat template), the totals each step adds to ``TrainState`` (reward
failures, steps without a reward spread), and the closing lines of ``rollwise train``.

What is guaranteed:
- the start notes are logged once, before the first step;
- ``summary.json`` (``state.run_summary``) holds ``eval_judge``, ``reward_failures`` (every reward
  function that failed on some rollout: rollouts scored, errors, non-finite values, the first
  reason; ``{}`` when none failed; counted over the groups each step trains on) and
  ``zero_signal_steps`` (steps where no group had a reward spread), totals over the whole run, a
  resumed one included; ``eval`` says when there was none;
- the closing lines say when the run had no eval, which reward functions failed and how often,
  and, when no step had a reward spread, that nothing trained and what to change.
"""

from __future__ import annotations

import logging

from rollwise.filter.rewards import add_failures, reward_failures

log = logging.getLogger(__name__)

NO_EVAL = "none: the task has no eval split"
NO_EVAL_HINT = ("no eval: the task has no eval split (task.eval_fraction=0, or too few rows to hold any out); set "
                "task.eval_fraction or task.eval_path to measure accuracy")


def start_notes(task, tokenizer, judge, rewards_configured: bool) -> None:
    """Log what the run chose for the user: the chat template (``Task.check_tokenizer``, which
    also refuses a tokenizer the task cannot use) and, when the recipe lists rewards, the eval judge."""
    if task.check_tokenizer is not None:
        note = task.check_tokenizer(tokenizer)
        if note:
            log.info(note)
    if rewards_configured:
        source = "the first of rewards:" if task.judge_from_rewards else "the task's own reward"
        log.info("eval judge: '%s' (%s; correct = its score above 0.5)", judge.name, source)


def count_step(state, groups, metrics: dict[str, float]) -> None:
    """Add one training step's reward failures and zero-signal verdict to the run's totals."""
    state.reward_failures = add_failures(state.reward_failures, reward_failures(groups))
    state.zero_signal_steps += int(metrics.get("groups/zero_signal", 0.0) >= 1.0)


def closing_lines(summary: dict) -> list[str]:
    """Lines ``rollwise train`` prints after the learned line (rich markup)."""
    lines = []
    if summary.get("eval") == NO_EVAL:
        lines.append(f"[yellow]{NO_EVAL_HINT}[/]")
    for name, rec in summary.get("reward_failures", {}).items():
        kinds = [f"{rec['errors']} raised or returned the wrong number of values"] * bool(rec["errors"]) + \
                [f"{rec['non_finite']} not finite"] * bool(rec["non_finite"])
        lines.append(f"[bold red]reward function '{name}' failed on {rec['errors'] + rec['non_finite']} of "
                     f"{rec['rollouts']} rollouts[/] ({', '.join(kinds)}; scored 0). First: {rec['first_reason']}")
    steps, flat = summary.get("steps", 0), summary.get("zero_signal_steps", 0)
    if steps and flat == steps:
        lines.append("[yellow]no step had a reward spread: in every group all rollouts scored the same, so every "
                     "advantage was 0 and nothing trained. Make the reward tell completions apart (partial credit, "
                     "a check that some pass and some fail), raise rollout.num_generations or rollout.temperature, "
                     "or train on prompts the model sometimes solves[/]")
    elif steps and flat * 2 >= steps:
        lines.append(f"[yellow]{flat} of {steps} steps had no reward spread in any group (those steps trained "
                     "nothing)[/]")
    return lines
