"""``difficulty_select``: "Improving Data Efficiency for LLM Reinforcement Fine-tuning Through
Difficulty-targeted Online Data Selection and Rollout Replay" (Sun et al., 2025), the
selection half.

Prefer prompts of moderate difficulty without rolling every candidate out: only a reference
set R has measured pass rates a_r; a candidate's pass rate is estimated by attention over R,

    â_q = Σ_r softmax_r(⟨e_q, e_r⟩ / τ) · a_r,

with e the L2-normalised mean-pooled last hidden state of a question (τ = .1). A step samples
its prompts without replacement from ``pool_factor`` × n fresh candidates with probability
∝ â(1 − â) + .01. Only the a_r move with the policy; the embeddings only say which questions
are alike, so, as in the paper, they come from a fixed model and are computed once:

- ``embeddings: start`` (the default): each question's text (the task's prompt, without the
  chat template) embedded once under the run's starting weights (``StartEmbedder``) when it is
  first a candidate, and kept (``control.pt``: a resumed run neither recomputes nor recharges
  them); a reference was a candidate before, so it costs nothing.
- ``embeddings: policy``: every candidate and reference, chat template included, re-embedded
  under the current policy at every step (``PolicyEmbedder``; rollwise's first version, kept as
  an option). On SmolLM2's 9-token completions that read ~5,000 prompt tokens a step against
  ~550 sampled, ten times the step's generation.

Departures from the paper:
- The embedding model is the run's own starting weights, not a separate small model (the
  paper's code embeds with Qwen2.5-0.5B offline).
- R is the |R| = 64 prompts most recently rolled out in training, with the pass rates of
  those rollouts, not a separately rolled-out reference set: no extra generation.
- The attention is the fixed softmax above; the paper also trains an adapter on top of the
  embeddings (its ``adaptive_difficulty_prediction`` model).
- Before any prompt was rolled out (the first step) the candidates are taken in stream order.
- Rollout replay (the paper's other half) is a replay-stage method and not part of this.

Compute: the embedding forwards' tokens (``control/embed_tokens``; padding not counted) are
added to the step's token count (``forward_tokens``), the count ``train.max_generated_tokens``
stops a run at, so an equal-token comparison charges them like sampled tokens (one forward per
token) — including the one-off embedding the paper does offline.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Literal

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
    embeddings: Literal["start", "policy"] = Field(
        "start", description="start = each question's text embedded once under the run's starting weights and kept "
        "(the paper's fixed embedding model); policy = every candidate and reference re-embedded under the current "
        "policy at every step, chat template included (~10x the tokens on short completions)")


def estimate_difficulty(e_q: np.ndarray, e_r: np.ndarray, a_r: np.ndarray, temperature: float) -> np.ndarray:
    """â [Q] for candidates e_q [Q, d] from references e_r [R, d] with pass rates a_r [R]."""
    logits = e_q @ e_r.T / temperature  # [Q, R]
    logits -= logits.max(axis=1, keepdims=True)
    w = np.exp(logits)
    w /= w.sum(axis=1, keepdims=True)
    return w @ a_r


@torch.no_grad()
def token_embeddings(model, rows: list[list[int]], pad_token_id: int) -> np.ndarray:
    """[N, d]: each row of token ids' mean-pooled last hidden state under ``model``, L2-normalised."""
    width = max(len(r) for r in rows)
    device = next(model.parameters()).device
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):  # right padding: mean over the real tokens only
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    out = model(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True)
    hidden = out.hidden_states[-1].float()  # [N, T, d]
    m = mask.to(device).unsqueeze(-1).float()
    pooled = (hidden * m).sum(1) / m.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()


def prompt_embeddings(model, prompts: list[Prompt], pad_token_id: int) -> np.ndarray:
    """[N, d]: each prompt's (as sampled: chat template included) embedding under ``model``."""
    return token_embeddings(model, [list(p.token_ids) for p in prompts], pad_token_id)


