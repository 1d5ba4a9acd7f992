"""``TrainBatch``: padded tensors built from rollout groups at the last moment.

Sequences are ``prompt + completion``, right-padded. Per-token tensors are aligned with
next-token log-probs: column ``t`` scores ``input_ids[:, t + 1]``, so they are ``[B, T-1]``.

Two per-token tensors say what is trained, and they are kept apart:

- ``completion_mask`` (0/1): the column scores a completion token of this row — every one,
  trained or not. A sequence's length is its row sum.
- ``loss_weights``: how much the token's loss counts. 0 = not trained (a forced token, a
  tree prefix trained in another leaf, MC-GRPO's pivot, a truncated rollout under
  ``mask_truncated_completions``); 1 = an ordinary token; k = a tree node shared by k leaves,
  trained once for all of them. ``trained = loss_weights > 0`` is where losses, ratios and
  their statistics are computed.

Sequences and episodes: a harness episode trains each of its segments as a row of its own,
but it is one sequence of the loss. ``sequence_ids`` names the sequence each row belongs to
(rows of one episode share it) and ``sequence_lengths`` is that sequence's length in sampled
tokens, over all its rows: an episode's turns, never the ids an environment or tool inserted
(loss weight 0, not trained anywhere); a tree leaf keeps its whole length (its shared prefix
is trained in another leaf). Sequence-mean losses divide by these, so an episode counts once
however many segments it has, and inserted ids never dilute a sequence's token mean.

Failed rollouts (``Rollout.failure``: a harness that raised or timed out, an environment that
failed) are rows with loss weight 0 everywhere, segments included, and sequence id −1: they
carry no gradient and do not count as sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rollwise.types import Rollout, RolloutGroup


@dataclass
class TrainBatch:
    input_ids: torch.Tensor  # [B, T] prompt + completion, right-padded
    attention_mask: torch.Tensor  # [B, T]
    completion_mask: torch.Tensor  # [B, T-1] 0/1: column t scores a completion token of the row
    loss_weights: torch.Tensor  # [B, T-1] the token's weight in the loss (0 = not trained, k = k leaves)
    behavior_logprobs: torch.Tensor  # [B, T-1] from the engine, 0 off the completion
    advantages: torch.Tensor  # [B, T-1] per token (sequence advantages broadcast)
    rewards: torch.Tensor  # [B]
    group_ids: torch.Tensor  # [B]
    sequence_ids: torch.Tensor | None = None  # [B] the sequence (episode) of the row; -1 = not counted; None = row
    sequence_lengths: torch.Tensor | None = None  # [B] sampled tokens of the row's sequence; None = the row's own
    old_logprobs: torch.Tensor | None = None  # [B, T-1] old_logit_repair: the sampling version's trainer log-probs

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_sequences(self) -> int:
        """Sequences the batch trains (an episode of several rows once, a failed one not at all)."""
        if self.sequence_ids is None:
            return len(self)
        return int(torch.unique(self.sequence_ids[self.sequence_ids >= 0]).numel())

    @property
    def normaliser_lengths(self) -> torch.Tensor:
        """[B] the length a sequence-mean loss divides each row's tokens by (``sequence_lengths``)."""
        return self.completion_lengths if self.sequence_lengths is None else self.sequence_lengths

    @property
    def completion_lengths(self) -> torch.Tensor:
        """[B] completion tokens per row (untrained ones included)."""
        return self.completion_mask.sum(-1)

    @property
    def trained_mask(self) -> torch.Tensor:
        """[B, T-1] 0/1: the tokens that carry a loss."""
        return (self.loss_weights > 0).to(self.loss_weights.dtype)

    def select(self, rows: slice | torch.Tensor) -> "TrainBatch":
        """A sub-batch (micro-batch) of the given rows, trimmed to its own longest sequence."""
        attn = self.attention_mask[rows]
        width = int(attn.sum(-1).max())
        return TrainBatch(
            input_ids=self.input_ids[rows][:, :width],
            attention_mask=attn[:, :width],
            completion_mask=self.completion_mask[rows][:, : width - 1],
            loss_weights=self.loss_weights[rows][:, : width - 1],
            behavior_logprobs=self.behavior_logprobs[rows][:, : width - 1],
            advantages=self.advantages[rows][:, : width - 1],
            rewards=self.rewards[rows],
            group_ids=self.group_ids[rows],
            sequence_ids=None if self.sequence_ids is None else self.sequence_ids[rows],
            sequence_lengths=None if self.sequence_lengths is None else self.sequence_lengths[rows],
            old_logprobs=None if self.old_logprobs is None else self.old_logprobs[rows][:, : width - 1],
        )

    def to(self, device) -> "TrainBatch":
        return TrainBatch(**{k: None if v is None else v.to(device) for k, v in self.__dict__.items()})


