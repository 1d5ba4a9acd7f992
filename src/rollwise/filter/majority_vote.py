"""``majority_vote``: label-free RL — the group's majority answer is the label (test-time RL).

"TTRL: Test-Time Reinforcement Learning" (Zuo et al., 2025) and its successors ETTRL
("Enhancing Test-Time RL", 2025) and ECHO train without ground truth: each prompt's G
rollouts vote with their final answers, the most voted answer becomes the pseudo-label, and
r_i = 1[answer_i = label]. ``rewards: [{name: majority_vote}]`` turns it on; ``task.labels:
none`` (``rollwise.tasks.labels``) hides the reference answers from training altogether.

What is guaranteed:

- the answers are the task verifier's own extracted answers (``Score.answer``, normalised by
  the verifier; the eval judge of ``filter/registry.py``), compared as strings — as maj@k
  compares them (``rollwise.eval.majority``); a rollout without an answer abstains and gets 0;
- the reward never depends on a reference answer: the verifier is only asked what each
  completion answered (under ``task.labels: none`` it is given none);
- a group whose top answers tie, or whose majority share (votes / G, abstentions included) is
  below ``min_share`` (.3), is skipped: every rollout scores 0 with the reason, so the group
  carries no signal (``majority_vote/skipped``);
- a group whose share exceeds ``confident_share`` (.9) has its positive advantages scaled by
  (1 − share) (``Rollout.positive_advantage_scale``, applied by ``optim.objective``);
- ``train/pseudo_label_acc``: the share of labelled groups whose pseudo-label the verifier judges
  correct against the true answer, where one is known (``Prompt.answer``, or
  ``Prompt.hidden_answer`` under ``task.labels: none``) — measured, never trained on.

Where we depart from the papers: no entropy-fork tree rollouts or entropy-based advantage
reshaping (ETTRL), no confidence-based branch widths, pruning or clipping (ECHO); TTRL trains on
the test set itself, we train on the train stream with its labels hidden and evaluate with the
true labels on the held-out split. The effect needs a model whose majority is right more often
than its samples (TTRL's Qwen2.5-Math-7B); a tiny model's majority is mostly noise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pydantic import Field

from rollwise.config import StrictModel
from rollwise.types import RolloutGroup, Score, is_correct


class MajorityVoteConfig(StrictModel):
    """The vote's thresholds (``rewards: [{name: majority_vote, majority_vote: {...}}]``)."""

    min_share: float = Field(0.3, ge=0, le=1, description="skip a group whose majority answer has fewer than this "
                             "share of its G votes (abstentions count in G)")
    confident_share: float = Field(0.9, ge=0, le=1, description="above this share, positive advantages are scaled "
                                   "by (1 - share)")


def pseudo_label(answers: Sequence[str | None], min_share: float = 0.3) -> tuple[str | None, float, str]:
    """(label, share, why) of one group's answers: the most voted answer and its share of all
    ``len(answers)`` votes; label None when every rollout abstained, the top answers tie, or
    the share is below ``min_share``.

    >>> pseudo_label(["3", "3", "5", None]), pseudo_label(["3", "5"])[0], pseudo_label(["1", "2", "3", "4"])[0]
    (('3', 0.5, ''), None, None)
    """
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return None, 0.0, "no rollout gave an answer"
    (top, count), *rest = votes.most_common()
    share = count / len(answers)
    if rest and rest[0][1] == count:
        tied = sorted(a for a, c in votes.items() if c == count)
        return None, share, f"tie between {', '.join(tied)[:60]}"
    if share < min_share:
        return None, share, f"majority share {share:.2f} below {min_share:g}"
    return top, share, ""


