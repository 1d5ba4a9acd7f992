"""Smoke test of ``rollwise bench update`` on tiny settings (speed itself is never asserted)."""

import io

import pytest
import torch
from rich.console import Console

from rollwise.bench.update import run_update_bench
from realmodel import require_smollm2

TASK = ("task.max_digits=1,task.eval_size=20,rollout.prompts_per_step=8,rollout.num_generations=4,"
        "rollout.max_new_tokens=24,train.eval_size=4,train.eval_samples=0")
TINY = ["arms=[skip]", "recipe=null", "steps=2", f"overrides=[sft.steps=150,sft.batch_size=32,{TASK}]"]


def test_update_bench_runs_both_arms_on_the_same_data(warm):
    out = io.StringIO()
    # the bench's warm start is the suite's (conftest.py, built once per run) rather than an SFT of its own
    res = run_update_bench([*TINY[:3], f"overrides=[model.path={warm},sft.steps=0,{TASK}]"], Console(file=out, width=200))
    skip, no_skip = res["skip"]["true"], res["skip"]["false"]
    assert no_skip["update/skipped_rows"] == 0
    # the skip arm skipped exactly the rows of its zero-signal groups (flat groups of equal size)
    assert skip["update/skipped_rows"] == skip["groups/zero_signal"]
    assert 0 < skip["groups/zero_signal"] < 1  # a mixed batch: some rows trained, some skipped
    assert skip["reward/mean"] == no_skip["reward/mean"]  # same warm start and seed: the same first rollouts
    assert res["skip"]["max_loss_difference"] < 1e-5
    assert "update time ratio" in out.getvalue()


@pytest.mark.slow  # 20-25 s each; the default suite keeps test_update_bench_runs_both_arms_on_the_same_data
def test_update_bench_forward_arm_trains_the_same_with_both_forwards():
    res = run_update_bench([*TINY[1:], "arms=[forward]"], Console(file=io.StringIO(), width=200))["forward"]
    packed, hf = res["packed"], res["hf"]
    assert res["setting"] == "optim.forward" and packed["reward/mean"] == hf["reward/mean"]
    assert 0 < packed["update/skipped_rows"] == hf["update/skipped_rows"] < 1
    assert res["max_loss_difference"] < 1e-5


def test_update_bench_throughput_counts_only_real_tokens():
    from rollwise.bench.update_cost import task_batch, update_flops
    from rollwise.model.tiny import build_tiny

    model, tok = build_tiny("tiny")
    batch = task_batch(tok, rows=16, group=4)
    real, padded = int(batch.attention_mask.sum()), batch.attention_mask.numel()
    assert real < padded  # the lengths differ: the padded path does work that is not counted
    assert (batch.advantages.abs().sum(-1) > 0).all()  # every row carries signal: none is skipped
    vocab, hidden = model.lm_head.weight.shape
    decoder = sum(p.numel() for p in model.parameters()) - vocab * hidden  # tied: embedding = head
    assert update_flops(model, batch) == 6.0 * (decoder * real + vocab * hidden * float(batch.completion_mask.sum()))
    res = run_update_bench(["arms=[throughput]", "presets=[tiny]", "repeats=2"],
                           Console(file=io.StringIO(), width=200))["throughput"]
    row = res["presets"]["tiny"]
    assert row["real_tokens"] < row["padded_tokens"] and row["packed"]["seconds"] > 0 and row["hf"]["seconds"] > 0
    for forward in ("packed", "hf"):  # useful FLOP/s above the measured matmul peak: a miscount
        assert 0 < row[forward]["flop_utilization"] <= 1
        assert row[forward]["seconds"] <= row[forward]["median_seconds"]  # the fastest run, not the first


@pytest.mark.slow  # 20-25 s each; the default suite keeps test_update_bench_runs_both_arms_on_the_same_data
def test_update_bench_memory_arm_runs_both_settings_in_fresh_processes():
    res = run_update_bench(["arms=[memory]", "vocab=3000", "hidden=16", "rows=2", "width=12", "budget_mb=0.05"],
                           Console(file=io.StringIO(), width=200))
    whole, chunked, packed = (res["memory"][k] for k in ("whole", "chunked", "chunked_packed"))
    assert whole["budget_mb"] is None and chunked["budget_mb"] == 0.05
    assert whole["params"] == chunked["params"] > 3000 * 16  # the same model in both processes
    for m in (whole, chunked, packed):
        assert m["peak_mb"] >= m["before_mb"] > 0, m
    assert packed["packed"] and not chunked["packed"] and packed["params"] == whole["params"]


