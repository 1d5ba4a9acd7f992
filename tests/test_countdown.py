"""countdown: the reward on hand-written cases, solvable instances, splits, determinism, config."""

import pytest

from rollwise.config import ConfigError, validate
from rollwise.tasks import countdown
from rollwise.tasks.arith import ArithConfig
from rollwise.tasks.countdown import CountdownConfig, check, countdown_reward

NUMS, TARGET = [3, 7, 25], 46


def reason(completion, nums=NUMS, target=TARGET):
    score = check(completion, nums, target)
    assert score == 0.0
    return score.reason


@pytest.mark.parametrize(
    "completion",
    [" 25+3*7=46", "25+3*7", " (7*3)+25 = 46", "7*3+25=46\n", " 7*7-3", " 7*7-3=46"],
)
def test_correct(completion):
    assert check(completion, [3, 7, 25, 7], TARGET) == 1.0


def test_fraction_arithmetic_is_exact():
    assert check(" 7/2*4=14", [7, 2, 4], 14) == 1.0  # 3.5 * 4, no integer truncation
    assert check(" 7/(4/2)", [7, 4, 2], 3).reason == "value 7/2 != target 3"


@pytest.mark.parametrize(
    "completion, expected",
    [
        (" 25+3*5=40", "uses 5 which is not given"),
        (" 25+25", "uses 25 2 times but it is given 1 time(s)"),
        (" 25+3*7-0=46", "uses 0 which is not given"),
        (" 25+3+7=35", "value 35 != target 46"),
        (" 25+3*7=47", "states 47 but the expression is 46"),
        (" 25+3*7=46 and more", "text after '=' is not an integer: '46 and more'"),
        ("=46", "empty expression"),
        ("", "empty expression"),
        (" -3+49", "unary minus or plus not allowed"),
        (" 25//3", "unsupported operator '//'"),
        (" 9**9**9**9", "unsupported operator '**'"),
        (" ((25+3)*7", "unparseable expression"),
        (" 25+3)*7", "unparseable expression"),
        (" 25 3 7", "unparseable expression"),
        (" 025+21", "unparseable expression"),
        (" ()", "unparseable expression"),
    ],
)
def test_incorrect_and_malformed(completion, expected):
    assert reason(completion) == expected


def test_division_by_zero():
    assert reason(" 7/(3-3)", [3, 3, 7], 46) == "division by zero"


@pytest.mark.parametrize(
    "hostile",
    [
        "__import__('os').system('x')",
        "0x19+21",
        "1e2",
        "25 if 1 else 3",
        "[25]",
        "25+3*7;46",
        "(" * 100 + "25" + ")" * 100,
        "1" * 10_000,
        "+".join(["3"] * 90),
        "\x00\n\t=46",
    ],
)
def test_hostile_text_scores_zero_without_running(hostile):
    assert check(hostile, NUMS, TARGET) == 0.0


def test_deep_but_short_expression_is_bounded():
    expr = "(" * 60 + "25" + ")" * 60  # under MAX_CHARS, deep nesting
    assert check(expr, [25], 25) in (0.0, 1.0)  # scored either way, never raises


def test_reward_batch_matches_check():
    scores = countdown_reward(["p"] * 3, [" 25+3*7=46", " 25-3", "junk"], nums=[NUMS] * 3, target=[46, 22, 46])
    assert scores == [1.0, 1.0, 0.0]
    assert scores[2].reason == "unparseable expression: character 'j' not allowed"


def test_demonstrations_score_one():
    task = countdown.build(seed=0)
    prompts = [task.train.get(i) for i in range(200)] + task.eval[:50]
    completions = [task.demonstrate(p) for p in prompts]
    nums = [p.columns["nums"] for p in prompts]
    targets = [p.columns["target"] for p in prompts]
    scores = countdown_reward([p.text for p in prompts], completions, nums, targets)
    failures = [(p.text, c, s.reason) for p, c, s in zip(prompts, completions, scores) if s != 1.0]
    assert not failures


def test_instances_respect_options():
    task = countdown.build(seed=1, min_numbers=3, max_numbers=4, max_number=25, max_target=500)
    for i in range(300):
        p = task.train.get(i)
        nums, target = p.columns["nums"], p.columns["target"]
        assert 3 <= len(nums) <= 4 and all(1 <= n <= 25 for n in nums)
        assert 1 <= target <= 500 and target not in nums
        assert p.text == f"nums {' '.join(map(str, nums))} target {target}:"


def test_eval_is_held_out_and_deterministic():
    task = countdown.build(seed=3, eval_size=200)
    eval_texts = [p.text for p in task.eval]
    assert len(eval_texts) == len(set(eval_texts)) == 200
    train_texts = {task.train.get(i).text for i in range(3000)}
    assert not train_texts & set(eval_texts)
    again = countdown.build(seed=3, eval_size=200)
    assert [p.text for p in again.eval] == eval_texts
    assert [again.train.get(i).text for i in range(50)] == [task.train.get(i).text for i in range(50)]
    other = countdown.build(seed=4, eval_size=200)
    assert [p.text for p in other.eval] != eval_texts


def test_build_rejects_bad_options():
    with pytest.raises(ValueError, match="min_numbers"):
        countdown.build(min_numbers=5, max_numbers=4)


def test_configs():
    cfg = validate(CountdownConfig, {"name": "countdown", "max_number": 10, "eval_size": 20})
    task = cfg.build(seed=0)
    assert task.name == "countdown" and len(task.eval) == 20
    assert all(max(task.train.get(i).columns["nums"]) <= 10 for i in range(50))
    with pytest.raises(ConfigError, match="max_numbr"):
        validate(CountdownConfig, {"max_numbr": 4})
    with pytest.raises(ConfigError, match="min_numbers"):
        validate(CountdownConfig, {"min_numbers": 4, "max_numbers": 3})
    arith = validate(ArithConfig, {"max_digits": 2, "eval_size": 10}).build(seed=0)
    assert arith.name == "arith" and len(arith.eval) == 10
    with pytest.raises(ConfigError, match="ops"):
        validate(ArithConfig, {"ops": "/"})
