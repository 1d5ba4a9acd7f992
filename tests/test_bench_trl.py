"""``rollwise bench trl``: the workloads, the settings mapping, and the lockstep of the two arms.

Speed is never asserted. The TRL arm needs the ``compare`` extra (``make test`` installs it);
without TRL these tests say so and skip.
"""

import io
import random

import pytest
from rich.console import Console

from rollwise.bench.trl import TRLBenchConfig, long_working, run_trl_bench, settings_mapping, trl_config
from rollwise.config import ConfigError
from rollwise.filter.arith import arith_reward

TINY = ["seeds=[0]", "steps=2", "eval_every=1", "eval_size=8", "sft_steps=30", "sft_batch_size=16",
        "prompts_per_step=2", "num_generations=4", "micro_batch_size=8", "max_new_tokens=32"]


def test_long_working_is_judged_correct_and_long():
    assert long_working(47, "+", 8) == (" column 1: 7 plus 8 plus carry 0 is 15, write 5 carry 1. column 2: 4 plus 0 "
                                        "plus carry 1 is 05, write 5 carry 0. the answer is #55")
    rng = random.Random(0)
    for _ in range(200):
        a, b, op = rng.randint(1000, 99999), rng.randint(1000, 99999), rng.choice("+-")
        text = long_working(a, op, b)
        assert arith_reward([""], [text], answer=[str(a + b if op == "+" else a - b)]) == [1.0], text
        assert len(text) >= 150  # 4-5 digit problems: 200+ tokens for a character-level tokenizer


def test_every_setting_maps_to_the_same_trl_value(tmp_path):
    pytest.importorskip("trl", reason="the compare extra (TRL) is not installed")
    cfg = TRLBenchConfig(num_generations=4, prompts_per_step=6, micro_batch_size=12, lr=2e-5, temperature=0.9)
    args = trl_config(cfg, seed=3, out_dir=tmp_path)
    assert (args.num_generations, args.learning_rate, args.temperature, args.seed) == (4, 2e-5, 0.9, 3)
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 4 * 6  # rollouts per step
    assert (args.beta, args.epsilon, args.num_iterations, args.max_completion_length) == (0.0, 0.2, 1, 96)
    assert args.use_cpu and not args.bf16 and not args.shuffle_dataset
    assert len(settings_mapping(cfg)) >= 15


def test_micro_batch_must_divide_the_step():
    with pytest.raises(ConfigError, match="micro_batch_size"):
        run_trl_bench(["micro_batch_size=5", "arms=[rollwise]"], Console(file=io.StringIO()))


def test_both_arms_train_in_lockstep_from_one_warm_start():
    pytest.importorskip("trl", reason="the compare extra (TRL) is not installed")
    out = run_trl_bench(TINY, Console(file=io.StringIO(), width=200))
    runs = out["seeds"][0]
    for name in ("rollwise", "trl"):
        steps = runs[name]["steps"]
        assert len(steps) == 2 and all(s["loop"] > 0 and s["generate"] > 0 and s["update"] > 0 for s in steps)
        assert [e["step"] for e in runs[name]["evals"]] == [0, 1, 2]
    # one warm start: both arms start from the same weights, so the common evaluator agrees at step 0
    assert runs["rollwise"]["evals"][0]["accuracy"] == runs["trl"]["evals"][0]["accuracy"]
    # strictly one arm at a time, and who goes first alternates: step 1 rollwise then trl, step 2 trl then rollwise
    r, t = runs["rollwise"]["steps"], runs["trl"]["steps"]
    assert r[0]["began"] < t[0]["began"] and r[0]["began"] + r[0]["loop"] <= t[0]["began"]
    assert t[1]["began"] < r[1]["began"] and t[1]["began"] + t[1]["loop"] <= r[1]["began"]
    s = out["summary"]
    assert s["step_ratio"] == pytest.approx(s["trl"]["loop"] / s["rollwise"]["loop"])
