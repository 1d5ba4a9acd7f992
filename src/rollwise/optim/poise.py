"""``poise``: "POISE: Policy Optimization with Internal State Value Estimation" (2025).

A small probe, trained online, predicts a rollout's expected reward from the policy's own hidden
states and token-entropy statistics; it replaces the group mean as the advantage baseline. The
baseline of a rollout comes from *other* rollouts' states (cross-rollout), so it does not depend
on the rollout it baselines and the policy gradient stays unbiased:

- G ≥ 2: b_i = mean over j ≠ i of V(y_j) (the paper's G = 2: b_1 = V(y_2), b_2 = V(y_1));
- G = 1: b = V_x(x), a second probe on the prompt's states alone (one rollout per prompt is enough);
- A_i = r_i − b_i, no std scaling (``objective.method: poise``).

Features of a rollout (one no-grad forward of the policy over prompt + completion, before the
update): the final hidden state mean-pooled over the completion, the last token's, and the mean,
std and max of the completion's next-token entropies; the prompt probe reads the prompt's pooled
and last hidden states. Probe: an MLP (one tanh layer of ``objective.poise_hidden``) trained
with BCE on rewards clipped to [0, 1] over a buffer of recent rollouts (``poise_buffer``),
refit after each step's baselines are taken, so a batch's baselines never saw its rewards. The
probe's weights are part of a checkpoint.

Where we depart from the paper: the probe starts untrained (V = .5 for every rollout until the
first refit, an unbiased constant baseline); it is refit for ``poise_steps`` full-batch Adam
steps per training step rather than with its own optimizer schedule; features come from one extra
forward after sampling, not from the engine's own hidden states. Its benefit — a lower-variance
baseline than a group mean of G samples, at G = 1 or 2 — needs a model whose hidden states
predict success (the paper's Qwen3-4B) and a bigger model/GPU to show; on a tiny model the probe
is near chance.
"""

from __future__ import annotations

import torch

from rollwise.types import RolloutGroup

ROWS_PER_FORWARD = 16  # rollouts per feature forward (bounds the [B, T, vocab] logits held at once)


def cross_baselines(values: torch.Tensor, group_ids: torch.Tensor, prompt_values: torch.Tensor) -> torch.Tensor:
    """b [N]: each rollout's baseline from the other rollouts of its group (the mean of their
    ``values``), or ``prompt_values`` for a group of one.

    >>> cross_baselines(torch.tensor([.2, .6, .1, .9, .5]), torch.tensor([0, 0, 1, 1, 2]), torch.full((5,), .4))
    tensor([0.6000, 0.2000, 0.9000, 0.1000, 0.4000])
    """
    out = prompt_values.clone().to(values.dtype)
    for g in group_ids.unique():
        idx = (group_ids == g).nonzero().flatten()
        if len(idx) > 1:
            total = values[idx].sum()
            out[idx] = (total - values[idx]) / (len(idx) - 1)
    return out


def poise_advantages(rewards: torch.Tensor, baselines: torch.Tensor) -> torch.Tensor:
    """A = r − b (no std scaling).

    >>> poise_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0.25, 0.75]))
    tensor([ 0.7500, -0.7500])
    """
    return rewards - baselines


def entropy_stats(entropy: torch.Tensor) -> torch.Tensor:
    """[3]: mean, std (population) and max of a completion's next-token entropies (zeros if empty)."""
    if entropy.numel() == 0:
        return torch.zeros(3)
    return torch.stack([entropy.mean(), entropy.std(unbiased=False), entropy.max()])


