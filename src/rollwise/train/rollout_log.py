"""Training rollouts for the report: ``rollouts.jsonl``, a bounded sample of each step's scored groups.

What is guaranteed:
- a logged step writes ``train.log_rollouts`` groups of the groups it sampled (those with a reward
  spread first, i.e. the ones that trained, then the rest, each in the order sampled), one JSON line
  per group, after advantages are assigned: every rollout's text, reward, each reward component and
  its reason, its advantage, and for an episode its messages (the tool calls and results) and its
  prompt as the model saw it (``prompt_rendered``: the first episode's prompt ids decoded with the
  chat template's special tokens — the system message and tool schemas a template adds are in it);
- the file stays under ``train.rollouts_mb``: when a write passes it, every other logged step is
  dropped and steps are logged half as often from then on (the stride, ``every``, doubles), so a
  long run keeps an even sample from its first step to its last. One completion or message is cut
  at ``TEXT_CHARS`` characters (the cut is said in the text);
- a fresh run starts the file empty; a resumed run drops the lines after its checkpoint's step and
  goes on with the stride recorded.

One line (``step`` is the ``metrics.jsonl`` step of the update that trained on the group)::

    {"step": 3, "every": 1, "prompt_id": "…", "prompt": "…", "answer": "…", "pass_rate": 0.5,
     "zero_signal": false, "rollouts": [{"completion": "…", "reward": 1.0, "score": 1.0,
     "components": {"arith": 1.0}, "reasons": {"arith": "…"}, "advantage": 0.87, "tokens": 12,
     "finish_reason": "stop", "correct": true, "messages": [...], "failure": "…"}]}

``messages`` and ``prompt_rendered`` (episodes, the latter when the log has a ``decode``) and ``failure``
(a failed episode) appear only when set.
"""

from __future__ import annotations

import json
from pathlib import Path

from rollwise.types import Rollout, RolloutGroup, is_zero_signal

TEXT_CHARS = 4000  # a completion or message longer than this is cut (the report shows text, not a dump)


def _cut(text: str) -> str:
    text = str(text)
    if len(text) <= TEXT_CHARS:
        return text
    return text[:TEXT_CHARS] + f" … [{len(text) - TEXT_CHARS:,} more characters not logged]"


def content_text(content) -> str:
    """A message's content as text: OpenAI content parts' text joined, None (a call-only turn) as ""."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def _advantage(rollout: Rollout) -> float | None:
    """The rollout's advantage: the mean over its tokens (one value for GRPO-family estimators)."""
    adv = rollout.advantage
    return round(sum(adv) / len(adv), 4) if adv else None


def rollout_record(rollout: Rollout) -> dict:
    """One rollout as plain data (see the module docstring)."""
    out = {"completion": _cut(rollout.completion_text), "reward": round(float(rollout.reward), 4),
           "score": rollout.score, "components": dict(rollout.reward_components),
           "reasons": {k: _cut(v) for k, v in rollout.reward_reasons.items()}, "advantage": _advantage(rollout),
           "tokens": rollout.num_tokens, "finish_reason": rollout.finish_reason, "correct": rollout.correct}
    if rollout.messages is not None:
        out["messages"] = [{**m, "content": _cut(content_text(m.get("content")))} if isinstance(m, dict) else m
                           for m in rollout.messages]
    if rollout.failure is not None:
        out["failure"] = _cut(rollout.failure)
    return out


def group_record(step: int, every: int, group: RolloutGroup, decode=None) -> dict:
    p = group.prompt
    out = {"step": step, "every": every, "prompt_id": p.id, "prompt": _cut(p.text), "answer": p.answer,
           "pass_rate": group.pass_rate, "zero_signal": is_zero_signal(group.live_rewards),
           "rollouts": [rollout_record(r) for r in group.rollouts]}
    if decode is not None and group.rollouts and group.rollouts[0].messages is not None:
        out["prompt_rendered"] = _cut(decode(group.rollouts[0].prompt_ids))
    return out


def pick_groups(groups: list[RolloutGroup], n: int) -> list[RolloutGroup]:
    """``n`` groups: those with a reward spread first (they trained), then the rest, in sampled order."""
    ranked = sorted(groups, key=lambda g: is_zero_signal(g.live_rewards))  # stable: sampled order kept
    return ranked[:n]


class RolloutLog:
    """Appends ``rollouts.jsonl`` in the run directory (``Trainer.prepare`` opens it)."""

    def __init__(self, run_dir: Path, groups_per_step: int = 2, budget_mb: float = 20.0,
                 resume_from_step: int | None = None, decode=None):
        self.path = Path(run_dir) / "rollouts.jsonl"
        self.decode = decode  # token ids -> text, special tokens kept: an episode's prompt as the model saw it
        self.groups_per_step, self.budget = groups_per_step, int(budget_mb * 1024 * 1024)
        # a fresh run starts the file (train/rundir.py decides whether the directory may be reused)
        records = [] if resume_from_step is None else [r for r in self._read() if r.get("step", 0) <= resume_from_step]
        self._write(records)
        self.every = max((int(r.get("every", 1)) for r in records), default=1)

    def log(self, step: int, groups: list[RolloutGroup]) -> None:
        """Write step ``step``'s sample, if the stride logs this step; thin the file past its budget."""
        if self.groups_per_step <= 0 or step % self.every:
            return
        with self.path.open("a") as f:
            for g in pick_groups(groups, self.groups_per_step):
                f.write(json.dumps(group_record(step, self.every, g, self.decode)) + "\n")
        if self.path.stat().st_size > self.budget:
            self._thin()

    def _thin(self) -> None:
        """Double the stride until the kept steps fit the budget (or one logged step is left)."""
        records = self._read()
        while True:
            self.every *= 2
            kept = [r | {"every": self.every} for r in records if r["step"] % self.every == 0]
            size = sum(len(json.dumps(r)) + 1 for r in kept)
            if size <= self.budget or len({r["step"] for r in kept}) <= 1:
                break
        self._write(kept)

    def _read(self) -> list[dict]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill
                continue
        return out

    def _write(self, records: list[dict]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
        tmp.replace(self.path)
