"""``masa``: the meta reward and the skip rule by hand (METHODS.md's test idea), calibration, the
cut-off at 2·L̂, the policy's own readout, and a run."""

import random

import pytest

from rollwise.control.base import Controller, PromptCursor
from rollwise.control.masa import (
    Masa,
    MasaConfig,
    MetaReadout,
    alignment_loss,
    digit_rewards,
    keeps,
    meta_reward,
)
from rollwise.optim.auxiliary import AuxiliaryTerm
from rollwise.control.stats import PromptStats
from rollwise.generate.group import Partial
from rollwise.types import Prompt, Rollout, RolloutGroup


class Stream:
    def get(self, index):
        return Prompt(f"p{index}", f"q{index}", token_ids=[5, 6])


def scripted(p_hats, l_hat=10.0):
    """A predictor that answers p̂ by prompt index (p<i>) and a fixed L̂."""
    return lambda prompts: ([p_hats[int(p.id[1:])] for p in prompts], [l_hat] * len(prompts))


def calibrated_masa(p_hats, **cfg):
    masa = Masa(MasaConfig(min_examples=1, **cfg), predict=scripted(p_hats))
    masa.meta_rewards = [1.0]
    assert masa.calibrated
    return masa


def test_meta_reward_by_hand():
    assert meta_reward(0.3, 0.3) == 1.0 and meta_reward(0.0, 0.0) == 1.0  # p̂ = p: reward 1
    assert meta_reward(0.9, 0.4) == pytest.approx(0.5)
    assert [keeps(p) for p in (0.049, 0.05, 0.5, 0.95, 0.951)] == [False, True, True, True, False]


def test_a_calibrated_controller_skips_only_the_extreme_predictions():
    p_hats = [0.0, 0.5, 1.0, 0.3, 0.04, 0.96, 0.05, 0.95]
    masa = calibrated_masa(p_hats)
    picked = masa.select_prompts(PromptCursor(Stream(), 0), PromptStats(), 4)
    assert [p.id for p in picked] == ["p1", "p3", "p6", "p7"]  # every p̂ in [.05, .95] kept, the rest skipped
    assert masa.metrics()["masa/skipped"] == 4.0
    baseline = Controller().select_prompts(PromptCursor(Stream(), 0), PromptStats(), 4)
    assert [p.id for p in baseline] != [p.id for p in picked]  # masa's batch differs from plain GRPO's


@pytest.mark.parametrize("seed", range(20))
def test_a_prompt_predicted_in_range_is_never_skipped(seed):
    """METHODS.md: whenever the kept ones fit in the batch, every p̂ in [.05, .95] is selected."""
    rng = random.Random(seed)
    p_hats = [rng.choice([0.0, 0.01, 0.05, 0.5, 0.95, 0.99, 1.0]) for _ in range(8)]
    masa = calibrated_masa(p_hats)
    picked = {p.id for p in masa.select_prompts(PromptCursor(Stream(), 0), PromptStats(), 4)}
    in_range = {f"p{i}" for i, p in enumerate(p_hats) if 0.05 <= p <= 0.95}
    assert len(picked) == 4
    assert in_range <= picked if len(in_range) <= 4 else picked <= in_range


def test_uncalibrated_it_selects_as_the_baseline_and_learns_its_calibration():
    masa = Masa(MasaConfig(min_examples=2, calibrated=0.8), predict=scripted([0.0, 1.0, 0.5, 0.5]))
    picked = masa.select_prompts(PromptCursor(Stream(), 0), PromptStats(), 2)
    assert [p.id for p in picked] == ["p0", "p1"] and not masa.calibrated
    groups = [RolloutGroup(p, [Rollout(p.id, [5], [7], [-1.0], [0], "stop", reward=float(r), score=float(r))])
              for p, r in zip(picked, (0.0, 1.0))]  # pass rates 0 and 1: exactly as predicted
    masa.observe_step(groups, PromptStats())
    assert masa.meta_rewards == [1.0, 1.0] and masa.calibrated
    assert masa.metrics()["masa/meta_reward"] == 1.0
    restored = Masa(MasaConfig(min_examples=2))
    restored.load_state_dict(masa.state_dict())
    assert restored.calibrated


def test_the_cut_off_at_twice_the_predicted_length():
    masa = calibrated_masa([0.5, 0.5], cutoff=2.0)
    prompt = masa.select_prompts(PromptCursor(Stream(), 0), PromptStats(), 1)[0]  # L̂ = 10
    partial = lambda n: Partial(prompt, [1] * n, [0.0] * n)  # noqa: E731
    assert masa.should_continue(partial(19), PromptStats()) is True
    assert masa.should_continue(partial(20), PromptStats()) is False
    assert masa.metrics()["masa/cut"] == 1.0
    masa.meta_rewards = [0.0]  # no longer calibrated: nothing is cut
    assert masa.should_continue(partial(50), PromptStats()) is True
    assert masa.asks_should_continue


