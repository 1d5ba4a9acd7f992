"""``group``: independent sampling, ``num_generations`` completions per prompt (GRPO's rollout).

The contract every generator keeps (``rollwise.generate.base.Generator``):
``generate(engine, prompts, budgets, seed) -> (groups, metrics)``, with ``budgets[i]`` the
number of rollouts for ``prompts[i]`` (from ``control.allocate``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rollwise.engine.engine import Completion, Engine, Request
from rollwise.engine.sampling import SamplingParams
from rollwise.generate.base import Generator
from rollwise.types import Prompt, Rollout, RolloutGroup


@dataclass
class GroupSampler(Generator):
    """Sample every prompt's rollouts independently in one engine run."""

    params: SamplingParams
    decode: object  # token ids -> text (the tokenizer's decode, special tokens skipped)

    def generate(self, engine: Engine, prompts: list[Prompt], budgets: list[int],
                 seed: int) -> tuple[list[RolloutGroup], dict[str, float]]:
        requests, owners = [], []
        for pi, (prompt, n) in enumerate(zip(prompts, budgets)):
            for j in range(n):
                # one seed per (step seed, prompt slot, sample): reproducible whatever the batching
                params = replace(self.params, seed=hash((seed, pi, j)) & (2**62 - 1))
                requests.append(Request(prompt.token_ids, params))
                owners.append(pi)
        completions = engine.generate(requests)
        groups = [RolloutGroup(prompt=p, rollouts=[]) for p in prompts]
        for pi, c in zip(owners, completions):
            groups[pi].rollouts.append(to_rollout(prompts[pi], c, self.decode))
        return groups, {}


def to_rollout(prompt: Prompt, c: Completion, decode) -> Rollout:
    """The Rollout record of one engine completion of ``prompt``."""
    return Rollout(
        prompt_id=prompt.id,
        prompt_ids=c.prompt_ids,
        completion_ids=c.token_ids,
        behavior_logprobs=c.logprobs,
        versions=c.versions,
        finish_reason=c.finish_reason,
        completion_text=decode(c.token_ids),
        loss_weights=forced_weights(len(c.token_ids), c.forced),
    )


def forced_weights(n: int, forced: list[int]) -> list[int] | None:
    """A rollout's loss weights: 0 at the ``forced`` positions (tokens placed, not sampled); None if none."""
    if not forced:
        return None
    mask = [1] * n
    for i in forced:
        mask[i] = 0
    return mask

