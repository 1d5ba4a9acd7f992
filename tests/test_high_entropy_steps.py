"""high_entropy_steps' step half (DART; METHODS.md): the loss only at the top-q entropy steps — an
episode's turns, a rollout without turns one step — step entropy = the mean −log μ of its tokens."""

from pathlib import Path

import pytest

from rollwise.optim.batch import build_batch
from rollwise.optim.entropy_steps import keep_high_entropy_steps, step_entropies
from rollwise.types import Prompt, Rollout, RolloutGroup, Turn


def roll(lps, turns=None, weights=None):
    n = len(lps)
    return Rollout(prompt_id="p", prompt_ids=[1], completion_ids=list(range(2, 2 + n)), behavior_logprobs=lps,
                   versions=[0] * n, finish_reason="stop", turns=turns, loss_weights=weights, advantage=[1.0] * n)


def kept(groups):
    return [[w for w in (r.loss_weights or [1.0] * len(r.completion_ids))] for g in groups for r in g.rollouts]


def test_ten_distinct_step_entropies():
    p = Prompt(id="p", text="x", token_ids=[1])
    groups = [RolloutGroup(p, [roll([-float(i)]) for i in range(1, 11)])]  # entropies 1..10, one step each
    out, m = keep_high_entropy_steps(groups, 0.2)
    assert kept(out) == [[0.0]] * 8 + [[1.0]] * 2  # exactly 2 kept: the two highest (9, 10)
    assert m["entropy_steps/kept"] == pytest.approx(0.2)
    out, _ = keep_high_entropy_steps(groups, 0.5)
    assert sum(w[0] for w in kept(out)) == 5
    assert kept(groups) == [[1.0]] * 10  # the input rollouts are not changed (replay keeps them)


def test_an_episode_keeps_its_high_entropy_turn_only():
    # turn 1 = tokens 0-1 (mean −log μ = .5), tool ids 2-3 (weight 0), turn 2 = tokens 4-5 (mean 2.0)
    r = roll([-0.5, -0.5, 0.0, 0.0, -1.0, -3.0], turns=[Turn(0, 2), Turn(4, 6)], weights=[1, 1, 0, 0, 1, 2])
    assert step_entropies(r) == [(0, 2, 0.5), (4, 6, 2.0)]
    out, _ = keep_high_entropy_steps([RolloutGroup(Prompt(id="p", text="x", token_ids=[1]), [r])], 0.5)
    assert kept(out) == [[0, 0, 0, 0, 1, 2]]  # turn 1 dropped; inserted ids and turn 2's weights as they were


def test_it_differs_from_grpo_on_a_small_batch():
    p = Prompt(id="p", text="x", token_ids=[1])
    groups = [RolloutGroup(p, [roll([-0.1, -0.2]), roll([-2.0, -1.0])])]
    plain = build_batch(groups, 0).loss_weights
    masked = build_batch(keep_high_entropy_steps(groups, 0.5)[0], 0).loss_weights
    assert plain.sum() == 4 and masked.sum() == 2 and masked[1].sum() == 2  # the confident rollout is dropped


def test_one_config_line_turns_it_on(tmp_path):
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    sets = [f"output_dir={tmp_path}", "name=hes", "task.max_digits=1", "task.eval_size=2", "model.threads=1",
            "train.eval_samples=0", "train.steps=1", "train.checkpoint_every=0", "rollout.prompts_per_step=2",
            "rollout.num_generations=4", "rollout.max_new_tokens=8", "objective.top_entropy_step_quantile=0.5"]
    steps = []
    with Trainer(load_run_config(None, sets)) as t:
        t.prepare()
        t.fit(on_step=lambda step, m: steps.append(dict(m)))
    assert steps[0]["entropy_steps/kept"] == pytest.approx(0.5, abs=0.13)  # 8 rollouts, half kept (ties aside)


def test_episodes_of_an_environment_run(tmp_path):
    """A calculator episode run (recipes/tiny_calculator.yaml, untrained): its steps are turns."""
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    sets = [f"output_dir={tmp_path}", "name=hes_ep", "sft.steps=0", "train.steps=1", "train.eval_size=2",
            "train.max_generated_tokens=null", "rollout.prompts_per_step=2", "rollout.num_generations=4",
            "rollout.max_new_tokens=12", "objective.top_entropy_step_quantile=0.5"]
    steps = []
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "tiny_calculator.yaml"
    with Trainer(load_run_config(str(recipe), sets)) as t:
        t.prepare()
        t.fit(on_step=lambda step, m: steps.append(dict(m)))
        assert t.episodic
    assert 0.0 < steps[0]["entropy_steps/kept"] <= 0.75  # about half of the episodes' turns
