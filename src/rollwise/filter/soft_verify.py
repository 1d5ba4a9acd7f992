"""``test_threshold`` with its soft verifier: a judge grades the problems that have too few tests.

"Verification Limits Code LLM Training": verify synthetic code by tests with the pass threshold
relaxed below 100% (r = 1[pass fraction ≥ τ]: the code rewards' ``threshold``, ``rollwise.filter.code``),
and use an LLM "soft verifier" where tests are scarce. This module is the second half:

``rewards: [{name: test_threshold, test_threshold: {tests: code_asserts, threshold: 0.8, judge: {...}}}]``
scores a row with ``min_tests`` (3) or more tests by its tests at τ = ``threshold`` (a row's
``pass_threshold`` column still wins), and a row with fewer by the judge (``rollwise.filter.judge``:
its reward N/max_score, its reason kept, its failures counted as the judge's are) — one batch per
scoring call for each. Without ``judge`` every row is scored by its tests (plain ``test_threshold``).
Tests are counted per row: ``tests`` (assert lines, code_asserts), ``io_cases`` (code_io), the
``assert`` lines of ``test`` (code_exit).

Where we depart: the paper's soft verifier reads the problem and the solution; ours reads what
``judge.template`` gives it (the prompt, the completion and any column, e.g. the few tests there
are). The paper's 2-4 point pass@1 gain comes from 7B-scale models on synthetic code with a strong
judge — a bigger model and a served judge; with the tiny model as judge the soft rows score 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import Field

from rollwise.config import StrictModel
from rollwise.filter.judge import JudgeConfig
from rollwise.filter.rewards import call_reward, load_state, state_of

TEST_COLUMNS = {"code_asserts": "tests", "code_io": "io_cases", "code_exit": "test"}


class TestThresholdConfig(StrictModel):
    """Tests at a pass threshold, and a judge for the problems with too few (``name: test_threshold``)."""

    __test__ = False  # not a pytest class, whatever its name

    tests: Literal[tuple(TEST_COLUMNS)] = Field("code_asserts", description="the code reward that runs the tests")
    threshold: float = Field(1.0, ge=0, le=1, description="τ: r = 1[passed/total >= τ] (a pass_threshold column wins)")
    min_tests: int = Field(3, ge=1, description="rows with fewer tests are graded by the judge (when set)")
    judge: JudgeConfig | None = Field(None, description="the soft verifier: a judge and its rubric (unset: tests only)")


def count_tests(kind: str, value) -> int:
    """How many tests a row holds for the code reward ``kind``.

    >>> count_tests("code_asserts", ["assert f(1) == 1", "assert f(2) == 4"]), count_tests("code_exit", "assert a\\nassert b\\n")
    (2, 2)
    """
    if value is None:
        return 0
    if kind == "code_exit":
        return sum(1 for line in str(value).splitlines() if line.strip().startswith("assert"))
    return len(value)


class TestThreshold:
    """test_threshold: code tests at a pass threshold τ; problems with fewer than min_tests tests
    graded by a judge instead (the soft verifier)."""

    __test__ = False
    __name__ = "test_threshold"

    def __init__(self, cfg: TestThresholdConfig, tests_fn: Callable, judge: Callable | None = None):
        self.cfg, self.tests_fn, self.judge = cfg, tests_fn, judge
        self.soft_rows = 0

    def state_dict(self) -> dict:
        """The judge's state (its verdict cache), for the checkpoint."""
        return {"judge": state_of(self.judge)}

    def load_state_dict(self, state: dict) -> None:
        load_state(self.judge, state.get("judge"))

    def __call__(self, prompts, completions, completion_ids=None, **columns) -> list:
        column = columns.get(TEST_COLUMNS[self.cfg.tests]) or [None] * len(completions)
        soft = [self.judge is not None and count_tests(self.cfg.tests, c) < self.cfg.min_tests for c in column]
        out: list = [None] * len(completions)
        kwargs = {**columns, "completion_ids": completion_ids}
        for use_judge, fn, extra in ((False, self.tests_fn, {"threshold": self.cfg.threshold}), (True, self.judge, {})):
            rows = [i for i, s in enumerate(soft) if s == use_judge]
            if not rows:
                continue
            part = {k: [v[i] for i in rows] if isinstance(v, list) else v for k, v in kwargs.items()}
            values = call_reward(fn, [prompts[i] for i in rows], [completions[i] for i in rows], part | extra)
            for i, v in zip(rows, values):
                out[i] = v
        self.soft_rows += sum(soft)
        return out

    def step_metrics(self) -> dict[str, float]:
        """``test_threshold/soft_rows`` (rows graded by the judge since the last call) and the judge's own."""
        out = {"test_threshold/soft_rows": float(self.soft_rows)}
        self.soft_rows = 0
        if self.judge is not None:
            out |= self.judge.step_metrics()
        return out
