"""``difficulty_select``: "Improving Data Efficiency for LLM Reinforcement Fine-tuning Through
Difficulty-targeted Online Data Selection and Rollout Replay" (Sun et al., 2025), the
selection half.

Prefer prompts of moderate difficulty without rolling every candidate out: only a reference
set R has measured pass rates a_r; a candidate's pass rate is estimated by attention over R,

    â_q = Σ_r softmax_r(⟨e_q, e_r⟩ / τ) · a_r,

with e the L2-normalised mean-pooled last hidden state of the prompt under the current
policy (τ = .1). A step samples its prompts without replacement from ``pool_factor`` × n fresh
candidates with probability ∝ â(1 − â) + .01.

Departures from the paper:
- R is the |R| = 64 prompts most recently rolled out in training, with the pass rates of
  those rollouts, not a separately rolled-out reference set: no extra generation.
- Before any prompt was rolled out (the first step) the candidates are taken in stream order.
- Rollout replay (the paper's other half) is a replay-stage method and not part of this.

Compute: the embeddings are a full forward of the policy over 4B candidates and up to 64
references every step. Their prompt tokens (``control/embed_tokens``) are added to the step's
token count (``forward_tokens``), the count ``train.max_generated_tokens`` stops a run at, so
an equal-token comparison charges them like sampled tokens (one forward per token; padding
not counted).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from pydantic import Field

from rollwise.config import StrictModel
from rollwise.control.base import Controller, PromptCursor
from rollwise.control.stats import PromptStats
from rollwise.types import Prompt


class DifficultyConfig(StrictModel):
    reference_size: int = Field(64, ge=1, description="|R|: recently rolled-out prompts whose pass rates are known")
    temperature: float = Field(0.1, gt=0, description="tau of the attention over the reference set")
    pool_factor: int = Field(4, ge=1, description="fresh candidates per selected prompt")
    floor: float = Field(0.01, ge=0, description="added to a(1-a) so every candidate can be drawn")


def estimate_difficulty(e_q: np.ndarray, e_r: np.ndarray, a_r: np.ndarray, temperature: float) -> np.ndarray:
    """â [Q] for candidates e_q [Q, d] from references e_r [R, d] with pass rates a_r [R]."""
    logits = e_q @ e_r.T / temperature  # [Q, R]
    logits -= logits.max(axis=1, keepdims=True)
    w = np.exp(logits)
    w /= w.sum(axis=1, keepdims=True)
    return w @ a_r


@torch.no_grad()
def prompt_embeddings(model, prompts: list[Prompt], pad_token_id: int) -> np.ndarray:
    """[N, d]: each prompt's mean-pooled last hidden state under ``model``, L2-normalised."""
    width = max(len(p.token_ids) for p in prompts)
    device = next(model.parameters()).device
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):  # right padding: mean over the real tokens only
        ids[i, : len(p.token_ids)] = torch.tensor(p.token_ids)
        mask[i, : len(p.token_ids)] = 1
    out = model(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True)
    hidden = out.hidden_states[-1].float()  # [N, T, d]
    m = mask.to(device).unsqueeze(-1).float()
    pooled = (hidden * m).sum(1) / m.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()


class PolicyEmbedder:
    """``DifficultySelect``'s ``embed``: prompts -> [N, d] normalised embeddings under the policy
    that samples. ``policy()`` is asked at every use (async mode: the producer's own copy, the
    version that samples the step)."""

    def __init__(self, policy: Callable[[], torch.nn.Module], pad_token_id: int) -> None:
        self.policy, self.pad_token_id = policy, pad_token_id

    def __call__(self, prompts: list[Prompt]) -> np.ndarray:
        return prompt_embeddings(self.policy(), prompts, self.pad_token_id)


class DifficultySelect(Controller):
    name = "difficulty_select"

    def __init__(self, cfg: DifficultyConfig, embed=None, **kw) -> None:
        super().__init__(**kw)
        self.cfg = cfg
        self.embed = embed  # prompts -> [N, d] normalised embeddings (the trainer passes a PolicyEmbedder)
        self.reference: list[str] = []  # ids of the recently rolled-out prompts, newest last
        self._last: dict[str, float] = {}
        self._embedded = 0  # prompt tokens embedded since forward_tokens() was last read

    def select_prompts(self, source: PromptCursor, stats: PromptStats, n: int) -> list[Prompt]:
        start = source.cursor
        self._last = {"control/embed_tokens": 0.0}
        candidates = source.fresh(n * self.cfg.pool_factor)
        refs = [pid for pid in self.reference if stats.get(pid).attempts > 0][-self.cfg.reference_size:]
        if not refs or self.embed is None:
            pick = list(range(min(n, len(candidates))))
        else:
            ref_prompts = [source.revisit(stats.get(pid).index) for pid in refs]
            emb = self.embed(candidates + ref_prompts)
            embedded = sum(len(p.token_ids) for p in candidates + ref_prompts)
            self._embedded += embedded
            a_r = np.array([stats.get(pid).successes / stats.get(pid).attempts for pid in refs])
            a_hat = estimate_difficulty(emb[: len(candidates)], emb[len(candidates):], a_r, self.cfg.temperature)
            weights = a_hat * (1 - a_hat) + self.cfg.floor
            pick = sorted(self.rng().choice(len(candidates), size=min(n, len(candidates)), replace=False,
                                            p=weights / weights.sum()).tolist())
            self._last = {"control/estimated_pass_rate": float(a_hat[pick].mean()),
                          "control/candidates_pass_rate": float(a_hat.mean()), "control/embed_tokens": float(embedded)}
        for i in pick:
            stats.register(candidates[i].id, start + i)
        return [candidates[i] for i in pick]

    def observe_step(self, groups, stats: PromptStats) -> None:
        ids = [g.prompt.id for g in groups]
        self.reference = [pid for pid in self.reference if pid not in set(ids)] + ids
        self.reference = self.reference[-self.cfg.reference_size:]

    def metrics(self) -> dict[str, float]:
        return self._last

    def forward_tokens(self) -> int:
        taken, self._embedded = self._embedded, 0
        return taken

    def state_dict(self) -> dict:
        return {"reference": list(self.reference)}

    def load_state_dict(self, state: dict) -> None:
        self.reference = list(state.get("reference", []))
