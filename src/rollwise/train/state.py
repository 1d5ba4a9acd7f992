"""What a run has done and when it stops: ``TrainState`` (saved with every checkpoint as
``state.json``) and ``RunLimits`` (what ``Trainer.fit(until=...)`` runs to)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TrainState:
    """What a checkpoint records besides tensors (``state.json``)."""

    step: int = 0
    cursor: int = 0  # index of the next training prompt
    generated_tokens: int = 0
    wall_seconds: float = 0.0  # RL wall time, summed over sessions of a resumed run
    # CPU time of the trainer's process (all its threads: model load, SFT, evals, RL; not Ray or tool workers),
    # summed over sessions up to each one's last checkpoint: the cost on a shared machine, where wall time is load
    cpu_seconds: float = 0.0
    initial_accuracy: float | None = None
    last_accuracy: float | None = None
    reference_moved_at: int | None = None  # the step the reference model became the policy (ReMix), if any
    skipped_updates: int = 0  # optimizer passes skipped because their loss or gradient norm was not finite
    # per reward function that scored: rollouts, errors, non-finite values, first failure reason (train/outcome.py)
    reward_failures: dict = field(default_factory=dict)
    zero_signal_steps: int = 0  # steps in which no group had a reward spread (nothing trained)
    engine_fallback: bool = False  # the mismatch guard moved the engine to fp32 (train/precision.py): kept on resume
    # the precisions `auto` (or the config) resolved to when the run started, by config key ("rollout.engine_dtype":
    # "float32", "optim.compute_dtype": ...): a resumed run keeps them, on another machine too (train/precision.py)
    precision: dict | None = None
    support_base: dict | None = None  # prompt id -> solved at the first sampled eval (support_diag: eval/support.py)


@dataclass(frozen=True)
class RunLimits:
    """When ``Trainer.fit`` stops: the first limit reached (None = no limit of that kind)."""

    steps: int | None = None
    minutes: float | None = None  # RL wall time, summed over the sessions of a resumed run
    generated_tokens: int | None = None  # tokens the engine sampled (equal-compute comparisons)

    @classmethod
    def from_config(cls, train) -> "RunLimits":
        """The recipe's limits (``train.steps``, ``train.max_minutes``, ``train.max_generated_tokens``)."""
        return cls(steps=train.steps, minutes=train.max_minutes, generated_tokens=train.max_generated_tokens)

    def reached(self, state: TrainState) -> str | None:
        """The name of the limit ``state`` has reached, or None."""
        if self.steps is not None and state.step >= self.steps:
            return f"steps={self.steps}"
        if self.minutes is not None and state.wall_seconds > 60 * self.minutes:
            return f"max_minutes={self.minutes}"
        if self.generated_tokens is not None and state.generated_tokens >= self.generated_tokens:
            return f"max_generated_tokens={self.generated_tokens:,}"
        return None

    def progress(self, state: TrainState) -> float:
        """How far ``state`` is towards stopping: the largest used/limit over the limits set (0 if none)."""
        used = [state.step / self.steps if self.steps else 0.0,
                state.wall_seconds / (60 * self.minutes) if self.minutes else 0.0,
                state.generated_tokens / self.generated_tokens if self.generated_tokens else 0.0]
        return max(used)


def run_summary(state: TrainState, cfg, task_name: str, judge: str | None = None, has_eval: bool = True) -> dict:
    """``summary.json``: the run's outcome and what it was (``cfg``: its ``RunConfig``; ``judge``: the
    eval judge's name; ``has_eval``: the task has an eval split). Keys: ``train/outcome.py``."""
    from rollwise.train.outcome import NO_EVAL

    out = {
        "initial_accuracy": state.initial_accuracy, "final_accuracy": state.last_accuracy, "steps": state.step,
        "wall_seconds": round(state.wall_seconds, 2),
        "cpu_seconds": round(state.cpu_seconds, 2), "generated_tokens": state.generated_tokens, "seed": cfg.seed,
        "task": task_name, "method": cfg.objective.method, "eval_judge": judge,
        "reward_failures": {name: rec for name, rec in state.reward_failures.items()
                            if rec["errors"] or rec["non_finite"]},
        "zero_signal_steps": state.zero_signal_steps,
    }
    if not has_eval:
        out["eval"] = NO_EVAL
    if cfg.control.method != "none":
        out["control"] = cfg.control.method
    if cfg.replay.method != "none":
        out["replay"] = cfg.replay.method
    if cfg.train.mode == "async":
        out |= {"mode": "async", "max_staleness": cfg.train.max_staleness}
    return out
