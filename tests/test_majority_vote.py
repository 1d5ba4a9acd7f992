"""``majority_vote`` (label-free RL) and ``task.labels: none``: the vote by hand (METHODS.md's test idea),
the confident-share scaling, rewards that follow the majority whatever the labels say, a run
that never reads a reference answer, and the refusals."""

import importlib
import math

import pytest
import torch

from rollwise.config import ConfigError
from rollwise.filter.majority_vote import majority_rewards, positive_scale, pseudo_label
from rollwise.filter.registry import resolve_rewards
from rollwise.filter.rewards import score_groups
from rollwise.optim.objective import ObjectiveConfig, assign_advantages
from rollwise.tasks.arith import build as build_arith
from rollwise.tasks.labels import hide
from rollwise.train.config import RewardConfig, load_run_config
from rollwise.types import Prompt, Rollout, RolloutGroup

SEEN_ANSWERS: list = []  # what spy_reward was given as ``answer``


def spy_reward(prompts, completions, answer, **_):
    """A weight-0 reward that records the reference answers training hands to reward functions."""
    SEEN_ANSWERS.extend(answer)
    return [0.0] * len(completions)


def test_the_vote_by_hand():
    """METHODS.md: answers [3, 3, 5, None] → label 3, rewards [1, 1, 0, 0]; [3, 5] is skipped."""
    assert pseudo_label(["3", "3", "5", None]) == ("3", 0.5, "")
    assert [float(s) for s in majority_rewards(["3", "3", "5", None])] == [1.0, 1.0, 0.0, 0.0]
    label, share, why = pseudo_label(["3", "5"])
    assert label is None and share == 0.5 and why.startswith("tie")
    assert [float(s) for s in majority_rewards(["3", "5"])] == [0.0, 0.0]
    # the share counts abstentions: 2 of 7 votes (.29) is below .3, 2 of 6 (.33) is not
    assert pseudo_label(["1", "2", "3", "3", None, None, None])[0] is None
    assert pseudo_label(["1", "2", "3", "3", None, None])[0] == "3"
    assert pseudo_label([None, None])[0] is None  # nobody answered
    reasons = [s.reason for s in majority_rewards(["3", "5"])]
    assert all("tie between 3, 5" in r for r in reasons)


def _group(pid, completions, answer="7", hidden=False):
    prompt = Prompt(pid, "3+4=", answer=answer, columns={"a": 3, "op": "+", "b": 4})
    prompt = hide(prompt) if hidden else prompt
    rollouts = [Rollout(pid, [1], [2], [-1.0], [0], "stop", completion_text=c) for c in completions]
    return RolloutGroup(prompt, rollouts)


def _majority_rewards(groups):
    fns, judge = resolve_rewards([RewardConfig(name="majority_vote")], build_arith(eval_size=2))
    metrics = score_groups(groups, fns)
    return [[r.reward for r in g.rollouts] for g in groups], metrics


@pytest.mark.parametrize("label_mode", ["wrong", "hidden"])
def test_rewards_follow_the_majority_not_the_labels(label_mode):
    """With the reference answer wrong (9) or hidden, the rewards are the majority's — and differ from
    what plain GRPO's verifier gives; train/pseudo_label_acc compares the label with the truth."""
    completions = [" #7", " #7", " #8", " nothing"]  # majority 7 (share .5), one wrong, one abstains
    wrong_majority = [" #8", " #8", " #8", " #7"]  # the majority is wrong here
    if label_mode == "wrong":  # the labels lie: 9 for both
        groups = [_group("a", completions, answer="9"), _group("b", wrong_majority, answer="9")]
    else:
        groups = [_group("a", completions, hidden=True), _group("b", wrong_majority, hidden=True)]
    rewards, metrics = _majority_rewards(groups)
    assert rewards == [[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]]
    assert [r.extracted_answer for r in groups[0].rollouts] == ["7", "7", "8", None]
    # the truth is 7: group a's label is right, group b's is wrong; with the lying labels, neither is "right"
    assert metrics["train/pseudo_label_acc"] == (0.5 if label_mode == "hidden" else 0.0)
    verifier = [[float(v) for v in build_arith(eval_size=2).rewards["arith"](
        ["3+4="] * 4, g_completions, answer=["9"] * 4)] for g_completions in (completions, wrong_majority)]
    assert verifier != rewards  # plain GRPO's rewards (the verifier on the given labels) are not these


