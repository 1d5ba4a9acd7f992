"""Independent samples with online pruning: the generation half of ``arrol`` (control/arrol.py).

Each prompt starts ``over_provision`` × its budget samples (one request forked while queued,
so the prompt is prefilled once). When every sample of a prompt has either sampled
``segment_len`` tokens or finished, the ``pruner`` sees their final hidden states at that
point and names the ones to keep (``budget`` of them); the others are aborted in the engine
(``SlotEngine.abort``: slots freed, no completion, ``engine.stats.aborted_tokens``) or, if
already finished, dropped. Pruned rollouts leave no tokens behind: they are in no group.

While the pruner is not ready (``pruner.ready()`` false) a prompt starts just its budget and
nothing is pruned; the hidden states are still recorded (``features``), so the pruner can
learn from the scored rollouts (``features[id(rollout)]``).

The pruner is duck-typed (``ready() -> bool``, ``keep(features [n, D], budget) -> indices``):
this module knows nothing of control/.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from rollwise.config import ConfigError
from rollwise.engine.engine import Completion, Request
from rollwise.engine.protocol import BranchingEngine
from rollwise.engine.sampling import SamplingParams
from rollwise.generate.base import Generator
from rollwise.generate.group import to_rollout
from rollwise.generate.live import LiveRollouts
from rollwise.seeds import derive
from rollwise.types import Prompt, RolloutGroup


@dataclass
class PrunedSampler(Generator):
    params: SamplingParams
    decode: object
    pruner: object  # ready() -> bool; keep(features [n, D], budget) -> list of indices to keep
    over_provision: int = 2
    segment_len: int = 8
    features: dict[int, torch.Tensor] = field(default_factory=dict)  # id(rollout) -> [D], last call's rollouts

    def generate(self, engine: BranchingEngine, prompts: list[Prompt], budgets: list[int],
                 seed: int) -> tuple[list[RolloutGroup], dict[str, float]]:
        if not hasattr(engine, "abort"):
            raise ConfigError("control.method=arrol prunes inside generation and needs the slot engine; set "
                              "rollout.engine=slots (Llama/Qwen2/Mistral models) or choose another control.method")
        params = replace(self.params, keep_hidden=True)
        pruning = self.pruner.ready()
        handles: list[list[int]] = []
        for pi, (prompt, n) in enumerate(zip(prompts, budgets)):
            start = n * self.over_provision if pruning else n
            (h,) = engine.submit([Request(prompt.token_ids, replace(params, seed=derive(seed, pi)))])
            handles.append(engine.fork(h, start) if start > 1 else [h])
        live = LiveRollouts(engine, [h for hs in handles for h in hs])
        feature: dict[int, torch.Tensor] = {}  # handle -> [D] hidden state at the pruning point
        decided = [False] * len(prompts)
        pruned = pruned_tokens = 0

        def prune(finished) -> None:
            nonlocal pruned, pruned_tokens
            for c in finished:
                feature.setdefault(c.handle, c.hidden)
            for h in live.alive:
                view = engine.peek(h)
                if h not in feature and len(view.token_ids) >= self.segment_len and view.hidden is not None:
                    feature[h] = view.hidden
            for pi, hs in enumerate(handles):
                if decided[pi] or any(h not in feature for h in hs):
                    continue
                decided[pi] = True
                if len(hs) <= budgets[pi]:
                    continue
                keep = set(self.pruner.keep(torch.stack([feature[h] for h in hs]), budgets[pi]))
                drop = [h for i, h in enumerate(hs) if i not in keep]
                pruned_tokens += sum(len(engine.peek(h).token_ids) for h in drop if h in live.alive)
                pruned_tokens += sum(len(live.done[h].token_ids) for h in drop if h in live.done)
                live.abort(drop)
                handles[pi] = [h for i, h in enumerate(hs) if i in keep]
                pruned += len(drop)

        live.run(prune)
        groups = self.groups(prompts, handles, live.done, feature)
        return groups, {"arrol/pruning": float(pruning), "arrol/pruned_rollouts": float(pruned),
                        "arrol/pruned_tokens": float(pruned_tokens)}

    def groups(self, prompts: list[Prompt], handles: list[list[int]], done: dict[int, Completion],
               feature: dict[int, torch.Tensor]) -> list[RolloutGroup]:
        """The kept rollouts of each prompt; their hidden states into ``features`` (by rollout id)."""
        groups = []
        self.features.clear()  # the pruner holds this dict: filled in place
        for pi, prompt in enumerate(prompts):
            rollouts = []
            for h in handles[pi]:
                r = to_rollout(prompt, done[h], self.decode)
                rollouts.append(r)
                self.features[id(r)] = feature[h]
            groups.append(RolloutGroup(prompt=prompt, rollouts=rollouts))
        return groups
