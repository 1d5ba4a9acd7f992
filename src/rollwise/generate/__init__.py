"""Generate: the shape of the rollouts (how many, from where they branch)."""

STRATEGIES = {
    "group": "independent samples, rollout.num_generations per prompt (GRPO's rollout)",
}
