"""``masa``: "Meta-Awareness Enhances Reasoning Models: Self-Alignment Reinforcement Learning" (MASA, 2025).

The policy predicts meta-statistics of its own rollouts — its pass rate p̂ on a prompt and the
length L̂ of a correct answer — and MASA uses them for efficiency: once the predictions are
calibrated, prompts predicted to be all-wrong or all-right (p̂ < .05 or > .95: no signal) are
skipped, and rollouts running past 2·L̂ tokens (unlikely to be correct) are cut off. On the
controller hooks (``control/base.py``):

- ``select_prompts``: the policy's p̂ and L̂ for the candidates; uncalibrated, the next n prompts
  as without control (their predictions only measured); calibrated, ``pool_factor``·n fresh
  candidates, those with p̂ in [``skip_low``, ``skip_high``] first (stream order), topped up with
  the skipped ones nearest .5 only when too few remain (``masa/skipped`` counts the rest);
- ``should_continue``: every ``check_every`` tokens, a rollout past ``cutoff``·L̂ tokens stops
  (calibrated only; a prompt's last rollout is never stopped);
- ``observe_step``: the meta reward 1 − |p̂ − p| per trained group, p its pass rate; the
  predictions count as calibrated once the mean meta reward over the last ``window`` groups is at
  least ``calibrated`` (with at least ``min_examples`` of them);
- ``forward_tokens``: the meta forwards are charged to the step's token count.

Self-alignment (``align_coef``, ``alignment_loss``): the update trains the predictions with the
policy loss. A meta prediction is one digit d; its meta reward is 1 − |d/10 + .05 − p| against the
group's pass rate p, and 1 − min(1, |unit·(d + .5) − L| / L) against the mean length L of its
correct rollouts (when any was correct). The term ascends the expected meta reward Σ_d π(d)·r(d)
of the policy's digit distribution π after each trained prompt's meta question, exactly over the
ten digits: the gradient a GRPO estimate from sampled meta-generations would approximate, without
its sampling noise (``masa/align_loss``: minus that mean expected reward). Its forwards are the
update's, not generation: they are not charged to the token budget. The trainer adds the term
to the update's optimizer (``optim/auxiliary.py``).

The prediction (``MetaReadout``) is the policy's own: one forward over the prompt followed by a
meta question (``P_QUESTION``, ``L_QUESTION``), read as the expectation of its next-token
distribution over the digits 0–9 (p̂ = E[d]/10 + .05, L̂ = ``length_unit``·(E[d] + .5)).

Where we depart from the paper: the meta-prediction is one digit per statistic read from the
policy's next-token distribution (its expectation), not a sampled free-text meta-generation, and
the self-alignment reward is ascended exactly in expectation rather than by GRPO on sampled
meta-generations; the term's weight, ``align_coef`` .1 of the policy loss, is our choice (the
paper mixes meta-generations into the GRPO batch). The length reward's form is ours. A model
that cannot learn to predict its pass rate never calibrates and masa is then the baseline plus
the meta forwards and the term: its effect needs a bigger model/GPU (the paper trains
Qwen3-8B-scale models).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from pydantic import Field

from rollwise.config import StrictModel
from rollwise.control.base import Controller, PromptCursor
from rollwise.control.stats import PromptStats
from rollwise.types import Prompt, RolloutGroup

P_QUESTION = "\nChance I answer this correctly, in tenths (0-9):"
L_QUESTION = "\nTokens in my correct answer, in tens (0-9):"


class MasaConfig(StrictModel):
    skip_low: float = Field(0.05, ge=0, le=1, description="skip a prompt predicted below this pass rate (calibrated)")
    skip_high: float = Field(0.95, ge=0, le=1, description="skip a prompt predicted above this pass rate (calibrated)")
    cutoff: float = Field(2.0, gt=0, description="stop a rollout past cutoff x the predicted correct length L̂")
    check_every: int = Field(8, ge=1, description="tokens between cut-off checks of a rollout")
    pool_factor: int = Field(2, ge=1, description="fresh candidates per selected prompt once calibrated")
    calibrated: float = Field(0.8, ge=0, le=1, description="mean meta reward 1 - |p̂ - p| from which the "
                              "predictions count as calibrated")
    window: int = Field(64, ge=1, description="recent groups the calibration is measured over")
    min_examples: int = Field(16, ge=1, description="groups measured before the predictions can count as calibrated")
    length_unit: int = Field(10, ge=1, description="tokens per digit of the length prediction")
    align_coef: float = Field(0.1, ge=0, description="weight of the self-alignment term, the expected meta reward "
                              "of the policy's one-digit meta predictions, trained with the policy loss (0: the "
                              "predictions are measured, not trained)")


def meta_reward(p_hat: float, p: float) -> float:
    """MASA's meta reward for a pass-rate prediction: 1 − |p̂ − p|.

    >>> meta_reward(0.25, 0.25), meta_reward(0.0, 1.0), meta_reward(0.75, 0.5)
    (1.0, 0.0, 0.75)
    """
    return 1.0 - abs(p_hat - p)


def keeps(p_hat: float, low: float = 0.05, high: float = 0.95) -> bool:
    """Whether a calibrated prediction keeps its prompt: p̂ within [low, high].

    >>> keeps(0.05), keeps(0.5), keeps(0.95), keeps(0.01), keeps(0.99)
    (True, True, True, False, False)
    """
    return low <= p_hat <= high


class MetaReadout:
    """The policy's (p̂, L̂) for prompts: one batched forward of ``policy()`` over each prompt's ids
    followed by ``P_QUESTION`` / ``L_QUESTION`` (right-padded), the digits' expectation read at the
    last position. ``tokens`` counts the ids it ran."""

    def __init__(self, policy: Callable[[], torch.nn.Module], tokenizer, length_unit: int = 10) -> None:
        self.policy, self.tokenizer, self.length_unit = policy, tokenizer, length_unit
        self.tokens = 0
        self._ids: tuple[list[int], list[int], list[int]] | None = None

    def _question_ids(self) -> tuple[list[int], list[int], list[int]]:
        if self._ids is None:
            enc = lambda s: self.tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
            self._ids = (enc(P_QUESTION), enc(L_QUESTION), [enc(str(d))[-1] for d in range(10)])
        return self._ids

    def digit_probs(self, model: torch.nn.Module, prompts: list[Prompt]) -> torch.Tensor:
        """π(d) [2N, 10] of ``model``'s next token after each prompt + ``P_QUESTION`` (rows :N) and
        + ``L_QUESTION`` (rows N:), over the digits 0–9 (differentiable: the self-alignment term's)."""
        p_q, l_q, digits = self._question_ids()
        rows = [list(p.token_ids) + q for q in (p_q, l_q) for p in prompts]
        width = max(map(len, rows))
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
        device = next(model.parameters()).device
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits  # [2N, T, V]
        last = logits[torch.arange(len(rows)), mask.sum(1).to(device) - 1]  # [2N, V]
        self.tokens += int(mask.sum())
        return torch.softmax(last[:, digits].float(), -1)

    @torch.no_grad()
    def __call__(self, prompts: list[Prompt]) -> tuple[list[float], list[float]]:
        e = (self.digit_probs(self.policy(), prompts) @ torch.arange(10, dtype=torch.float32)).tolist()
        n = len(prompts)
        return [d / 10 + 0.05 for d in e[:n]], [self.length_unit * (d + 0.5) for d in e[n:]]


def digit_rewards(p: float, length: float | None, unit: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The meta reward of each digit answer [10]: 1 − |d/10 + .05 − p| for the pass rate; for the length
    of a correct answer (None: no rollout was correct), 1 − min(1, |unit·(d + .5) − L| / L).

    >>> [round(x, 2) for x in digit_rewards(0.25, 20.0, 10)[0][:4].tolist()]
    [0.8, 0.9, 1.0, 0.9]
    >>> [round(x, 2) for x in digit_rewards(0.25, 20.0, 10)[1][:4].tolist()]
    [0.25, 0.75, 0.75, 0.25]
    """
    d = torch.arange(10, dtype=torch.float32)
    rate = 1 - (d / 10 + 0.05 - p).abs()
    return rate, None if length is None else 1 - ((unit * (d + 0.5) - length).abs() / length).clamp(max=1)


def alignment_loss(readout: MetaReadout, model: torch.nn.Module, groups: list[RolloutGroup]) -> torch.Tensor | None:
    """MASA's self-alignment, exactly in expectation: −(mean over the groups' meta predictions of
    Σ_d π(d)·reward(d)), the pass-rate prediction against the group's pass rate and the length one
    against its correct rollouts' mean length (when any was correct). None without a group."""
    groups = [g for g in groups if g.rollouts]
    if not groups:
        return None
    probs = readout.digit_probs(model, [g.prompt for g in groups])
    n, terms = len(groups), []
    for i, g in enumerate(groups):
        correct = [len(r.completion_ids) for r in g.rollouts if r.correct]
        rate, length = digit_rewards(g.pass_rate, sum(correct) / len(correct) if correct else None,
                                     readout.length_unit)
        terms.append(probs[i] @ rate.to(probs.device))
        if length is not None:
            terms.append(probs[n + i] @ length.to(probs.device))
    return -torch.stack(terms).mean()


class Masa(Controller):
    name = "masa"

    def __init__(self, cfg: MasaConfig, predict=None, **kw) -> None:
        super().__init__(**kw)
        self.cfg = cfg
        self.predict = predict  # prompts -> (p̂ list, L̂ list): a MetaReadout (the trainer's), or a test's
        self.continue_every = cfg.check_every
        self.predictions: dict[str, tuple[float, float]] = {}  # prompt id -> (p̂, L̂) of this step's prompts
        self.meta_rewards: list[float] = []  # the last `window` groups' 1 − |p̂ − p|
        self._step = {"skipped": 0.0, "cut": 0.0}

    @property
    def calibrated(self) -> bool:
        recent = self.meta_rewards[-self.cfg.window:]
        return len(recent) >= self.cfg.min_examples and sum(recent) / len(recent) >= self.cfg.calibrated

    def select_prompts(self, source: PromptCursor, stats: PromptStats, n: int) -> list[Prompt]:
        self._step = {"skipped": 0.0, "cut": 0.0}
        start, calibrated = source.cursor, self.calibrated
        if self.predict is None:
            return source.fresh(n)
        candidates = source.fresh(n * self.cfg.pool_factor if calibrated else n)
        p_hat, l_hat = self.predict(candidates)
        self.predictions = {c.id: (p, l) for c, p, l in zip(candidates, p_hat, l_hat)}
        pick = list(range(len(candidates)))
        if calibrated:
            kept = [i for i in pick if keeps(p_hat[i], self.cfg.skip_low, self.cfg.skip_high)]
            rest = sorted((i for i in pick if i not in kept), key=lambda i: (abs(p_hat[i] - 0.5), i))
            pick = sorted(kept[:n] + rest[: max(0, n - len(kept))])
            self._step["skipped"] = float(len(candidates) - len(pick))
        for i in pick:
            stats.register(candidates[i].id, start + i)
        return [candidates[i] for i in pick]

    def should_continue(self, partial, stats: PromptStats) -> bool:
        predicted = self.predictions.get(partial.prompt.id)
        if predicted is None or not self.calibrated:
            return True
        go_on = len(partial.token_ids) < self.cfg.cutoff * predicted[1]
        self._step["cut"] += not go_on
        return go_on

    def observe_step(self, groups: list[RolloutGroup], stats: PromptStats) -> None:
        for g in groups:
            predicted = self.predictions.get(g.prompt.id)
            if predicted is not None and g.rollouts:
                self.meta_rewards.append(meta_reward(predicted[0], g.pass_rate))
        self.meta_rewards = self.meta_rewards[-self.cfg.window:]

    def metrics(self) -> dict[str, float]:
        recent = self.meta_rewards[-self.cfg.window:]
        out = {"masa/calibrated": float(self.calibrated), "masa/skipped": self._step["skipped"],
               "masa/cut": self._step["cut"]}
        if recent:
            out["masa/meta_reward"] = sum(recent) / len(recent)
        if self.predictions:
            out["masa/p_hat_mean"] = sum(p for p, _ in self.predictions.values()) / len(self.predictions)
        return out

    def forward_tokens(self) -> int:
        tokens = getattr(self.predict, "tokens", 0)
        if tokens:
            self.predict.tokens = 0
        return tokens

    def state_dict(self) -> dict:
        return {"meta_rewards": list(self.meta_rewards)}

    def load_state_dict(self, state: dict) -> None:
        self.meta_rewards = list(state.get("meta_rewards", []))
