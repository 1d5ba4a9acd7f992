"""maj@k: the vote by hand (ties, abstentions), the verifiers' extracted answers, and the scoring stage carrying them."""

import threading

import pytest

from rollwise.eval.majority import maj_at_k, majority_answer, majority_correct
from rollwise.filter import math_answer as ma
from rollwise.filter.arith import arith_reward
from rollwise.filter.countdown import check as countdown_check
from rollwise.filter.rewards import RewardFn, score_groups
from rollwise.types import Prompt, Rollout, RolloutGroup, Score


@pytest.mark.parametrize(
    "answers, expected",
    [
        (["4", "4", "5"], "4"),
        (["5", "4", "4"], "4"),  # a clear majority wins wherever it stands
        (["5", "4", "4", "5"], "5"),  # 2-2 tie: the answer sampled first
        (["4", "5", "5", "4"], "4"),
        ([None, None, "7"], "7"),  # abstentions do not vote
        ([None, "6", "7", None], "6"),  # 1-1 tie among the voters: first sampled
        ([None, None], None),  # nobody answered
        ([], None),
    ],
)
def test_majority_answer_by_hand(answers, expected):
    assert majority_answer(answers) == expected


def test_majority_correct_by_hand():
    # the majority "8" is wrong, though one sample was right: maj@3 misses, pass@3 would not
    assert majority_correct(["7", "8", "8"], [True, False, False]) is False
    assert majority_correct(["7", "7", "8"], [True, True, False]) is True
    # tie 1-1: "8" sampled first wins, and it is wrong
    assert majority_correct(["8", "7"], [False, True]) is False
    assert majority_correct(["7", "8"], [True, False]) is True
    # no answers: not solved, even if a verdict were true (a verifier that reports no answer)
    assert majority_correct([None, None], [True, True]) is False
    # one correct voter among abstainers wins the vote
    assert majority_correct([None, "3", None], [False, True, False]) is True
    with pytest.raises(ValueError, match="2 answers for 1"):
        majority_correct(["1", "2"], [True])


def test_maj_at_k_mean_over_prompts():
    prompts = [
        (["1", "1", "2", "2"], [True, True, False, False]),  # tie, "1" first: right
        (["2", "1", "1", "2"], [False, True, True, False]),  # tie, "2" first: wrong
        (["9", "9", "9", None], [False, False, False, False]),  # wrong majority
        ([None] * 4, [False] * 4),  # no votes
        (["3", None, None, None], [True, False, False, False]),  # a single vote decides
    ]
    assert maj_at_k(prompts) == pytest.approx(2 / 5)
    with pytest.raises(ValueError, match="no prompts"):
        maj_at_k([])


def test_score_is_a_float_with_an_optional_answer():
    s = Score(0.5, "partial", answer="x")
    assert s == 0.5 and s.reason == "partial" and s.answer == "x" and isinstance(s, float)
    assert Score(1.0).answer is None and Score(1.0, "r").reason == "r"  # the old call forms still work


def test_builtin_verifiers_report_their_extracted_answer():
    got = arith_reward(["2+2="] * 3, [" 2+2+0=04 #4", " #5", "no answer"], answer=["4"] * 3)
    assert [s.answer for s in got] == ["4", "5", None]
    assert countdown_check(" 25 + 3*7 = 46", [3, 7, 25], 46).answer == "25+3*7"
    assert countdown_check(" 25+3*5", [3, 7, 25], 46).answer == "25+3*5"  # wrong, still an answer to vote with
    assert countdown_check("   ", [3, 7, 25], 46).answer is None
    assert ma.check("so \\boxed{ 3 }", "3").answer == "3"
    assert ma.check("the answer is 0.7", "0.75").answer == "0.7"
    assert ma.check("no digits here", "1").answer is None


def test_math_answer_off_the_main_thread_keeps_the_answer():
    out = {}
    thread = threading.Thread(target=lambda: out.update(s=ma.check_with_timeout("\\boxed{12}", "12")))
    thread.start()
    thread.join()
    assert out["s"] == 1.0 and out["s"].answer == "12"


def test_scoring_carries_the_first_functions_answer_to_the_rollout():
    texts = [" #4", " #5", "none"]
    rollouts = [Rollout("p", [1], [5], [-0.1], [0], "stop", completion_text=t) for t in texts]
    group = RolloutGroup(Prompt("p", "2+2=", answer="4"), rollouts)

    def other(prompts, completions, **_):
        return [Score(0.0, answer="other")] * len(completions)

    score_groups([group], [RewardFn("arith", arith_reward), RewardFn("other", other)])
    assert [r.extracted_answer for r in rollouts] == ["4", "5", "other"]  # "none" had no '#': the next one's
    assert [r.correct for r in rollouts] == [True, False, False]
    score_groups([group], [RewardFn("len", lambda prompts, completions, **_: [1.0] * len(completions))])
    assert [r.extracted_answer for r in rollouts] == [None, None, None]  # rescoring does not keep stale answers
