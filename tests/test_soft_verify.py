"""``test_threshold``'s soft verifier (issue 36 §1): tests at τ, a judge where a problem has < 3 tests.

METHODS.md's test idea: 4 of 5 tests passed → 0 at τ = 1.0, 1 at τ = .8 (the code rewards' rule,
forwarded); then rows with fewer than 3 tests go to the judge in one batch, the others to their tests.
"""

import pytest

from rollwise.filter.code import threshold_score
from rollwise.filter.judge import Judge, JudgeConfig
from rollwise.filter.judge_backends import JudgeReply
from rollwise.filter.rewards import RewardFn, reward_failures, score_groups
from rollwise.filter.soft_verify import TestThreshold, TestThresholdConfig, count_tests
from rollwise.types import Prompt, Rollout, RolloutGroup

JUDGE = {"base_url": "http://unused.invalid/v1", "api_model": "m"}


def four_of_five(prompts, completions, tests, threshold=1.0, **_):
    """A stand-in for code_asserts: every completion passes 4 of its row's tests (of 5 here)."""
    return [threshold_score(min(4, len(t)), len(t), threshold) for t in tests]


class Scripted:
    def __init__(self):
        self.batches = []

    def complete(self, texts):
        self.batches.append(texts)
        return [JudgeReply("Looks right. Score: 8" if "good" in t else "no idea", 3, 2) for t in texts]


def _group(pid, tests, *completions):
    rs = [Rollout(pid, [1], [5], [0.0], [0], "stop", completion_text=c) for c in completions]
    return RolloutGroup(Prompt(pid, "write f", columns={"tests": tests}), rs)


FIVE = [f"assert f({i}) == {i}" for i in range(5)]


def test_four_of_five_tests_at_tau_1_and_08():
    for tau, want in ((1.0, 0.0), (0.8, 1.0)):
        fn = TestThreshold(TestThresholdConfig(threshold=tau), four_of_five)
        g = _group("a", FIVE, "def f(x): return x")
        score_groups([g], [RewardFn("test_threshold", fn)])
        assert g.rewards == [want]


def test_rows_with_few_tests_go_to_the_judge():
    backend = Scripted()
    cfg = TestThresholdConfig(judge=JUDGE)
    fn = TestThreshold(cfg, four_of_five, Judge(cfg.judge, backend=backend, name="test_threshold"))
    many, few = _group("a", FIVE, "x", "y"), _group("b", FIVE[:2], "good code", "bad code")
    metrics = score_groups([many, few], [RewardFn("test_threshold", fn)])
    assert many.rewards == [0.0, 0.0]  # 4/5 at τ = 1: the tests decide
    assert few.rewards == pytest.approx([0.8, 0.0])  # 2 tests < 3: the judge decides
    assert len(backend.batches) == 1 and len(backend.batches[0]) == 2  # one batch, the soft rows only
    assert few.rollouts[0].reward_reasons["test_threshold"] == "Looks right."
    assert metrics["test_threshold/soft_rows"] == 2.0 and metrics["test_threshold/tokens"] == 10.0
    assert reward_failures([few])["test_threshold"]["errors"] == 1  # the judge's unparseable reply, counted
    plain = TestThreshold(TestThresholdConfig(), four_of_five)  # no judge: every row by its tests
    g = _group("b", FIVE[:2], "good code")
    score_groups([g], [RewardFn("test_threshold", plain)])
    assert g.rewards == [1.0]  # 2 of 2 passed


def test_counting_tests():
    assert count_tests("code_asserts", FIVE) == 5 and count_tests("code_io", [{"input": "", "output": ""}]) == 1
    assert count_tests("code_exit", "def check(f):\n    assert f(1)\n    assert f(2)\n") == 2
    assert count_tests("code_asserts", None) == 0


def test_test_threshold_is_one_config_line():
    from rollwise.config import ConfigError
    from rollwise.filter.registry import resolve_rewards
    from rollwise.train.config import load_run_config

    cfg = load_run_config(None, ["rewards=[{name: test_threshold, test_threshold: {threshold: 0.8, judge: "
                                 "{base_url: 'http://x/v1', api_model: m}}}]"])
    fns, _ = resolve_rewards(cfg.rewards, cfg.task.build(0), warn=False)
    fn = fns[0].fn
    assert isinstance(fn, TestThreshold) and fn.judge is not None and fn.tests_fn.__name__ == "code_asserts"
    with pytest.raises(ConfigError, match="only a test_threshold reward"):
        load_run_config(None, ["rewards=[{name: arith, test_threshold: {}}]"])
