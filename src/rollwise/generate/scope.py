"""``scope``: step-wise correction of failed rollouts — keep the prefix before the first wrong step,
let a corrector write the rest (SCOPE, "Step-wise Correction for On-Policy Exploration", also
titled "Recycling Failures", 2025).

Where no rollout of a group is correct, a step checker scores each step of a failed rollout and
the first step scored below .5 is its first error. The rollout's own tokens before that step are
kept token for token (on-policy); the corrector writes the rest (off-policy); the corrected rollout
replaces the failed one only if it verifies. Here:

- steps: the matches of ``rollout.scope.step_pattern`` in the completion's text (default: numbers,
  ``=result`` and single symbols — arith's column working and countdown's expression alike; a
  paragraph pattern such as ``(?s).+?(?:\\n\\s*\\n|$)`` for free-form reasoning, METHODS.md's
  blank-line steps);
- the checker (rule-based): step i scores 1 when it equals the reference solution's step i (the
  task's ``demonstrate``), else 0 — exact on arith, whose working is unique;
- the corrector: the reference solution from that step on (an error at step 1 replaces the whole
  rollout);
- how many: at most ``max_corrected`` rollouts per failed group (null = G/2), those whose first
  error comes latest ("mostly correct");
- the objective: the reference has no log-probs, so the corrector's tokens train as SFT with weight
  .1 (``objective.scope_sft_weight``: their per-token advantage; their behaviour log-probs are the
  sampling policy's own, teacher-forced, so their IS weight is 1 at the first pass), the kept prefix
  with the group advantage of the corrected reward. ``Rollout.corrected_from`` is the first
  off-policy token.

Where we depart: the paper's PRM is a learned model over free-form steps and its corrector a
teacher model whose log-probs give the suffix a truncated IS weight; our checker compares with one
reference solution, so on countdown a step that departs from the reference counts as wrong even
when another solution continues it (such a rollout is corrected into the reference, or dropped if
that does not verify).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pydantic import Field, field_validator

from rollwise.config import StrictModel
from rollwise.generate.base import Rounds
from rollwise.generate.group import GroupSampler
from rollwise.generate.guide import failed
from rollwise.types import Rollout, RolloutGroup


class ScopeConfig(StrictModel):
    """``rollout.strategy: scope`` options: how a completion splits into steps, how many are corrected."""

    step_pattern: str = Field(r"=-?\d+|\d+|\S", description="regex of one step (default: numbers, '=result', single "
                              "symbols); the checker compares steps with the reference solution's")
    max_corrected: int | None = Field(None, ge=1, description="corrected rollouts per failed group (null = "
                                      "num_generations / 2, at least 1)")

    @field_validator("step_pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as err:
            raise ValueError(f"rollout.scope.step_pattern is not a regular expression: {err}") from None
        return value


def steps(text: str, pattern: str) -> list[re.Match]:
    return list(re.finditer(pattern, text))


def first_error(got: list[str], want: list[str]) -> int | None:
    """Index of the first step of ``got`` scored below .5 (it differs from ``want``'s, or ``want`` has no
    such step), ``len(got)`` when steps are missing at the end; None when the steps are the reference's.

    >>> first_error(["7", "+", "9"], ["7", "+", "8"]), first_error(["7"], ["7", "+"]), first_error(["1"], ["1"])
    (2, 1, None)
    """
    for i, g in enumerate(got):
        if i >= len(want) or g != want[i]:
            return i
    return len(got) if len(got) < len(want) else None


@dataclass
class ScopeSampler(GroupSampler):
    """Group sampling; then ``revise`` corrects failed rollouts of the groups that all failed."""

    scope: ScopeConfig = field(default_factory=ScopeConfig)
    group_size: int = 8  # rollout.num_generations

    def revise(self, groups: list[RolloutGroup], rounds: Rounds) -> dict[str, float]:
        tried = kept = tokens = 0
        limit = self.scope.max_corrected or max(self.group_size // 2, 1)
        for g in groups:
            reference = rounds.demonstrate(g.prompt) if failed(g) else None
            if reference is None:
                continue
            want = [m.group() for m in steps(reference, self.scope.step_pattern)]
            located = []  # (first error, index in the group)
            for i, r in enumerate(g.rollouts):
                if r.failure is None:
                    k = first_error([m.group() for m in steps(r.completion_text, self.scope.step_pattern)], want)
                    if k is not None:
                        located.append((k, i))
            for k, i in sorted(located, key=lambda e: (-e[0], e[1]))[:limit]:
                tried += 1
                fixed = self.correct(g.rollouts[i], k, reference, want, rounds)
                rounds.score([RolloutGroup(g.prompt, [fixed])])
                if fixed.correct:  # kept only if it verifies
                    g.rollouts[i] = fixed
                    kept += 1
                    tokens += fixed.num_tokens - fixed.corrected_from
        return super().revise(groups, rounds) | {"scope/corrected": float(kept), "scope/tried": float(tried),
                                                 "scope/corrector_tokens": float(tokens)}

    def correct(self, r: Rollout, k: int, reference: str, want: list[str], rounds: Rounds) -> Rollout:
        """``r`` with its steps from ``k`` on replaced by the reference's: its own token ids up to the last
        token boundary before step ``k``, then the corrector's ids (and the stop token)."""
        got = steps(r.completion_text, self.scope.step_pattern)
        keep_text = r.completion_text[: got[k - 1].end()] if k else ""
        ref_steps = steps(reference, self.scope.step_pattern)
        corrector_text = reference[ref_steps[k - 1].end():] if k else reference
        t = kept_tokens(r.completion_ids, keep_text, self.decode)
        suffix = rounds.encode_text(keep_text[len(self.decode(r.completion_ids[:t])):] + corrector_text)
        ids = r.completion_ids[:t] + suffix + list(self.params.stop_token_ids[:1])
        behaviour = rounds.logprobs(r.prompt_ids, ids)  # the sampling policy's own: IS weight 1 on the suffix
        version = r.versions[-1] if r.versions else 0
        return Rollout(prompt_id=r.prompt_id, prompt_ids=r.prompt_ids, completion_ids=ids,
                       behavior_logprobs=r.behavior_logprobs[:t] + behaviour[t:],
                       versions=r.versions[:t] + [version] * (len(ids) - t), finish_reason="stop",
                       completion_text=self.decode(ids), corrected_from=t)


def kept_tokens(ids: list[int], text: str, decode) -> int:
    """The most leading tokens of ``ids`` whose decoded text is a prefix of ``text`` (token for token:
    a token that straddles the end of ``text`` is not kept)."""
    t = 0
    while t < len(ids) and text.startswith(decode(ids[: t + 1])):
        t += 1
    return t