def test_update_bench_shared_arm_computes_each_prompt_once():
    from rollwise.bench.update_cost import chat_batch

    batch = chat_batch(50, rows=10, group=4, prompt=6, completion=4)
    prompts = batch.input_ids[:, :6]
    assert (prompts[:4] == prompts[0]).all() and (prompts[8:] == prompts[8]).all()
    assert not torch.equal(prompts[0], prompts[4])
    assert (batch.completion_mask.sum(-1) >= 2).all() and (batch.completion_mask[:, :5] == 0).all()
    settings = ["arms=[shared]", "presets=[tiny]", "repeats=2", "shared_rows=16", "shared_group=4", "shared_prompt=20",
                "shared_completion=6"]
    res = run_update_bench(settings, Console(file=io.StringIO(), width=200))["shared"]
    row = res["presets"]["tiny"]
    assert row["computed_tokens_on"] == row["real_tokens"] - 4 * 3 * 20  # 4 groups, 3 rows each spared the prompt
    assert row["on"]["seconds"] > 0 and row["time_ratio"] == row["on"]["seconds"] / row["off"]["seconds"]


@pytest.mark.slow  # 20-25 s each; the default suite keeps test_update_bench_runs_both_arms_on_the_same_data
def test_update_bench_real_arm_full_vs_lora_in_fresh_processes(tmp_path):
    """arms=[real] on a tiny local Qwen2 chat model standing in for SmolLM2 (model_path)."""
    pytest.importorskip("peft", reason="the lora extra is not installed")
    pytest.importorskip("reasoning_gym", reason="the chat prompts need the reasoning extra")
    from qwen2model import build_qwen2

    path = build_qwen2(tmp_path / "chat")
    settings = ["arms=[real]", f"model_path={path}", "real_prompts=2", "real_group=2", "real_max_new_tokens=6",
                "real_micro_batch=2", "real_repeats=2"]
    res = run_update_bench(settings, Console(file=io.StringIO(), width=200))["real"]
    full, lora = res["arms"]["full"], res["arms"]["lora"]
    assert res["rows"] == 4 and res["scored_tokens"] > 0 and res["prompt_tokens"] > 0
    assert full["params"] == full["trained_params"] and 0 < lora["trained_params"] < full["trained_params"]
    for a in (full, lora):
        assert a["peak_mb"] >= a["loaded_mb"] > 0 and len(a["times"]) == 2 and a["seconds"] == a["times"][1]
        assert a["flop_utilization"] == a["useful_flops"] / a["seconds"] / res["matmul_flop_s"]
        assert a["computed_tokens"] <= res["real_tokens"]  # the shared prompts are computed once
    assert full["computed_tokens"] == lora["computed_tokens"]  # the same batch in both processes


def test_trained_flops_counts_weight_gradients_of_trained_parameters_only():
    from rollwise.bench.update_cost import task_batch, update_flops
    from rollwise.bench.update_real import trained_flops
    from rollwise.model.tiny import build_tiny

    model, tok = build_tiny("tiny")
    batch = task_batch(tok, rows=8, group=4)
    real = float(batch.attention_mask.sum())
    assert trained_flops(model, batch, real) == update_flops(model, batch)  # full fine-tuning: 6x
    for p in model.parameters():
        p.requires_grad_(False)
    assert trained_flops(model, batch, real) == update_flops(model, batch) * 4 / 6  # nothing trained: 4x


@pytest.mark.slow
def test_update_bench_real_arm_on_smollm2():
    """arms=[real] on SmolLM2-135M-Instruct from the wheel's GGUF, at toy sizes."""
    pytest.importorskip("peft", reason="the lora extra is not installed")
    pytest.importorskip("reasoning_gym", reason="the chat prompts need the reasoning extra")
    require_smollm2()
    res = run_update_bench(["arms=[real]", "real_prompts=2", "real_group=2", "real_max_new_tokens=8",
                            "real_micro_batch=4", "real_repeats=2"], Console(file=io.StringIO(), width=200))["real"]
    full, lora = res["arms"]["full"], res["arms"]["lora"]
    assert full["trained_params"] > 100e6 > lora["trained_params"] > 0
    assert full["peak_mb"] > lora["peak_mb"]  # AdamW state and gradients of 135M parameters
