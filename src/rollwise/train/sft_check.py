"""The held-out check after a warm start: does the model answer, and does it call the tool correctly?

``held_out_check`` runs greedy episodes on held-out prompts through the run's real environment
(the same ``EpisodeSampler`` RL and its evals use) and counts, over those episodes:

- ``accuracy``: final answers the run's judge scores correct (the final assistant turn only);
- ``call_rate``: episodes whose first turn writes a tool call;
- ``tool_calls`` and ``parse_rate``: calls written in any turn (``ToolFormat.safe_parse``) and the
  share that parse (a botched call is one that does not);
- ``call_correct``: episodes whose first tool result is the demonstration's — the call ran and
  returned what the right call returns (the calculator: the product asked for);
- ``failed``: episodes whose environment failed.

A run without an environment gets ``accuracy`` alone (the no-tool twin). ``rollwise sft`` prints
it and writes it to ``sft_check.json`` beside the saved model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from rollwise.engine.sampling import SamplingParams
from rollwise.eval.accuracy import evaluate
from rollwise.filter.rewards import score_groups
from rollwise.tasks.tool_demos import Conversation

CHECK_FILE = "sft_check.json"


@dataclass
class CheckResult:
    prompts: int
    accuracy: float
    call_rate: float | None = None  # None: the run has no environment
    tool_calls: int | None = None
    parse_rate: float | None = None  # None also when no call was written
    call_correct: float | None = None
    failed: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        """One line for the terminal."""
        text = f"held-out check, {self.prompts} prompts: accuracy {self.accuracy:.1%}"
        if self.call_rate is None:
            return text
        parse = "n/a" if self.parse_rate is None else f"{self.parse_rate:.1%}"
        return (text + f"; episodes calling a tool {self.call_rate:.1%}, tool calls {self.tool_calls} "
                f"(parsed {parse}), right call {self.call_correct:.1%}, failed episodes {self.failed}")


def held_out_check(trainer, size: int) -> CheckResult:
    """Greedy episodes (or completions, without an environment) on the first ``size`` eval prompts of
    ``trainer`` (a ``train.loop.Trainer``), with its engine, environment, judge and token budget."""
    prompts = trainer.eval_prompts[:size]
    if not prompts:
        raise ValueError("the held-out check needs eval prompts: the task's eval split is empty")
    if trainer.cfg.rollout.environment is None:
        result = evaluate(trainer.engine, prompts, trainer.judge, trainer.decode,
                          max_new_tokens=trainer.cfg.rollout.max_new_tokens, stop_token_ids=trainer.stop_ids,
                          seed=trainer.cfg.seed)
        return CheckResult(len(prompts), result.accuracy)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=trainer.cfg.rollout.max_new_tokens,
                            stop_token_ids=tuple(trainer.stop_ids))
    groups, _ = replace(trainer.generator, params=greedy).generate(trainer.engine, prompts, [1] * len(prompts),
                                                                   trainer.cfg.seed * 7919)
    score_groups(groups, [trainer.judge])
    expected = [first_result(trainer.task.demonstrate(p)) for p in prompts]
    return tally([g.rollouts[0] for g in groups], expected, trainer.generator.fmt)


def first_result(demo) -> str | None:
    """The first tool result of a demonstration (what the right first call returns), if it has one."""
    results = demo.tool_results() if isinstance(demo, Conversation) else []
    return results[0] if results else None


def tally(rollouts, expected: list[str | None], fmt) -> CheckResult:
    """The counts of the module docstring over ``rollouts`` (one greedy episode per prompt)."""
    calls = parsed = calling = right = 0
    for r, want in zip(rollouts, expected):
        turns = [m["content"] for m in r.messages or [] if m["role"] == "assistant"]
        written = [fmt.safe_parse(t) for t in turns]
        calling += bool(written and written[0])
        calls += sum(map(len, written))
        parsed += sum(c.error is None for turn in written for c in turn)
        results = [m["content"] for m in r.messages or [] if m["role"] == "tool"]
        right += want is not None and bool(results) and results[0].strip() == want.strip()
    n = len(rollouts)
    return CheckResult(n, sum(bool(r.correct) for r in rollouts) / n, calling / n, calls,
                       parsed / calls if calls else None, right / n, sum(r.failure is not None for r in rollouts))


def write_check(directory, cfg, losses: list[float], minutes: float, result: CheckResult) -> None:
    """``<directory>/sft_check.json``: the check, the warm start that led to it (steps, batch, lr, losses,
    minutes) and the machine it ran on."""
    import json
    from pathlib import Path

    from rollwise.hardware import cpu_record

    record = {"recipe": cfg.name, "seed": cfg.seed, "check": result.as_dict(),
              "sft": {"steps": cfg.sft.steps, "batch_size": cfg.sft.batch_size, "lr": cfg.sft.lr,
                      "loss_first": losses[0], "loss_last": losses[-1], "minutes": round(minutes, 2)},
              "threads": cfg.model.threads, "cpu": cpu_record()}
    (Path(directory) / CHECK_FILE).write_text(json.dumps(record, indent=2) + "\n")
