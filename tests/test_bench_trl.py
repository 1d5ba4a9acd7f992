"""``rollwise bench trl``: the workloads, the settings mapping, and the lockstep of the two arms.

Speed is never asserted. The TRL arm needs the ``compare`` extra (``make test`` installs it);
without TRL these tests say so and skip.
"""

import io
import random
from pathlib import Path

import pytest
from rich.console import Console

from rollwise.bench.trl import (TRLBenchConfig, long_working, rollwise_overrides, run_trl_bench, settings_mapping,
                                trl_config)
from rollwise.config import ConfigError
from rollwise.filter.arith import arith_reward
from rollwise.hardware import cpu_info
from realmodel import require_smollm2

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


CPUINFO = Path(__file__).parent / "fixtures" / "cpuinfo"


@pytest.mark.parametrize("sample, precision, bf16", [
    ("avx512_bf16_genoa.txt", "auto", True),  # native bf16: TRL gets bf16=True, as rollwise samples in bf16
    ("amx_sapphire_rapids.txt", "auto", True),
    ("avx2_epyc.txt", "auto", False),  # no native bf16: fp32 for both
    ("avx512_cascade_lake.txt", "auto", False),  # AVX-512 without its BF16 extension
    ("avx2_epyc.txt", "bfloat16", True),  # a bf16 bench: both arms in bf16 wherever it runs
    ("avx512_bf16_genoa.txt", "float32", False),
])
def test_trl_gets_the_precision_rollwise_uses(tmp_path, monkeypatch, sample, precision, bf16):
    pytest.importorskip("trl", reason="the compare extra (TRL) is not installed")
    monkeypatch.setenv("ROLLWISE_CPUINFO", str(CPUINFO / sample))  # the config only: TRL does not run
    cfg = TRLBenchConfig(precision=precision)
    args = trl_config(cfg, seed=0, out_dir=tmp_path)
    assert args.bf16 is bf16 and not args.fp16 and args.use_cpu
    assert trl_config(cfg, 0, tmp_path, info=cpu_info(CPUINFO / sample)).bf16 is bf16  # the argument, likewise
    ours = rollwise_overrides(cfg, 0, tmp_path)
    assert f"rollout.engine_dtype={precision}" in ours and f"optim.compute_dtype={precision}" in ours
    row = dict((name, (ours, theirs)) for name, ours, theirs in settings_mapping(cfg))["device, precision"]
    assert f"rollout.engine_dtype={precision}" in row[0] and f"optim.compute_dtype={precision}" in row[0]
    assert f"bf16={bf16}" in row[1]


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
    # each arm's precision, as it ran (the suite's AVX2 sample: fp32 for both)
    assert runs["rollwise"]["precision"]["engine_dtype"] == runs["rollwise"]["precision"]["update_dtype"] == "float32"
    assert runs["trl"]["precision"]["bf16"] is False
    assert s["rollwise"]["precision"] == runs["rollwise"]["precision"] and s["trl"]["precision"]["dtype"] == "float32"


@pytest.mark.slow
def test_a_bf16_bench_runs_both_arms_in_bf16():
    """precision=bfloat16 on this (AVX2) CPU: slow bf16 everywhere, but both arms run in it and say so."""
    pytest.importorskip("trl", reason="the compare extra (TRL) is not installed")
    console = Console(file=io.StringIO(), width=200)
    out = run_trl_bench([*TINY, "steps=1", "precision=bfloat16"], console)
    runs = out["seeds"][0]
    assert runs["rollwise"]["precision"]["engine_dtype"] == runs["rollwise"]["precision"]["update_dtype"] == "bfloat16"
    assert runs["trl"]["precision"] == {"bf16": True, "dtype": "bfloat16", "mixed_precision": "bf16",
                                        "weights": "float32"}  # autocast over fp32 master weights
    assert "bf16 autocast" in console.file.getvalue() and "engine bf16, update bf16" in console.file.getvalue()


# -- the chat workloads (issue 21): a tiny local Qwen2 chat model stands in for SmolLM2 ---------------

CHAT_TINY = ["steps=2", "eval_every=1", "eval_size=4", "prompts_per_step=2", "num_generations=4",
             "micro_batch_size=8", "max_new_tokens=8"]


def test_chat_workloads_change_the_defaults_and_a_set_wins():
    from rollwise.bench.trl import load_trl_config

    assert load_trl_config([]) == TRLBenchConfig()  # the tiny workloads keep their defaults
    cfg = load_trl_config(["workload=smollm2", "steps=3"])
    assert (cfg.steps, cfg.seeds, cfg.micro_batch_size, cfg.lr, cfg.temperature) == (3, [0], 16, 1e-5, 1.0)
    assert load_trl_config(["workload=smollm2_signal"]).temperature == 0.7
    assert load_trl_config(["workload=smollm2_signal", "temperature=1.0"]).temperature == 1.0


def test_lenient_reward_reads_conversational_completions():
    pytest.importorskip("reasoning_gym", reason="the reasoning extra is not installed")
    from rollwise.bench.chat import lenient_reward

    chat = [[{"role": "assistant", "content": f"8 - 1 = {n}."}] for n in (7, 6)]
    scores = lenient_reward(None, chat, dataset=["chain_sum"] * 2, question=["8 - 1 ="] * 2, metadata=[{}] * 2,
                            answer=["7", "7"])
    assert [float(x) for x in scores] == [1.0, 0.0]


@pytest.mark.parametrize("workload", ["smollm2", "smollm2_signal"])
def test_chat_workload_runs_both_arms_from_the_model_itself(tmp_path, workload):
    pytest.importorskip("trl", reason="the compare extra (TRL) is not installed")
    pytest.importorskip("reasoning_gym", reason="the reasoning extra is not installed")
    from qwen2model import build_qwen2

    model = build_qwen2(tmp_path / "chat")
    out = run_trl_bench([f"workload={workload}", f"model_path={model}", *CHAT_TINY], Console(file=io.StringIO(), width=200))
    runs = out["seeds"][0]
    for name in ("rollwise", "trl"):
        assert len(runs[name]["steps"]) == 2 and all(s["generate"] > 0 and 0 <= s["zero_signal"] <= 1
                                                      for s in runs[name]["steps"])
    # no warm start: both arms are the model itself, judged alike by the common evaluator at step 0
    assert runs["rollwise"]["evals"][0]["accuracy"] == runs["trl"]["evals"][0]["accuracy"]
    assert out["mapping"][0][0] == "model" and "chat template" in out["mapping"][1][1]
    assert set(out["summary"]["phase_ratio"]) == {"generate", "update"}


@pytest.mark.slow
def test_smollm2_signal_workload_on_the_real_model():
    """One lockstep step of each arm on SmolLM2-135M-Instruct from the wheel's GGUF (minutes, not seconds)."""
    pytest.importorskip("trl", reason="the compare extra (TRL) is not installed")
    pytest.importorskip("reasoning_gym", reason="the reasoning extra is not installed")
    require_smollm2()
    sets = ["workload=smollm2_signal", "steps=1", "eval_every=1", "eval_size=2", "prompts_per_step=2",
            "num_generations=2", "micro_batch_size=4", "max_new_tokens=16"]
    out = run_trl_bench(sets, Console(file=io.StringIO(), width=200))
    runs = out["seeds"][0]
    assert all(len(runs[name]["steps"]) == 1 for name in ("rollwise", "trl"))
    assert runs["rollwise"]["evals"][0]["accuracy"] == runs["trl"]["evals"][0]["accuracy"]
