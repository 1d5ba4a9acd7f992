"""math_answer keeps a time limit off the main thread (scoring beside generation)."""

import threading

from rollwise.filter import math_answer as ma


def _in_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("v", fn()))
    t.start()
    t.join()
    return out["v"]


def test_off_main_thread_scores_like_the_main_thread():
    completions, gold = ["It is \\boxed{\\frac{3}{4}}", "The answer is 0.7", "no number"], ["0.75"] * 3
    main = ma.math_answer(["q"] * 3, completions, answer=gold)
    off = _in_thread(lambda: ma.math_answer(["q"] * 3, completions, answer=gold))
    assert off == main == [1.0, 0.0, 0.0]
    assert [s.reason for s in off] == [s.reason for s in main]


def test_a_stalling_check_is_cut_off_in_a_thread(monkeypatch):
    # (7^9999)^9999 passes the magnitude guard (each exponent <= MAX_EXPONENT) but sympy needs
    # over 3 s to compare it (the main thread's alarm stops it at 3 s); in a thread there is no
    # alarm, so only the helper's deadline bounds it
    monkeypatch.setattr(ma, "OFF_THREAD_TIMEOUT_S", 1.0)
    _in_thread(lambda: ma.math_answer(["q"], ["\\boxed{1}"], answer=["1"]))  # start the helper untimed
    first = ma._off_thread._proc
    (score,) = _in_thread(lambda: ma.math_answer(["q"], ["\\boxed{(7^{9999})^{9999}}"], answer=["1"]))
    assert score == 0.0 and "longer than 1s" in score.reason  # the deadline fired
    assert ma._off_thread._proc is None and not first.is_alive()  # the stalled helper was killed
    assert _in_thread(lambda: ma.math_answer(["q"], ["\\boxed{2}"], answer=["2"])) == [1.0]  # a new helper works
    assert ma._off_thread._proc is not None and ma._off_thread._proc.pid != first.pid
