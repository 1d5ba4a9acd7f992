"""``group``: independent sampling, ``num_generations`` completions per prompt (GRPO's rollout).

The contract every generator keeps (``rollwise.generate.base.Generator``):
``generate(engine, prompts, budgets, seed) -> (groups, metrics)``, with ``budgets[i]`` the
number of rollouts for ``prompts[i]`` (from ``control.allocate``).

Online pruning (``gate``): with a gate, the sampler steps the engine itself and, every
``gate_every`` sampled tokens of a rollout (the segment boundaries), asks
``gate(Partial)``; a rollout the gate stops is aborted in the engine (slot freed, no
completion, ``engine.stats.aborted_tokens``) and leaves nothing in its group. A prompt's
last remaining rollout is never stopped: every prompt keeps a group. The trainer wires a
controller's ``should_continue`` here (control/base.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from rollwise.config import ConfigError
from rollwise.engine.engine import Completion, Request
from rollwise.engine.protocol import BranchingEngine, TokenEngine
from rollwise.engine.sampling import SamplingParams
from rollwise.generate.base import Generator
from rollwise.generate.live import LiveRollouts
from rollwise.seeds import derive
from rollwise.types import Prompt, Rollout, RolloutGroup


@dataclass
class GroupSampler(Generator):
    """Sample every prompt's rollouts independently in one engine run."""

    params: SamplingParams
    decode: object  # token ids -> text (the tokenizer's decode, special tokens skipped)
    gate: Callable[[Partial], bool] | None = None  # online pruning: False stops the rollout
    gate_every: int = 0  # tokens between two gate calls on one rollout
    anchors: bool = False  # DaGRPO: the reference solution joins groups with <= 1 correct (generate/anchor.py)

    def generate(self, engine: TokenEngine, prompts: list[Prompt], budgets: list[int],
                 seed: int) -> tuple[list[RolloutGroup], dict[str, float]]:
        requests, owners = [], []
        for pi, (prompt, n) in enumerate(zip(prompts, budgets)):
            for j in range(n):
                # one seed per (step seed, prompt slot, sample): reproducible whatever the batching
                params = replace(self.params, seed=derive(seed, pi, j))
                requests.append(Request(prompt.token_ids, params))
                owners.append(pi)
        if self.gate is None:
            completions, metrics = engine.generate(requests), {}
        else:
            completions, metrics = self.gated(engine, requests, owners, prompts)
        groups = [RolloutGroup(prompt=p, rollouts=[]) for p in prompts]
        for pi, c in zip(owners, completions):
            if c is not None:
                groups[pi].rollouts.append(to_rollout(prompts[pi], c, self.decode))
        return groups, metrics

    def revise(self, groups: list[RolloutGroup], rounds) -> dict[str, float]:
        """DaGRPO's anchors when ``anchors`` is on (subclasses call this after their own revision)."""
        if not self.anchors:
            return {}
        from rollwise.generate.anchor import add_anchors

        return add_anchors(groups, rounds, self.params.stop_token_ids)

    def gated(self, engine: BranchingEngine, requests: list[Request], owners: list[int],
              prompts: list[Prompt]) -> tuple[list[Completion | None], dict[str, float]]:
        """Run ``requests`` asking the gate at every ``gate_every`` tokens; stopped ones come back None."""
        if not hasattr(engine, "abort"):
            raise ConfigError("a controller that stops rollouts during generation (should_continue) needs the "
                              "slot engine; set rollout.engine=slots (Llama/Qwen2/Mistral models)")
        handles = engine.submit(requests)
        index = {h: i for i, h in enumerate(handles)}
        remaining = [0] * len(prompts)  # rollouts of each prompt not stopped
        for pi in owners:
            remaining[pi] += 1
        live, asked = LiveRollouts(engine, handles), {}
        stopped = stopped_tokens = 0
        every = max(self.gate_every, 1)

        def ask_the_gate(_finished) -> None:
            nonlocal stopped, stopped_tokens
            stop = []
            for h in sorted(live.alive):
                view = engine.peek(h)
                n = len(view.token_ids)
                if n == 0 or n % every or asked.get(h) == n:
                    continue
                asked[h] = n
                pi = owners[index[h]]
                if remaining[pi] > 1 and not self.gate(Partial(prompts[pi], view.token_ids, view.logprobs,
                                                               view.hidden)):
                    stop.append(h)
                    remaining[pi] -= 1
                    stopped_tokens += n
            live.abort(stop)
            stopped += len(stop)

        live.run(ask_the_gate)
        return live.completions(handles), {"control/stopped_rollouts": float(stopped),
                                           "control/stopped_tokens": float(stopped_tokens)}


@dataclass(frozen=True)
class Partial:
    """What ``Controller.should_continue`` sees of a rollout at a segment boundary."""

    prompt: Prompt
    token_ids: list[int]  # sampled so far (the engine's own list: read only)
    logprobs: list[float]
    hidden: object = None  # [D] final hidden state behind the latest token, if the sampler keeps it


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

