"""What Generate → Filter → Control hands to Optimize: ``ScoredBatch``, one training step's
scored groups; and ``RoundSampler``, the sampling rounds of one step.

``Trainer.collect`` builds a batch: the controller selects prompts and allocates rollouts, a
``RoundSampler`` runs the first round, ``control/rounds.py`` asks it for the extra rounds a
controller wants (extend, refill), and the batch records the groups, the step's metrics, the
tokens sampled and the data cursor after them. The same code runs in sync mode (on the
trainer's engine), on the async producer thread (on its own engine) and with Ray rollout
workers (on a ``dist.WorkerPool``, which runs the strategy and scoring on the workers).

Seeds (``rollwise.seeds``): a round samples with ``round_seed(step seed, salt)``, its salt
naming the round, so every round of every step draws fixed numbers whichever engine runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rollwise import seeds
from rollwise.filter.overlong import add_overlong_penalty
from rollwise.filter.rewards import score_groups
from rollwise.optim.concise_r import add_length_terms
from rollwise.model.load import encode_prompt
from rollwise.model.logprobs import token_logprobs_and_entropy
from rollwise.train.metrics import Clock
from rollwise.types import Prompt, RolloutGroup


@dataclass
class ScoredBatch:
    """One training step's groups, scored, as collection hands them to the update (async: through
    the producer's queue; checkpoints keep the queued ones in ``pipeline.pt``)."""

    step: int  # the training step they are for
    groups: list[RolloutGroup]
    metrics: dict[str, float]  # the collection's own (strategy, filter, control, time/generate, time/score)
    tokens: int  # tokens the engine sampled for them (+ a controller's own policy forwards)
    cursor: int  # the train stream's data cursor after them


class RoundSampler:
    """The sampling rounds of training step ``step`` on ``engine``. A round generates
    ``budgets[i]`` rollouts of ``prompts[i]`` (prompts with 0 skipped) with the round's seed,
    scores them and records them in the trainer's ``PromptStats``. ``sample`` runs one;
    calling the sampler runs an extra round for ``control/rounds.py`` (its ``run_round``).
    ``tokens`` counts what the engine sampled over every round."""

    def __init__(self, trainer, step: int, engine, clock: Clock) -> None:
        self.trainer, self.step, self.engine, self.clock = trainer, step, engine, clock
        self.seed = trainer.step_seed(step)
        self.tokens = 0

    def sample(self, prompts: list[Prompt], budgets: list[int], salt: int = seeds.FIRST_ROUND, observe: bool = True
               ) -> tuple[list[RolloutGroup], dict[str, float], int]:
        """One round: (groups, metrics, tokens the engine sampled). ``observe=False``: not recorded in
        ``PromptStats`` (guided rollouts, sampled under a hint)."""
        t, engine = self.trainer, self.engine
        kept = [(p, b) for p, b in zip(prompts, budgets) if b > 0]
        prompts, budgets = [p for p, _ in kept], [b for _, b in kept]
        seed = seeds.round_seed(self.seed, salt)
        before = engine.stats.decode_tokens
        remote = getattr(engine, "remote", False)  # dist.WorkerPool: workers run the strategy (and score)
        if remote:
            groups, metrics = engine.generate(prompts, budgets, seed=seed)
        else:
            groups, metrics = t.generator.generate(engine, prompts, budgets, seed=seed)
        sampled = engine.stats.decode_tokens - before  # every token the engine sampled, once
        self.tokens += sampled
        self.clock.lap("generate")
        if not (remote and engine.scores):
            metrics |= self.score(groups)
        else:
            metrics |= self.shape(groups)
        for g in groups if observe else ():
            t.stats.observe(g, self.step)
        self.clock.lap("score")
        return groups, metrics, sampled

    # -- what guided exploration asks (generate/base.py ``Rounds``) -------------------------
    def score(self, groups: list[RolloutGroup]) -> dict[str, float]:
        """The Filter stage on ``groups``: the reward functions, then the shaping terms."""
        t = self.trainer
        metrics = score_groups(groups, t.reward_fns)
        return metrics | self.shape(groups)

    def shape(self, groups: list[RolloutGroup]) -> dict[str, float]:
        """The shaping terms on scored groups (before ``control.accept``): overlong, concise_r."""
        o, metrics = self.trainer.cfg.objective, {}
        if o.overlong_shaping:
            metrics |= add_overlong_penalty(groups, self.trainer.cfg.rollout.max_new_tokens)
        if o.concise_r and self.step >= o.concise_r_start:
            metrics |= add_length_terms(groups, self.trainer.cfg.rollout.max_new_tokens, o.concise_r_weight)
        return metrics

    def encode(self, prompt: Prompt) -> list[int]:
        return encode_prompt(self.trainer.tokenizer, prompt)

    def encode_text(self, text: str) -> list[int]:
        return list(self.trainer.tokenizer(text, add_special_tokens=False)["input_ids"])

    def demonstrate(self, prompt: Prompt) -> str | None:
        """The task's demonstration as one text (a multi-turn one: what the model writes, joined)."""
        demo = self.trainer.task.demonstrate(prompt) if self.trainer.task.demonstrate else None
        if isinstance(demo, list):
            demo = "".join(text for text, model_wrote in demo if model_wrote)
        return demo

    def logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """Teacher-forced log-probs of ``completion_ids`` under the sampling policy and settings."""
        t, r = self.trainer, self.trainer.cfg.rollout
        policy = t.sampling_policy()
        device = next(policy.parameters()).device
        ids = torch.tensor([prompt_ids + completion_ids], device=device)
        with torch.no_grad():
            lp, _ = token_logprobs_and_entropy(policy, ids, torch.ones_like(ids), temperature=r.temperature,
                                               with_entropy=False, top_k=r.top_k, top_p=r.top_p)
        return lp[0, len(prompt_ids) - 1:].float().tolist()

    def __call__(self, prompts: list[Prompt], budgets: list[int], salt: int) -> tuple[list[RolloutGroup], int]:
        """An extra round (``control/rounds.py``'s ``run_round``): (groups, tokens sampled)."""
        groups, _, sampled = self.sample(prompts, budgets, salt)
        return groups, sampled
