"""Sampling settings and the per-row sampler (temperature, top-k, top-p, per-request seed)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples. ``temperature == 0`` means greedy (its log-probs are 0:
    under the distribution actually used, the argmax has probability 1)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    top_candidates: int = 0  # keep the k most likely tokens of the latest position (branching strategies)
    keep_hidden: bool = False  # keep the final hidden state behind the latest token (slot engine; quality probes)
    keep_cache: bool = False  # the Completion carries its cached keys/values, to continue it (slot engine; multi-turn)

    @property
    def is_plain(self) -> bool:
        """Temperature 1, no top-k/top-p: the sampling distribution is the model's softmax."""
        return self.temperature == 1.0 and self.top_k == 0 and self.top_p == 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.top_candidates < 0:
            raise ValueError(f"top_candidates must be >= 0, got {self.top_candidates}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


def filter_mask(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[..., V] bool: the tokens top-k [...] (0 = all) and the top-p [...] nucleus drop from the
    temperature-scaled logits ``scaled`` [..., V]. Shared by the sampler and the trainer
    (``rollwise.model.logprobs``) so both see one distribution."""
    with torch.no_grad():
        vocab = scaled.shape[-1]
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        rank = torch.arange(vocab, device=scaled.device).expand_as(sorted_logits)
        k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
        drop = rank >= k[..., None]
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(-1)
        # keep a token while the mass strictly before it is below top_p (the first token always stays)
        drop |= (probs.cumsum(-1) - probs) >= top_p[..., None]
        return torch.zeros_like(drop).scatter(-1, order, drop)


def filtered_logprobs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor):
    """Log-probs of the sampling distribution per row: logits [B, V] / temperature [B],
    restricted to the top_k [B] (0 = all) tokens and the top-p [B] nucleus."""
    scaled = logits / temperature[:, None]
    return scaled.masked_fill(filter_mask(scaled, top_k, top_p), float("-inf")).log_softmax(-1)


def sample_next(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]):
    """Sample one token per row; return (token_ids [B], logprobs [B]) under the distribution used."""
    rows = logits.shape[0]
    dev = logits.device
    greedy = torch.tensor([p.temperature == 0 for p in params], device=dev)
    temperature = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=dev)
    top_k = torch.tensor([p.top_k for p in params], device=dev)
    top_p = torch.tensor([p.top_p for p in params], device=dev)
    if all(p.is_plain for p in params):
        logprobs = logits.log_softmax(-1)  # the common case, without sorting the vocabulary
    else:
        logprobs = filtered_logprobs(logits, temperature, top_k, top_p)
    # Gumbel-max with each request's own generator: argmax(logp + G) ~ Categorical(exp(logp)).
    uniform = torch.stack([torch.rand(logits.shape[-1], generator=g, device=dev) for g in generators])
    tokens, chosen = gumbel_pick(logits, logprobs, greedy, uniform)
    assert tokens.shape == (rows,)
    return tokens, chosen


def gumbel_pick(logits: torch.Tensor, logprobs: torch.Tensor, greedy: torch.Tensor, uniform: torch.Tensor):
    """Gumbel-max: ``argmax(logprobs + G)`` with ``G = -log(-log(uniform))`` is a draw from
    ``exp(logprobs)`` (rows [B, V]); greedy rows [B] take ``argmax(logits)`` and report log-prob 0.
    ``uniform`` [B, V] holds each row's draws from its own generator (it is overwritten).
    Returns (token_ids [B], logprobs of the chosen tokens [B])."""
    # the parentheses matter: `-x.clamp_()` clamps before negating, which made every G NaN
    gumbel = -torch.log((-torch.log(uniform.clamp_(1e-20, 1.0))).clamp_(min=1e-20))
    sampled = (logprobs + gumbel).argmax(-1)
    tokens = torch.where(greedy, logits.argmax(-1), sampled)
    chosen = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    chosen = torch.where(greedy, torch.zeros_like(chosen), chosen)
    return tokens, chosen