@torch.no_grad()
def rollout_features(model, rows: list[tuple[list[int], list[int]]], pad_token_id: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [N, 2D + 3], prompt features [N, 2D]) of ``rows`` (prompt ids, completion ids)."""
    feats, prompt_feats = [], []
    device = next(model.parameters()).device
    for start in range(0, len(rows), ROWS_PER_FORWARD):
        chunk = rows[start : start + ROWS_PER_FORWARD]
        width = max(len(p) + len(c) for p, c in chunk)
        ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, (p, c) in enumerate(chunk):  # right padding
            ids[i, : len(p) + len(c)] = torch.tensor(p + c)
            mask[i, : len(p) + len(c)] = 1
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True)
        hidden = out.hidden_states[-1].float().cpu()  # [B, T, D]
        logp = torch.log_softmax(out.logits.float(), -1)
        entropy = -(logp.exp() * logp).sum(-1).cpu()  # [B, T]: entropy of the next-token distribution at t
        for i, (p, c) in enumerate(chunk):
            n_p, n_c = len(p), len(c)
            prompt_part = torch.cat([hidden[i, :n_p].mean(0), hidden[i, n_p - 1]])
            done = hidden[i, n_p : n_p + n_c] if n_c else hidden[i, n_p - 1 : n_p]
            ent = entropy[i, n_p - 1 : n_p + n_c - 1]  # the distributions each completion token was drawn from
            feats.append(torch.cat([done.mean(0), hidden[i, n_p + n_c - 1], entropy_stats(ent)]))
            prompt_feats.append(prompt_part)
    return torch.stack(feats), torch.stack(prompt_feats)


class Probe:
    """An MLP value probe, V(f) = σ(w₂ᵀ tanh(W₁ (f − μ)/s) + b₂), fit with BCE on a buffer."""

    def __init__(self, hidden: int, buffer: int, steps: int, lr: float, seed: int = 0) -> None:
        self.hidden, self.buffer, self.steps, self.lr, self.seed = hidden, buffer, steps, lr, seed
        self.x: torch.Tensor | None = None  # [N, F] buffer of features
        self.y: torch.Tensor | None = None  # [N] targets in [0, 1]
        self.params: dict[str, torch.Tensor] | None = None  # None: untrained, V = .5

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        if self.params is None:
            return torch.full((len(x),), 0.5)
        p = self.params
        return torch.sigmoid(self._logits(x, p))

    @staticmethod
    def _logits(x: torch.Tensor, p: dict) -> torch.Tensor:
        return torch.tanh(((x - p["mu"]) / p["s"]) @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x = x if self.x is None else torch.cat([self.x, x])[-self.buffer:]
        self.y = y if self.y is None else torch.cat([self.y, y])[-self.buffer:]

    def fit(self) -> float:
        """Refit on the buffer (fresh init, fixed by ``seed`` and the buffer size); returns the final BCE."""
        x, y = self.x, self.y
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + len(y))
        mu, s = x.mean(0), x.std(0, unbiased=False) + 1e-4
        p = {"w1": (torch.randn(x.shape[1], self.hidden, generator=gen) / x.shape[1] ** 0.5).requires_grad_(),
             "b1": torch.zeros(self.hidden, requires_grad=True),
             "w2": torch.zeros(self.hidden, requires_grad=True), "b2": torch.zeros((), requires_grad=True)}
        opt = torch.optim.Adam(list(p.values()), lr=self.lr)
        for _ in range(self.steps):
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(self._logits(x, {**p, "mu": mu, "s": s}), y)
            loss.backward()
            opt.step()
        self.params = {**{k: v.detach() for k, v in p.items()}, "mu": mu, "s": s}
        return float(loss.detach())

    def state_dict(self) -> dict:
        return {"x": self.x, "y": self.y, "params": self.params}

    def load_state_dict(self, state: dict) -> None:
        self.x, self.y, self.params = state.get("x"), state.get("y"), state.get("params")


class ValueBaseline:
    """The trainer's POISE state: the rollout probe and the prompt probe. ``assign(groups, model)``
    sets every rollout's ``value_baseline`` (cross-rollout), then refits the probes on the batch."""

    def __init__(self, hidden: int, buffer: int, steps: int, lr: float, pad_token_id: int, seed: int = 0) -> None:
        self.rollouts = Probe(hidden, buffer, steps, lr, seed)
        self.prompts = Probe(hidden, buffer, steps, lr, seed + 1)
        self.pad_token_id = pad_token_id

    def assign(self, groups: list[RolloutGroup], model) -> dict[str, float]:
        rollouts = [r for g in groups for r in g.rollouts]
        if not rollouts:
            return {}
        rows = [(list(r.prompt_ids), list(r.completion_ids)) for r in rollouts]
        feats, prompt_feats = rollout_features(model, rows, self.pad_token_id)
        group_ids = torch.tensor([gi for gi, g in enumerate(groups) for _ in g.rollouts])
        values, prompt_values = self.rollouts.predict(feats), self.prompts.predict(prompt_feats)
        baselines = cross_baselines(values, group_ids, prompt_values)
        for r, b in zip(rollouts, baselines.tolist()):
            r.value_baseline = b
        rewards = torch.tensor([min(max(r.reward, 0.0), 1.0) for r in rollouts], dtype=torch.float32)
        live = torch.tensor([r.failure is None for r in rollouts])
        err = float((values - rewards)[live].abs().mean()) if live.any() else 0.0  # before the refit: held out
        self.rollouts.add(feats[live], rewards[live])
        self.prompts.add(prompt_feats[live], rewards[live])
        loss = self.rollouts.fit() if live.any() else 0.0
        if live.any():
            self.prompts.fit()
        return {"poise/value_abs_error": err, "poise/baseline_mean": float(baselines.mean()),
                "poise/probe_bce": loss, "poise/forward_tokens": float(sum(len(p) + len(c) for p, c in rows))}

    def state_dict(self) -> dict:
        return {"rollouts": self.rollouts.state_dict(), "prompts": self.prompts.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.rollouts.load_state_dict(state["rollouts"])
            self.prompts.load_state_dict(state["prompts"])


def build_value_baseline(cfg, pad_token_id: int, seed: int = 0) -> ValueBaseline | None:
    """The POISE value probe when ``cfg`` (an ``ObjectiveConfig``) uses the ``poise`` estimator, else None."""
    if cfg.advantage != "poise":
        return None
    return ValueBaseline(cfg.poise_hidden, cfg.poise_buffer, cfg.poise_steps, cfg.poise_lr, pad_token_id, seed)
