"""brorl (BroRL; METHODS.md): large-N exploration — N rollouts per prompt, group statistics over all N,
the loss in chunks by gradient accumulation. Test: the gradient at chunk size 16 equals the one at N."""

import random

import pytest
import torch

from rollwise.optim.batch import build_batch
from rollwise.optim.objective import ObjectiveConfig, assign_advantages
from rollwise.optim.update import UpdateSpec, policy_update
from rollwise.train.config import load_run_config
from rollwise.types import Prompt, Rollout, RolloutGroup

N = 48


class Recorder:
    """An optimizer that keeps the accumulated gradient instead of stepping."""

    def __init__(self, model):
        self.params, self.grads = [p for p in model.parameters() if p.requires_grad], None

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    def step(self):
        self.grads = [p.grad.detach().clone() for p in self.params]


def group(vocab: int) -> list[RolloutGroup]:
    rng = random.Random(0)
    prompt = Prompt(id="p", text="x", token_ids=[rng.randrange(3, vocab) for _ in range(5)])
    rollouts = []
    for i in range(N):
        n = rng.randrange(2, 9)  # unequal lengths: token weights must be the whole batch's
        ids = [rng.randrange(3, vocab) for _ in range(n)]
        r = Rollout(prompt_id="p", prompt_ids=prompt.token_ids, completion_ids=ids,
                    behavior_logprobs=[-1.0] * n, versions=[0] * n, finish_reason="stop")
        r.reward = float(rng.random() < 0.3)
        rollouts.append(r)
    return [RolloutGroup(prompt, rollouts)]


def gradient(model, groups, chunk: int, objective: ObjectiveConfig):
    opt = Recorder(model)
    spec = UpdateSpec(objective=objective, micro_batch_size=chunk, max_grad_norm=1e9, max_len=8)
    policy_update(model, opt, build_batch(groups, 0), spec)
    return opt.grads


@pytest.mark.parametrize("method", ["grpo", "dr_grpo"])  # token_mean and seq_mean_token_sum_norm aggregations too
def test_chunk_16_and_n_give_the_same_gradient(tiny, method):
    model, _ = tiny
    objective = load_run_config(None, [f"objective.method={method}"]).objective
    groups = group(model.config.vocab_size)
    assign_advantages(groups, objective)  # group statistics over all N
    whole, chunked = gradient(model, groups, N, objective), gradient(model, groups, 16, objective)
    assert any(g.abs().sum() > 0 for g in whole)
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_one_config_line_fills_large_n_few_prompts_and_chunks():
    cfg = load_run_config(None, ["rollout.strategy=brorl"])
    assert (cfg.rollout.num_generations, cfg.rollout.prompts_per_step, cfg.optim.micro_batch_size) == (128, 2, 16)
    assert cfg.rollout.max_batch_size == 128  # generation in chunks of at most 128 sequences
    mine = load_run_config(None, ["rollout.strategy=brorl", "rollout.num_generations=256"])
    assert mine.rollout.num_generations == 256  # what the recipe sets wins
    base = load_run_config(None, [])
    assert base.rollout.num_generations != 128  # differs from the GRPO baseline's rollout shape


def test_the_check_can_fail(tiny):
    """Statistics per chunk of 16 instead of over all N move the gradient: the test above would see it."""
    model, _ = tiny
    objective = load_run_config(None, []).objective
    groups = group(model.config.vocab_size)
    assign_advantages(groups, objective)
    whole = gradient(model, groups, N, objective)
    chunks = [RolloutGroup(groups[0].prompt, groups[0].rollouts[i:i + 16]) for i in range(0, N, 16)]
    assign_advantages(chunks, objective)
    per_chunk = gradient(model, chunks, 16, objective)
    assert any(not torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(whole, per_chunk))


def test_a_brorl_run_trains_its_n_per_prompt(tmp_path):
    from rollwise.train.loop import Trainer

    sets = [f"output_dir={tmp_path}", "name=brorl", "task.max_digits=1", "task.eval_size=2", "model.threads=1",
            "train.eval_samples=0", "train.steps=1", "train.checkpoint_every=0", "rollout.strategy=brorl",
            "rollout.num_generations=32", "rollout.prompts_per_step=1", "rollout.max_new_tokens=6"]
    steps = []
    with Trainer(load_run_config(None, sets)) as t:
        t.prepare()
        t.fit(on_step=lambda step, m: steps.append(dict(m)))
        assert t.cfg.optim.micro_batch_size == 16
    assert steps[0]["rollouts/trained"] == 32  # one group of N
