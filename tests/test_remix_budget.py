"""ReMix reincarnates at a fraction of whichever limit stops the run (issue 22, "Method defaults").

Before: the reincarnation step was ⌊reincarnate_at · train.steps⌋, fixed when the trainer was
built, so a run stopped by a token budget (``train.max_generated_tokens``, or
``fit(RunLimits(generated_tokens=...))`` as the benchmarks call it) or by ``max_minutes`` with the
default ``train.steps: 100`` ended long before step 50 and never reincarnated: the whole run
stayed off-policy at UTD 2. Now the loop reports progress — the largest used/limit over the
limits that stop the run — before every step.
"""

import pytest

from rollwise.replay import ReplayConfig, build_replay
from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer
from rollwise.train.state import RunLimits, TrainState


def test_progress_is_the_largest_share_of_any_limit():
    state = TrainState(step=2, generated_tokens=600, wall_seconds=30.0)
    assert RunLimits(steps=10, generated_tokens=1000).progress(state) == pytest.approx(0.6)
    assert RunLimits(steps=3, generated_tokens=1000).progress(state) == pytest.approx(2 / 3)  # steps lead here
    assert RunLimits(steps=10, minutes=0.75).progress(state) == pytest.approx(30 / 45)
    assert RunLimits(generated_tokens=600).progress(state) == pytest.approx(1.0)
    assert RunLimits().progress(state) == 0.0


def remix(**options):
    return build_replay(ReplayConfig(method="remix", remix=options), seed=0, prompts_per_step=4, total_steps=0)


def test_remix_reincarnates_at_the_first_step_past_the_fraction():
    replay = remix()
    fractions = [0.0, 0.2, 0.45, 0.55, 0.7, 0.9]  # e.g. tokens used / max_generated_tokens before each step
    seen = []
    for step, f in enumerate(fractions):
        replay.progress(step, f)
        seen.append((replay.update_passes(step), replay.reincarnate(step)))
    assert seen == [(2, False)] * 3 + [(1, True)] + [(1, False)] * 2


def test_remix_reincarnate_at_one_never_reincarnates():
    replay = remix(reincarnate_at=1.0)
    for step, f in enumerate([0.5, 0.99, 1.0]):
        replay.progress(step, f)
        assert replay.update_passes(step) == 2 and not replay.reincarnate(step)


def test_the_reincarnation_point_survives_a_resume():
    a = remix()
    for step, f in enumerate([0.1, 0.6, 0.7]):
        a.progress(step, f)
        a.reincarnate(step)
    b = remix()
    b.load_state_dict(a.state_dict())
    assert b.reincarnation_step == 1 and b.update_passes(3) == 1 and not b.reincarnate(3)


FAST = ["task.max_digits=1", "task.eval_size=4", "rollout.prompts_per_step=4", "rollout.num_generations=4",
        "rollout.max_new_tokens=16", "train.eval_samples=0", "optim.micro_batch_size=16", "model.threads=1",
        "train.eval_every=0", "train.checkpoint_every=0", "replay.method=remix"]


def test_a_token_budget_run_reincarnates_half_way_through_its_tokens(tmp_path):
    budget = 1200  # a few steps of the tiny model's tokens; train.steps stays at its default 100
    cfg = load_run_config(None, [f"output_dir={tmp_path}", *FAST])
    assert cfg.train.steps == 100
    steps = []
    with Trainer(cfg) as t:
        t.prepare()
        t.fit(RunLimits(generated_tokens=budget), on_step=lambda s, m: steps.append(m))
        assert t.stopped_by.startswith("max_generated_tokens") and t.state.step < 50  # stopped by tokens
        totals = [0.0] + [m["tokens/total"] for m in steps]  # tokens used before each step
        expected = next(s for s, used in enumerate(totals) if used / budget >= 0.5)
        assert 0 < expected < len(steps)
        assert t.replay.reincarnation_step == expected
        assert t.state.reference_moved_at == expected  # the reference moved to the policy there
    # off-policy (replayed groups) before it, on-policy after
    assert all(m.get("replay/served_groups", 0) == 0 for m in steps[expected:])
    assert all("replay/fresh_groups" in m for m in steps[:expected])
