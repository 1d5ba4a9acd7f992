"""The machinery tree-shaped strategies share: a ``Tree`` per prompt and a ``Forest`` of live
branches driven step by step on the slot engine.

A node is a maximal run of completion tokens between two forks: ``[start, end)`` positions of
the completion, shared by every leaf below it. The root (id 0) is the prompt itself and holds
no tokens. A leaf's completion is the concatenation of the spans on its path, so the tokens
the engine samples for a tree are exactly the sum of its node lengths (plus any branch pruned
away, which ``Forest.wasted_tokens`` counts).

The forest calls ``engine.step()`` itself so a strategy can look at every live branch between
two steps (``decide``) and fork or prune it right there: a fork at that moment shares the
cached prefix (``SlotEngine.fork`` copies it, never recomputes it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from rollwise.config import ConfigError
from rollwise.engine.engine import Request
from rollwise.engine.protocol import BranchingEngine
from rollwise.engine.sampling import SamplingParams
from rollwise.generate.group import forced_weights
from rollwise.seeds import derive
from rollwise.types import Prompt, Rollout, RolloutGroup, Tree


@dataclass
class Branch:
    """A live sequence of the forest: which prompt, which node it is growing."""

    prompt: int
    node: int
    grow: bool = True  # may branch further (fallback samples do not)
    seen: int = 0  # token count at which the strategy last examined it
    data: dict = field(default_factory=dict)  # strategy scratch


@dataclass
class Leaf:
    node: int
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    forced: list[int]
    finish_reason: str


class Forest:
    """Live branches of many prompts' trees on one engine; leaves collected as they finish."""

    def __init__(self, engine: BranchingEngine, prompts: list[Prompt], budgets: list[int], params: SamplingParams,
                 seed: int):
        if not hasattr(engine, "fork"):
            raise ConfigError("tree-shaped rollout strategies need the slot engine (fork); set rollout.engine=slots "
                             "(Llama/Qwen2/Mistral models) or use rollout.strategy=group")
        self.engine, self.prompts, self.budgets, self.params, self.seed = engine, prompts, budgets, params, seed
        self.trees = [Tree() for _ in prompts]
        self.live: dict[int, Branch] = {}  # change through _add/_take, which keep live_per_prompt
        self.live_per_prompt = [0] * len(prompts)
        self.leaves: list[list[Leaf]] = [[] for _ in prompts]
        self.fallback_rounds = [0] * len(prompts)
        self.wasted_tokens = 0  # tokens of branches pruned away (not in any leaf)
        self.placed_tokens = 0  # tokens placed by fork(replace_last), not sampled
        self.forks = 0

    # -- what strategies call ------------------------------------------------------------
    def start(self, pi: int, n: int, *, grow: bool = True, salt: int = 0) -> list[int]:
        """``n`` fresh samples of prompt ``pi`` as new children of the root: one request,
        forked while queued so the prompt is prefilled once for all of them (``n`` = 0: none)."""
        if n <= 0:
            return []
        seed = derive(self.seed, pi, salt)
        (handle,) = self.engine.submit([Request(self.prompts[pi].token_ids, _with_seed(self.params, seed))])
        handles = self.engine.fork(handle, n) if n > 1 else [handle]
        for h in handles:
            self._add(h, Branch(pi, self.trees[pi].add(0, 0), grow=grow))
        return handles

    def fork(self, handle: int, n: int, replace_last: list[int | None] | None = None) -> list[int]:
        """Split a live branch into ``n``. Children share every token so far, or, with
        ``replace_last``, every token but the last (then they split at the last position)."""
        br = self._take(handle)
        tokens = len(self.engine.peek(handle).token_ids)
        at = tokens - 1 if replace_last is not None else tokens
        tree = self.trees[br.prompt]
        tree.nodes[br.node].end = at
        children = self.engine.fork(handle, n, replace_last=replace_last)
        for c in children:
            self._add(c, Branch(br.prompt, tree.add(br.node, at), grow=br.grow, seen=tokens))
        self.forks += 1
        self.placed_tokens += sum(t is not None for t in replace_last or ())
        return children

    def stop(self, handles: list[int]) -> None:
        """End live branches early; what they sampled stays a leaf (finish_reason ``pruned``)."""
        if not handles:
            return
        for h, st in zip(handles, self.engine.pause(handles)):
            self._leaf(self._take(h), st.token_ids, st.logprobs, st.versions, st.forced, "pruned")

    def discard(self, pi: int, node: int) -> None:
        """Remove ``node`` and its whole subtree from prompt ``pi``'s tree: live branches below it
        are stopped, finished leaves below it dropped; their tokens count as wasted."""
        tree = self.trees[pi]
        under = set(tree.subtree(node))
        handles = [h for h, b in self.live.items() if b.prompt == pi and b.node in under]
        for h, st in zip(handles, self.engine.pause(handles) if handles else []):
            tree.nodes[self._take(h).node].end = len(st.token_ids)
        self.leaves[pi] = [lf for lf in self.leaves[pi] if lf.node not in under]
        self.wasted_tokens += sum(tree.nodes[n].length for n in under)
        tree.remove(node)

    def tokens(self, handle: int) -> list[int]:
        return self.engine.peek(handle).token_ids

    def count(self, pi: int) -> int:
        """Leaves a prompt has or will have: finished leaves + live branches."""
        return len(self.leaves[pi]) + self.live_per_prompt[pi]

    # -- the loop ------------------------------------------------------------------------
    def run(self, decide: Callable[[Forest], None], fallback: bool = True) -> None:
        """Step the engine until every prompt has its budget of leaves; ``decide`` runs after each step."""
        while self.live:
            for c in self.engine.step():
                if c.handle in self.live:
                    br = self._take(c.handle)
                    self._leaf(br, c.token_ids, c.logprobs, c.versions, c.forced, c.finish_reason)
            decide(self)
            if fallback:
                self._fallback()

    def _fallback(self) -> None:
        """A prompt whose branches all ended short of its budget gets fresh root samples (no branching)."""
        for pi, budget in enumerate(self.budgets):
            missing = budget - len(self.leaves[pi])
            if missing > 0 and not self.live_per_prompt[pi]:
                self.fallback_rounds[pi] += 1
                self.start(pi, missing, grow=False, salt=self.fallback_rounds[pi])

    def _add(self, handle: int, br: Branch) -> None:
        self.live[handle] = br
        self.live_per_prompt[br.prompt] += 1

    def _take(self, handle: int) -> Branch:
        br = self.live.pop(handle)
        self.live_per_prompt[br.prompt] -= 1
        return br

    def _leaf(self, br: Branch, token_ids, logprobs, versions, forced, reason) -> None:
        self.trees[br.prompt].nodes[br.node].end = len(token_ids)
        self.leaves[br.prompt].append(Leaf(br.node, list(token_ids), list(logprobs), list(versions),
                                           list(forced), reason))

    # -- results -------------------------------------------------------------------------
    def groups(self, decode) -> list[RolloutGroup]:
        """One group per prompt: its leaves as rollouts (in tree order), the tree beside them."""
        groups = []
        for pi, prompt in enumerate(self.prompts):
            tree = self.trees[pi]
            leaves = sorted(self.leaves[pi], key=lambda lf: tree.path(lf.node))
            rollouts = [
                Rollout(prompt_id=prompt.id, prompt_ids=list(prompt.token_ids), completion_ids=lf.token_ids,
                        behavior_logprobs=lf.logprobs, versions=lf.versions, finish_reason=lf.finish_reason,
                        completion_text=decode(lf.token_ids), node_path=tree.path(lf.node),
                        loss_weights=forced_weights(len(lf.token_ids), lf.forced))
                for lf in leaves
            ]
            groups.append(RolloutGroup(prompt=prompt, rollouts=rollouts, tree=tree))
        return groups

    @property
    def sampled_tokens(self) -> int:
        """Tokens the engine sampled for this forest: every node once, pruned branches included."""
        return sum(t.unique_tokens for t in self.trees) + self.wasted_tokens - self.placed_tokens

    def metrics(self, prefix: str) -> dict[str, float]:
        leaves = sum(len(lv) for lv in self.leaves)
        prompts = max(sum(b > 0 for b in self.budgets), 1)  # a prompt with budget 0 has no tree
        unique = sum(t.unique_tokens for t in self.trees)
        leaf_tokens = sum(len(lf.token_ids) for lv in self.leaves for lf in lv)
        return {
            f"{prefix}/leaves_per_prompt": leaves / prompts,
            f"{prefix}/nodes_per_prompt": sum(len(t.live_nodes()) - 1 for t in self.trees) / prompts,
            f"{prefix}/forks": float(self.forks),
            f"{prefix}/sampled_tokens_per_leaf": self.sampled_tokens / max(leaves, 1),
            f"{prefix}/shared_token_ratio": 1 - unique / max(leaf_tokens, 1),
            f"{prefix}/wasted_tokens": float(self.wasted_tokens),
            f"{prefix}/fallback_prompts": float(sum(r > 0 for r in self.fallback_rounds)),
        }


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    return replace(params, seed=seed)