def sampled_tokens(rollout: Rollout) -> int:
    """Completion tokens the policy sampled: an episode's turns (not the ids inserted between
    them), else the whole completion."""
    if rollout.turns is None:
        return len(rollout.completion_ids)
    return sum(t.end - t.start for t in rollout.turns)


def episode_tokens(rollout: Rollout) -> int:
    """Tokens the policy sampled in a rollout's episode: its own and its segments' (``sampled_tokens``)."""
    return sum(sampled_tokens(x) for x in (rollout, *(rollout.segments or ())))


def _rows(groups: list[RolloutGroup]) -> list[tuple[int, int, int, Rollout, bool]]:
    """(group index, sequence id, sequence length, row, trained) for every row: a rollout, then its
    segments (a harness episode's other calls, rows of the same sequence); a failed rollout's rows
    are not trained and have sequence id -1."""
    out, seq = [], 0
    for gi, g in enumerate(groups):
        for r in g.rollouts:
            live = r.failure is None
            length = episode_tokens(r)
            out += [(gi, seq if live else -1, length, x, live) for x in (r, *(r.segments or ()))]
            seq += live
    return out


def build_batch(groups: list[RolloutGroup], pad_token_id: int, mask_truncated: bool = False) -> TrainBatch:
    """Pad the rollouts of ``groups`` into a TrainBatch; ``Rollout.advantage`` must be set.

    ``mask_truncated`` (TRL's ``mask_truncated_completions``) zeroes the completion mask of
    rollouts that hit the length limit, so they carry no gradient; ``Rollout.loss_weights``
    sets single tokens' weights (0: forced tokens, tree prefixes trained in another leaf; k: a
    tree node shared by k leaves); a failed rollout (``Rollout.failure``) gets weight 0 on every
    row of its episode.
    """
    # a harness episode's other segments are rows of their own, with the episode's advantage
    rows = _rows(groups)
    if not rows:
        raise ValueError("build_batch got no rollouts")
    rollouts = [(gi, r) for gi, _, _, r, _ in rows]
    width = max(len(r.prompt_ids) + len(r.completion_ids) for _, r in rollouts)
    n = len(rollouts)
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    completion_mask = torch.zeros((n, width - 1))
    loss_weights = torch.zeros((n, width - 1))
    behavior = torch.zeros((n, width - 1))
    advantages = torch.zeros((n, width - 1))
    for i, (_, _, _, r, live) in enumerate(rows):
        if r.advantage is None or len(r.advantage) != len(r.completion_ids):
            raise ValueError(f"rollout {i} of prompt {r.prompt_id} has no per-token advantage set")
        p, c = len(r.prompt_ids), len(r.completion_ids)
        input_ids[i, : p + c] = torch.tensor(r.prompt_ids + r.completion_ids)
        attention_mask[i, : p + c] = 1
        span = slice(p - 1, p - 1 + c)  # column p-1 scores the first completion token
        keep = live and not (mask_truncated and r.finish_reason == "length")
        completion_mask[i, span] = 1.0
        loss_weights[i, span] = float(keep) * (torch.tensor(r.loss_weights, dtype=torch.float)
                                               if r.loss_weights is not None else 1.0)
        behavior[i, span] = torch.tensor(r.behavior_logprobs)
        advantages[i, span] = torch.tensor(r.advantage)
    old = None
    if all(r.old_logprobs is not None for _, r in rollouts):  # old_logit_repair kept them for every row
        old = torch.zeros((n, width - 1))
        for i, (_, r) in enumerate(rollouts):
            old[i, len(r.prompt_ids) - 1 : len(r.prompt_ids) - 1 + len(r.completion_ids)] = torch.tensor(r.old_logprobs)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        completion_mask=completion_mask,
        loss_weights=loss_weights,
        behavior_logprobs=behavior,
        advantages=advantages,
        rewards=torch.tensor([r.reward for _, r in rollouts]),
        group_ids=torch.tensor([gi for gi, _ in rollouts]),
        sequence_ids=torch.tensor([seq for _, seq, _, _, _ in rows]),
        sequence_lengths=torch.tensor([float(length) for _, _, length, _, _ in rows]),
        old_logprobs=old,
    )
