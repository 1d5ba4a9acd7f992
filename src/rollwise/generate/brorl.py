"""``brorl``: BroRL, "Scaling Reinforcement Learning via Broadened Exploration" (Hu et al., 2025) —
scale the rollouts per prompt N to hundreds instead of adding steps (a mass-balance argument:
sampled tokens always expand the correct mass; the unsampled tokens' effect fades as N grows).

``rollout.strategy: brorl`` is group sampling with BroRL's shape, filled where the recipe leaves the
key unset (``BRORL_FILL``; ``train.config.FILLS``): N = 128 rollouts per prompt
(``rollout.num_generations``; the paper: 128, 256, 512), 2 prompts per step, generation in
chunks of at most 128 sequences (``rollout.max_batch_size``), and the loss in chunks of 16
sequences with gradient accumulation (``optim.micro_batch_size``). Group statistics are over all N
(``optim.objective.assign_advantages`` sees the whole group), and the accumulated gradient is the
whole batch's: per-token loss weights are computed on the batch, not the chunk, so chunk size 16
and N give the same gradient (``tests/test_brorl.py``).

Where we depart: the paper's N and its ProRL-saturated 1.5B model; on the tiny model N = 128
costs as many tokens as 16 steps of 8-rollout groups, and the ledger compares at equal generated
tokens. Reviving a saturated model needs a bigger model and a GPU to show.
"""

from __future__ import annotations

# section -> key -> value, filled where the recipe leaves the key unset
BRORL_FILL = {"rollout": {"num_generations": 128, "prompts_per_step": 2, "max_batch_size": 128},
              "optim": {"micro_batch_size": 16}}


def fill_brorl(data: dict) -> dict:
    """``rollout.strategy=brorl``: BroRL's N, prompts per step and chunks where the recipe sets none."""
    rollout = data.get("rollout")
    if not (isinstance(rollout, dict) and rollout.get("strategy") == "brorl"):
        return data
    for section, fill in BRORL_FILL.items():
        current = data.get(section)
        if current is None or isinstance(current, dict):
            data = {**data, section: {**fill, **{k: v for k, v in (current or {}).items() if v is not None}}}
    return data