def test_a_skipped_group_carries_no_signal():
    groups = [_group("t", [" #7", " #8"]), _group("low", [" #1", " #2", " #3", " #3"] + [" x"] * 3)]
    rewards, metrics = _majority_rewards(groups)
    assert rewards == [[0.0, 0.0], [0.0] * 7]
    assert metrics["majority_vote/skipped"] == 2.0 and "train/pseudo_label_acc" not in metrics
    assert "tie" in groups[0].rollouts[0].reward_reasons["majority_vote"]


def test_a_confident_label_scales_positive_advantages():
    """Share 19/20 = .95 > .9: the 19 positive advantages are GRPO's × .05, the negative one is GRPO's."""
    assert positive_scale(0.95) == pytest.approx(0.05) and positive_scale(0.9) == 1.0
    groups = [_group("c", [" #7"] * 19 + [" #8"])]
    _majority_rewards(groups)
    assert all(r.positive_advantage_scale == pytest.approx(0.05) for r in groups[0].rollouts)
    assign_advantages(groups, ObjectiveConfig(method="grpo"))
    mean = 0.95
    std = math.sqrt((19 * 0.05**2 + 0.95**2) / 19)  # Bessel
    adv = [r.advantage[0] for r in groups[0].rollouts]
    assert adv[0] == pytest.approx(0.05 * 0.05 / (std + 1e-6), rel=1e-5)
    assert adv[-1] == pytest.approx((0.0 - mean) / (std + 1e-6), rel=1e-5)


def test_labels_none_is_refused_without_a_label_free_reward(tmp_path):
    with pytest.raises(ConfigError, match="task.labels: none .* majority_vote"):
        load_run_config(None, ["task.labels=none"])
    with pytest.raises(ConfigError, match="only a majority_vote reward"):
        load_run_config(None, ["rewards=[{name: arith, majority_vote: {min_share: 0.5}}]"])
    with pytest.raises(ConfigError, match="task.labels"):  # countdown checks its target: no label to hide
        load_run_config(None, ["task.name=countdown", "task.labels=none", "rewards=[{name: majority_vote}]"])


def test_a_label_free_run_never_reads_a_reference_answer(tmp_path):
    """``task.labels: none``: every reward function is handed answer None; the rewards are the
    majority's; the eval still judges with the true labels; the run logs train/pseudo_label_acc."""
    from rollwise.train.loop import Trainer

    seen = importlib.import_module("tests.test_majority_vote").SEEN_ANSWERS  # the module the run imports
    seen.clear()
    cfg = load_run_config(None, [
        f"output_dir={tmp_path}", "task.max_digits=1", "task.eval_size=4", "task.labels=none",
        "rewards=[{name: majority_vote}, {name: 'tests.test_majority_vote:spy_reward', weight: 0}]",
        "rollout.prompts_per_step=4", "rollout.num_generations=4", "rollout.max_new_tokens=12",
        "train.eval_samples=0", "model.threads=1", "train.steps=2", "train.eval_every=0", "train.checkpoint_every=0"])
    torch.manual_seed(0)
    trainer = Trainer(cfg)
    trainer.prepare()
    metrics = trainer.step()
    assert seen and all(a is None for a in seen)
    assert all(p.answer is not None for p in trainer.eval_prompts)  # eval keeps the labels
    assert trainer.judge.name == "arith"
    assert "majority_vote/labelled" in metrics and "reward/majority_vote" in metrics
    batch = trainer.collect(1, trainer.state.cursor, trainer.engine)
    for g in batch.groups:
        assert g.prompt.answer is None and g.prompt.hidden_answer is not None
        answers = [r.extracted_answer for r in g.rollouts]
        label = pseudo_label(answers)[0]
        assert [r.reward for r in g.rollouts] == [float(label is not None and a == label) for a in answers]


def test_the_report_plots_pseudo_label_accuracy():
    """train/pseudo_label_acc is a key curve (shown open) in its own label-free group, with the vote's counts."""
    from rollwise.report.curves import group_metrics, key_rank

    groups = group_metrics(["train/pseudo_label_acc", "majority_vote/skipped", "reward/mean"])
    assert groups["label-free"] == ["majority_vote/skipped", "train/pseudo_label_acc"]
    assert key_rank("train/pseudo_label_acc") is not None


def test_majority_vote_is_a_ledger_arm():
    """``reward:majority_vote`` is a default arm of ``rollwise bench ablate``: label-free, its config valid."""
    from rollwise.bench.ablate import arm_lines, default_arms

    assert "reward:majority_vote" in default_arms()
    lines = arm_lines("reward:majority_vote")
    assert lines == ["rewards=[{name: majority_vote}]", "task.labels=none"]
    cfg = load_run_config(None, lines)
    assert cfg.task.labels == "none" and [r.name for r in cfg.rewards] == ["majority_vote"]
