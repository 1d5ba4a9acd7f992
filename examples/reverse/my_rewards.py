"""Reward functions for examples/reverse, written for TRL's GRPOTrainer and used by rollwise unchanged.

TRL's calling convention: ``fn(prompts, completions, completion_ids, **columns) -> list[float | None]``;
every other column of the dataset row arrives as a keyword argument (here ``target``).
No rollwise import: this file is found beside the recipe (``rewards: - name: my_rewards:...``).
"""


def reversed_correctly(prompts, completions, target, **kwargs):
    """1.0 when the completion is exactly the reversed word, else 0.0. Listed first in the recipe's
    ``rewards:``, it is also the eval judge (accuracy, pass@k, maj@k, summary.json)."""
    return [1.0 if completion.strip() == answer else 0.0 for completion, answer in zip(completions, target)]


def format_reward(prompts, completions, **kwargs):
    """1.0 for a single word of letters, else 0.0: a shaping term, weighted low in the recipe."""
    return [1.0 if completion.strip().isalpha() else 0.0 for completion in completions]