class PolicyEmbedder:
    """``embeddings: policy``: prompts -> [N, d] normalised embeddings under the policy that samples,
    chat template included. ``policy()`` is asked at every use (async mode: the producer's own copy,
    the version that samples the step)."""

    fixed = False  # the policy moves: nothing is kept

    def __init__(self, policy: Callable[[], torch.nn.Module], pad_token_id: int) -> None:
        self.policy, self.pad_token_id = policy, pad_token_id

    def __call__(self, prompts: list[Prompt]) -> np.ndarray:
        return prompt_embeddings(self.policy(), prompts, self.pad_token_id)


class StartEmbedder:
    """``embeddings: start``: each question's text (``Prompt.text``, no chat template) embedded under
    a fixed model, the run's starting weights — ``module()`` lends it for the forward (``with
    module() as m``: a frozen copy, or a LoRA policy with its adapters off) — so an embedding, once
    made, is kept. ``tokens`` counts the ids it ran."""

    fixed = True

    def __init__(self, module: Callable[[], AbstractContextManager[torch.nn.Module]], tokenizer) -> None:
        self.module, self.tokenizer = module, tokenizer
        self.tokens = 0

    def __call__(self, prompts: list[Prompt]) -> np.ndarray:
        rows = [self.tokenizer.encode(p.text, add_special_tokens=False) or [self.tokenizer.eos_token_id]
                for p in prompts]
        self.tokens += sum(map(len, rows))
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        with self.module() as model:
            return token_embeddings(model, rows, pad)


class DifficultySelect(Controller):
    name = "difficulty_select"

    def __init__(self, cfg: DifficultyConfig, embed=None, **kw) -> None:
        super().__init__(**kw)
        self.cfg = cfg
        self.embed = embed  # prompts -> [N, d] normalised embeddings (the trainer's StartEmbedder/PolicyEmbedder)
        self.reference: list[str] = []  # ids of the recently rolled-out prompts, newest last
        self.kept: dict[str, np.ndarray] = {}  # prompt id -> embedding, when the embedder's model is fixed
        self._last: dict[str, float] = {}
        self._embedded = 0  # prompt tokens embedded since forward_tokens() was last read

    def embeddings(self, prompts: list[Prompt]) -> tuple[np.ndarray, int]:
        """[N, d] embeddings of ``prompts`` and the tokens embedded for them now: a fixed embedder's are
        kept, so only prompts never embedded before run (and cost); a moving one's cost every prompt's
        sampled ids, every time."""
        if not getattr(self.embed, "fixed", False):
            return self.embed(prompts), sum(len(p.token_ids) for p in prompts)
        new, before = list({p.id: p for p in prompts if p.id not in self.kept}.values()), self.embed.tokens
        if new:
            for p, e in zip(new, self.embed(new)):
                self.kept[p.id] = e
        return np.stack([self.kept[p.id] for p in prompts]), self.embed.tokens - before

    def select_prompts(self, source: PromptCursor, stats: PromptStats, n: int) -> list[Prompt]:
        start = source.cursor
        self._last = {"control/embed_tokens": 0.0}
        candidates = source.fresh(n * self.cfg.pool_factor)
        refs = [pid for pid in self.reference if stats.get(pid).attempts > 0][-self.cfg.reference_size:]
        if not refs or self.embed is None:
            pick = list(range(min(n, len(candidates))))
        else:
            ref_prompts = [source.revisit(stats.get(pid).index) for pid in refs]
            emb, embedded = self.embeddings(candidates + ref_prompts)
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
        ids = list(self.kept)
        return {"reference": list(self.reference), "kept_ids": ids,
                "kept": torch.from_numpy(np.stack([self.kept[i] for i in ids])) if ids else torch.zeros(0)}

    def load_state_dict(self, state: dict) -> None:
        self.reference = list(state.get("reference", []))
        ids, kept = state.get("kept_ids", []), state.get("kept")
        self.kept = {i: kept[k].numpy() for k, i in enumerate(ids)}
