"""Accuracy on a held-out split: greedy accuracy, unbiased pass@k and maj@k from sampled completions; for
episodes, their tool use too (``rollwise.eval.tool_use``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rollwise.config import ConfigError
from rollwise.engine.engine import Engine, Request
from rollwise.engine.sampling import SamplingParams
from rollwise.eval.majority import maj_at_k
from rollwise.eval.passk import pass_at_k
from rollwise.eval.support import sample_metrics
from rollwise.eval.tool_use import table_rows, tool_use
from rollwise.filter.rewards import RewardFn, score_groups
from rollwise.generate.group import to_rollout
from rollwise.types import Prompt, RolloutGroup


@dataclass
class EvalResult:
    accuracy: float  # greedy
    pass_at: dict[int, float]  # k -> unbiased pass@k over `samples` sampled completions per prompt
    mean_length: float
    samples: list[dict]  # a few greedy rollouts with their rewards, for samples.jsonl
    maj_at: dict[int, float] = field(default_factory=dict)  # k -> maj@k: majority vote of the k = `samples` answers
    # greedy correctness per prompt, in eval-set order, and the prompts' ids: a bench pairs two runs
    # prompt by prompt on one eval set (rollwise.bench.stats)
    correct: list[bool] = field(default_factory=list)
    prompt_ids: list[str] = field(default_factory=list)
    # episodes (an environment task): tool use of the greedy episodes (rollwise.eval.tool_use), eval/* names
    tool_use: dict[str, float] = field(default_factory=dict)
    # support_diag (rollwise.eval.support), with samples: per prompt, some sample correct; the entropy and
    # support metrics (the trainer adds shrinkage/expansion against its first eval)
    solved: list[bool] = field(default_factory=list)
    support: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        out = {"eval/accuracy": self.accuracy, "eval/mean_length": self.mean_length}
        out.update({f"eval/pass@{k}": v for k, v in self.pass_at.items()})
        out.update({f"eval/maj@{k}": v for k, v in self.maj_at.items()})
        return out | self.support | self.tool_use

    def table(self) -> list[tuple[str, str]]:
        """What ``rollwise eval`` prints: ``(label, value)`` lines."""
        return table_rows(self.metrics(), len(self.correct))


def _groups(engine: Engine, prompts: list[Prompt], params: SamplingParams, n: int, decode, seed: int,
            episodes=None) -> tuple[list[RolloutGroup], dict[str, float]]:
    """The groups of ``n`` completions per prompt, and (episodes) the sampler's metrics."""
    if episodes is not None:  # multi-turn: the run's EpisodeSampler (or HarnessSampler) with these sampling settings
        # the copy shares the sampler's endpoints (a harness's): it serves this engine from its own, never
        # closing another engine's (async mode's producer), and the trainer's close() stops them all
        return replace(episodes, params=params).generate(engine, prompts, [n] * len(prompts), seed * 7919)
    requests = [Request(p.token_ids, replace(params, seed=seed * 7919 + i)) for p in prompts for i in range(n)]
    completions = engine.generate(requests)
    return [
        RolloutGroup(p, [to_rollout(p, c, decode) for c in completions[pi * n : (pi + 1) * n]])
        for pi, p in enumerate(prompts)
    ], {}


def evaluate(
    engine: Engine, prompts: list[Prompt], judge: RewardFn, decode, *, max_new_tokens: int, stop_token_ids,
    samples: int = 0, temperature: float = 1.0, seed: int = 0, keep: int = 4, episodes=None,
) -> EvalResult:
    """Greedy accuracy (``judge`` says correct: ``rollwise.types.is_correct``) and, when ``samples`` > 0,
    pass@1, pass@samples and maj@samples (``rollwise.eval.majority``: a vote by the judge's extracted answers).
    ``episodes`` (a ``generate.episode.EpisodeSampler``): every prompt is a multi-turn episode with
    the run's environment, scored by ``judge`` and the environment's own reward; the greedy episodes'
    tool use is reported beside accuracy (``rollwise.eval.tool_use``).

    No prompts (an empty eval split) is a ``ConfigError``: a run without an eval split skips its
    evals (``Trainer.has_eval``) rather than calling this."""
    if not prompts:
        raise ConfigError("no eval prompts: the task's eval split is empty (task.name=file: set task.eval_fraction "
                          "above 0 with enough rows to hold some out, or task.eval_path)")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=tuple(stop_token_ids))
    groups, episode_metrics = _groups(engine, prompts, greedy, 1, decode, seed, episodes)
    score_groups(groups, [judge])
    correct = [g.rollouts[0].correct for g in groups]
    lengths = [g.rollouts[0].num_tokens for g in groups]
    pass_at: dict[int, float] = {}
    maj_at: dict[int, float] = {}
    solved: list[bool] = []
    support: dict[str, float] = {}
    if samples > 0:
        sampled = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, stop_token_ids=tuple(stop_token_ids))
        sgroups, _ = _groups(engine, prompts, sampled, samples, decode, seed, episodes)
        score_groups(sgroups, [judge])
        counts = [g.num_correct for g in sgroups]
        for k in sorted({1, samples}):
            pass_at[k] = sum(pass_at_k(samples, c, k) for c in counts) / len(counts)
        maj_at[samples] = maj_at_k([([r.extracted_answer for r in g.rollouts], [r.correct for r in g.rollouts])
                                    for g in sgroups])
        solved, support = [c > 0 for c in counts], sample_metrics(sgroups)
    kept = [
        {"prompt": g.prompt.text, "completion": g.rollouts[0].completion_text, "reward": g.rollouts[0].reward,
         "components": g.rollouts[0].reward_components, "reasons": g.rollouts[0].reward_reasons,
         "answer": g.prompt.answer}
        | ({"messages": g.rollouts[0].messages} if g.rollouts[0].messages is not None else {})
        for g in groups[:keep]
    ]
    return EvalResult(sum(correct) / len(correct), pass_at, sum(lengths) / len(lengths), kept, maj_at,
                      [bool(c) for c in correct], [p.id for p in prompts],
                      tool_use(episode_metrics, groups) if episodes is not None else {}, solved, support)
