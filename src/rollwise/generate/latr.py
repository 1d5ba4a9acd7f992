"""``latr``: lookahead tree rollouts — LATR ("Lookahead Tree-Based Rollouts for Enhanced
Trajectory-Level Exploration in Reinforcement Learning with Verifiable Rewards", 2025).

Each prompt starts from ``root_branches`` samples and grows to exactly ``num_generations``
trajectories:

1. **Branch** where the policy is uncertain: right after a branch samples a token whose
   position had top-1 probability below ``branch_threshold``, it forks in two: one child
   keeps the sampled token, the other continues from the most likely token not sampled there
   (``SlotEngine.fork(replace_last=...)``; the prefix is shared, not recomputed).
2. **Lookahead**: the pair then decodes ``lookahead`` more tokens. Either may branch again
   meanwhile; a member's window continues along its first child (the one that keeps the
   sampled token), which is exactly the continuation it would have had.
3. **Prune**: if the two lookahead windows are too similar — Jaccard similarity of their
   sets of token 4-grams (``ngram``) above ``prune_similarity`` — the new branch is dropped
   with every branch that grew out of it meanwhile (their tokens are wasted and counted) and
   the budget they held is free again.

A forced token was not sampled, so it is excluded from the loss (``Rollout.loss_weights``); its
behaviour log-prob is its probability under the sampling distribution. If a prompt's branches
all finish short of the budget, fresh root samples fill it (as TreePO's fallback).

Departures from the paper: the similarity measure is our documented choice (4-gram Jaccard
over the lookahead windows, windows cut short when a branch finishes); one branch per
uncertain position (the paper can branch into several candidates at once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pydantic import Field

from rollwise.config import StrictModel
from rollwise.engine.protocol import BranchingEngine
from rollwise.engine.sampling import SamplingParams
from rollwise.generate.base import Generator
from rollwise.generate.forest import Forest
from rollwise.types import Prompt, RolloutGroup, jaccard  # noqa: F401 (jaccard: the one definition, DaGRPO's too)


class LatrConfig(StrictModel):
    root_branches: int = Field(1, ge=1, description="independent samples each prompt starts from")
    branch_threshold: float = Field(0.5, gt=0, le=1, description="branch where the top-1 probability is below this")
    lookahead: int = Field(64, ge=1, description="tokens both children decode before the similarity check")
    ngram: int = Field(4, ge=1, description="n of the n-gram sets compared")
    prune_similarity: float = Field(0.8, ge=0, le=1, description="drop the new branch above this Jaccard similarity")


@dataclass
class _Pair:
    keep: int  # handle of the child that kept the sampled token (then of its first child, ...)
    new: int  # the child that took the alternative (likewise)
    prompt: int
    at: int  # completion position where they split
    keep_node: int  # the node each lineage is growing now
    new_node: int
    new_root: int  # the node the new branch started (discarded with its subtree when pruned)
    done: dict  # node -> finished token ids


@dataclass
class LatrSampler(Generator):
    params: SamplingParams
    decode: object
    cfg: LatrConfig

    def __post_init__(self) -> None:
        self.params = replace(self.params, top_candidates=max(self.params.top_candidates, 2))
        self._log_threshold = math.log(self.cfg.branch_threshold)

    def generate(self, engine: BranchingEngine, prompts: list[Prompt], budgets: list[int],
                 seed: int) -> tuple[list[RolloutGroup], dict[str, float]]:
        forest = Forest(engine, prompts, budgets, self.params, seed)
        self._pairs: list[_Pair] = []
        self._branched = self._pruned = 0
        for pi, budget in enumerate(budgets):
            forest.start(pi, min(self.cfg.root_branches, budget))
        forest.run(self._decide)
        assert not self._pairs, "a pair outlived both of its branches"
        metrics = forest.metrics("latr") | {"latr/branches": float(self._branched), "latr/pruned": float(self._pruned)}
        return forest.groups(self.decode), metrics

    def _decide(self, forest: Forest) -> None:
        self._resolve(forest)
        for handle, br in list(forest.live.items()):
            if not br.grow:
                continue
            view = forest.engine.peek(handle)
            n = len(view.token_ids)
            if n == br.seen or not view.candidates:
                continue
            br.seen = n
            (top_id, top_lp), *rest = view.candidates
            if top_lp >= self._log_threshold:
                continue
            if forest.count(br.prompt) >= forest.budgets[br.prompt]:
                continue
            sampled = view.token_ids[-1]
            alt = top_id if sampled != top_id else next((i for i, _ in rest), None)
            if alt is None:
                continue
            keep, new = forest.fork(handle, 2, replace_last=[None, alt])
            self._branched += 1
            for pair in self._pairs:  # a pair member that branched goes on as its first child
                if pair.keep == handle:
                    pair.keep, pair.keep_node = keep, forest.live[keep].node
                if pair.new == handle:
                    pair.new, pair.new_node = keep, forest.live[keep].node
            new_node = forest.live[new].node
            self._pairs.append(_Pair(keep, new, br.prompt, n - 1, forest.live[keep].node, new_node, new_node, {}))

    def _window(self, forest: Forest, pair: _Pair, handle: int, node: int) -> list[int] | None:
        """The pair member's lookahead window: complete, or cut short because the member
        finished; None while a live member is still filling it."""
        end = pair.at + 1 + self.cfg.lookahead
        if handle in forest.live:
            tokens = forest.tokens(handle)
            return tokens[pair.at : end] if len(tokens) >= end else None
        if node not in pair.done:  # finished since the last look
            pair.done[node] = next(lf.token_ids for lf in forest.leaves[pair.prompt] if lf.node == node)
        return pair.done[node][pair.at : end]

    def _resolve(self, forest: Forest) -> None:
        still = []
        for pair in self._pairs:
            removed = forest.trees[pair.prompt].removed
            if pair.keep_node in removed or pair.new_node in removed:
                continue  # a pair inside a subtree pruned meanwhile: nothing left to judge
            a = self._window(forest, pair, pair.keep, pair.keep_node)
            b = self._window(forest, pair, pair.new, pair.new_node)
            if a is None or b is None:
                still.append(pair)
            else:
                self._judge(forest, pair, a, b)
        self._pairs = still

    def _judge(self, forest: Forest, pair: _Pair, a: list[int], b: list[int]) -> None:
        # compare what follows the split: the first tokens differ by construction
        if jaccard(a[1:], b[1:], self.cfg.ngram) > self.cfg.prune_similarity:
            self._pruned += 1
            forest.discard(pair.prompt, pair.new_root)