def majority_rewards(answers: Sequence[str | None], min_share: float = 0.3) -> list[Score]:
    """r_i = 1[answer_i = label] for one group, each with its answer and the reason; a skipped
    group (``pseudo_label``'s label None) scores 0 throughout.

    >>> [float(s) for s in majority_rewards(["3", "3", "5", None])], [float(s) for s in majority_rewards(["3", "5"])]
    ([1.0, 1.0, 0.0, 0.0], [0.0, 0.0])
    """
    label, share, why = pseudo_label(answers, min_share)
    if label is None:
        return [Score(0.0, f"majority_vote skipped the group: {why}", answer=a) for a in answers]
    return [Score(1.0, answer=a) if a == label else
            Score(0.0, f"{'no answer' if a is None else f'answer {a[:40]}'}; the majority answered {label[:40]} "
                       f"(share {share:.2f})", answer=a) for a in answers]


def positive_scale(share: float, confident_share: float = 0.9) -> float:
    """The factor on a group's positive advantages: 1 − share above ``confident_share``, else 1.

    >>> round(positive_scale(0.95), 6), positive_scale(0.5)
    (0.05, 1.0)
    """
    return 1.0 - share if share > confident_share else 1.0


class MajorityVote:
    """The ``majority_vote`` reward bound to the task's verifier: a group-level reward
    (``filter.rewards.score_groups`` hands it whole groups, ``score_groups(groups)``)."""

    def __init__(self, verifier, cfg: MajorityVoteConfig | None = None) -> None:
        self.verifier = verifier  # a filter.rewards.RewardFn: the eval judge, asked only what each completion answered
        self.cfg = cfg or MajorityVoteConfig()
        self.__doc__ = majority_vote.__doc__

    def score_groups(self, groups: list[RolloutGroup]) -> tuple[list[Score], dict[str, float]]:
        """(one Score per rollout, in group order; metrics). Sets each rollout's
        ``positive_advantage_scale``."""
        from rollwise.filter.rewards import call_reward, reward_inputs

        pairs = [(g, r) for g in groups for r in g.rollouts]
        prompts, completions, kwargs = reward_inputs(pairs)
        said = call_reward(self.verifier.fn, prompts, completions, kwargs)  # what each completion answered
        out: list[Score] = []
        labelled, right, known, i = 0, 0, 0, 0
        for g in groups:
            answers = [getattr(v, "answer", None) for v in said[i: i + len(g.rollouts)]]
            label, share, _ = pseudo_label(answers, self.cfg.min_share)
            out += majority_rewards(answers, self.cfg.min_share)
            for r in g.rollouts:
                r.positive_advantage_scale = positive_scale(share, self.cfg.confident_share) if label else 1.0
            if label is not None:
                labelled += 1
                verdict = self.label_correct(g, answers.index(label))
                if verdict is not None:
                    known += 1
                    right += verdict
            i += len(g.rollouts)
        metrics = {"majority_vote/labelled": labelled / max(len(groups), 1),
                   "majority_vote/skipped": float(len(groups) - labelled)}
        if known:
            metrics["train/pseudo_label_acc"] = right / known
        return out, metrics

    def label_correct(self, group: RolloutGroup, voter: int) -> bool | None:
        """Whether the verifier judges the pseudo-label (rollout ``voter`` gave it) correct against the
        group's true answer; None when no true answer is known. Only ``train/pseudo_label_acc`` reads it."""
        from rollwise.filter.rewards import call_reward, reward_inputs

        prompt = group.prompt
        truth = prompt.hidden_answer if prompt.hidden_answer is not None else prompt.answer
        if truth is None:
            return None
        prompts, completions, kwargs = reward_inputs([(group, group.rollouts[voter])])
        kwargs["answer"] = [truth]
        try:
            return is_correct(float(call_reward(self.verifier.fn, prompts, completions, kwargs)[0]))
        except Exception:  # a metric never takes training down
            return None


def majority_vote(prompts, completions, **_):
    """Label-free: r = 1 when a completion's answer (read by the task's verifier) is its group's majority answer
    (TTRL; groups that tie or whose majority share is below .3 score 0)."""
    raise TypeError("majority_vote scores whole groups: rollwise's scoring calls it through MajorityVote "
                    "(rewards: [{name: majority_vote}]); it is not a per-completion function")
