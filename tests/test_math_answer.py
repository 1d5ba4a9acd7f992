"""math_answer: extraction, equivalence via math_verify, hostile input, threads."""

import threading

import pytest

from rollwise.filter.math_answer import extract_answer, math_answer


def score(completion, gold):
    return math_answer(["q"], [completion], answer=[gold])[0]


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("so \\boxed{1} then \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{{a}+{b}} and after that 7", "{a}+{b}"),
        ("Natalia sold 48 clips.\n#### 72", "72"),
        ("The answer is: 15.", "15"),
        ("#### 3\nso the answer is 4\nthanks", "4"),
        ("there were 3 cats and 12 dogs", "12"),
        ("it costs $1,250.50 total", "1,250.50"),
        ("no digits here", None),
        ("\\boxed{unclosed 7", "7"),
        ("", None),
    ],
)
def test_extract_answer(completion, expected):
    assert extract_answer(completion) == expected


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("\\boxed{42}", "42"),
        ("so 6*7 = 42.", "42"),
        ("#### 1,000", "1000"),
        ("The answer is 0.5", "\\frac{1}{2}"),
        ("\\boxed{\\frac{1}{2}}", "1/2"),
        ("\\boxed{\\dfrac{3}{4}}", "0.75"),
        ("\\boxed{x = 3}", "3"),
        ("\\boxed{\\sqrt{2}}", "2^{1/2}"),
        ("\\boxed{2^{2024}}", "2^{2024}"),
        ("\\boxed{-7}", "-7"),
        ("\\boxed{42}", 42),  # non-string reference answers (ints from Parquet) are compared as text
    ],
)
def test_correct(completion, gold):
    assert score(completion, gold) == 1.0


@pytest.mark.parametrize(
    "completion, gold, reason",
    [
        ("\\boxed{41}", "42", "final answer '41' is not equal to '42'"),
        ("#### 7", "\\frac{1}{2}", "final answer '7' is not equal to '\\\\frac{1}{2}'"),
        ("I don't know", "42", "no final answer found"),
        ("", "42", "no final answer found"),
        ("\\boxed{42}", None, "no reference answer"),
    ],
)
def test_incorrect(completion, gold, reason):
    result = score(completion, gold)
    assert result == 0.0 and result.reason == reason


@pytest.mark.parametrize(
    "hostile",
    [
        "__import__('os').system('x')",
        "the answer is __import__('os').system('x')",
        "\\boxed{__import__('os').system('x')}",
        "9**9**9**9",
        "the answer is 9**9**9**9",
        "\\boxed{9^{9^{9^9}}}",
        "\\boxed{" + "9^{" * 40 + "9" + "}" * 40 + "}",
        "\\boxed{(10^{6})!}",
        "\\boxed{\\binom{10^{9}}{10^{5}}}",
        "\\boxed{" + "(" * 50,
        "\\boxed{((((}",
        "((((((((",
        "x" * 200_000,
        "1" * 100_000,
        "\\boxed{" + "1+" * 500 + "1}",
        "\x00\x01\ufffd",
    ],
)
def test_hostile_text_scores_zero_without_hitting_a_deadline(hostile):
    # the cost guards reject these before sympy evaluates anything: no time limit fires
    # (a deadline would show in the reason as TimeoutException / "took longer than")
    result = score(hostile, "3")
    assert result == 0.0 and result.reason
    assert "Timeout" not in result.reason and "took longer" not in result.reason, result.reason


def test_batch_and_docstring_example():
    scores = math_answer(["a", "b"], ["It is \\boxed{\\frac{3}{4}}", "The answer is 0.7"], answer=["0.75", "0.75"])
    assert scores == [1.0, 0.0] and all(isinstance(s, float) for s in scores)


def test_works_outside_the_main_thread():
    """math_verify's signal-based timeout fails off the main thread; we disable it there."""
    results = []
    completions = ["\\boxed{42}", "#### 41", "\\boxed{9^{9^{9^9}}}"]
    worker = threading.Thread(target=lambda: results.extend(math_answer(["q"] * 3, completions, answer=["42"] * 3)))
    worker.start()
    worker.join(timeout=30)
    assert results == [1.0, 0.0, 0.0]
    assert "could not check" not in results[1].reason