def test_the_policy_reads_out_its_own_prediction(tiny):
    model, tok = tiny
    readout = MetaReadout(lambda: model, tok, length_unit=10)
    prompts = [Prompt("a", "1+2=", token_ids=tok.encode("1+2=")), Prompt("b", "7-3=", token_ids=tok.encode("7-3="))]
    p_hat, l_hat = readout(prompts)
    assert all(0.05 <= p <= 0.95 for p in p_hat) and all(5 <= n <= 95 for n in l_hat)
    assert readout.tokens > 0
    masa = Masa(MasaConfig(), predict=readout)
    assert masa.forward_tokens() > 0 and masa.forward_tokens() == 0  # charged once


def _judged(prompt, correct, length):
    """A group of 4 rollouts of ``length`` tokens, ``correct`` of them right."""
    rollouts = [Rollout(prompt.id, list(prompt.token_ids), [7] * length, [0.0] * length, [0] * length, "stop")
                for _ in range(4)]
    for i, r in enumerate(rollouts):
        r.score = r.reward = float(i < correct)
    return RolloutGroup(prompt, rollouts)


def test_the_meta_rewards_of_each_digit_by_hand():
    rate, length = digit_rewards(1.0, None, 10)
    assert length is None and rate.tolist() == pytest.approx([0.05 + d / 10 for d in range(10)])  # 9 → .95 best
    rate, length = digit_rewards(0.0, 45.0, 10)
    assert int(rate.argmax()) == 0 and int(length.argmax()) == 4 and float(length[4]) == pytest.approx(1.0)
    assert float(length[9]) == 0.0  # 95 tokens for 45: an error past L, clamped at 0


def test_self_alignment_teaches_the_policy_its_pass_rates(tiny):
    """Only the self-alignment term, Adam, 40 steps: the policy learns that it always solves 'a' and
    never 'b' — its p̂ moves from near-equal to far apart, each toward its pass rate — and the
    expected meta reward (minus the logged loss) rises. The term is MASA's self-alignment."""
    import torch

    torch.manual_seed(0)
    model, tok = tiny
    readout = MetaReadout(lambda: model, tok, length_unit=10)
    a, b = (Prompt(i, t, token_ids=tok.encode(t)) for i, t in (("a", "1+2="), ("b", "7-3=")))
    groups = [_judged(a, 4, 12), _judged(b, 0, 12)]
    before = readout([a, b])[0]
    base = torch.optim.Adam(model.parameters(), lr=3e-3)
    opt = AuxiliaryTerm(base, lambda: alignment_loss(readout, model, groups), 1.0, "masa/align_loss")
    for _ in range(40):
        opt.zero_grad()
        opt.step()
    after = readout([a, b])[0]
    assert abs(before[0] - before[1]) < 0.2
    assert after[0] > before[0] + 0.2 and after[1] < before[1] - 0.2 and after[0] - after[1] > 0.5
    losses = opt.values
    assert losses[-1] < losses[0] - 0.2 and opt.metrics()["masa/align_loss"] == pytest.approx(sum(losses) / 40)
    assert alignment_loss(readout, model, []) is None


def test_a_run_with_masa(tmp_path):
    """Calibration forced on (calibrated=0): from the second step masa selects from 2n candidates."""
    from rollwise.bench.ablate import default_arms
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    trainer = Trainer(load_run_config(None, [
        f"output_dir={tmp_path}", "task.max_digits=1", "task.eval_size=4", "control.method=masa",
        "control.masa.calibrated=0", "control.masa.min_examples=1", "rollout.prompts_per_step=3",
        "rollout.num_generations=2", "rollout.max_new_tokens=10", "train.eval_samples=0", "model.threads=1",
        "train.eval_every=0", "train.checkpoint_every=0"]))
    trainer.prepare()
    first = trainer.step()
    assert trainer.state.cursor == 3 and "masa/meta_reward" in first  # uncalibrated: the next n prompts
    assert -1.0 <= first["masa/align_loss"] < 0  # the update trained the predictions
    second = trainer.step()
    assert second["masa/calibrated"] == 1.0 and trainer.state.cursor == 3 + 6  # calibrated: 2n candidates read
    assert "control:masa" in default_arms()
