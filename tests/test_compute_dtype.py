"""The update's compute dtype (``optim.compute_dtype``, issue 34 item 5).

bfloat16 = ``torch.autocast`` around the update's forwards (policy, old, reference): the matmuls
in bf16, the weights, their gradients and the optimizer state in fp32, the log-softmax over the
vocabulary and the loss in fp32. ``auto`` = bf16 only where it is native (the engine's rule).

Tolerances. bf16 keeps 8 bits of mantissa: every rounding moves a number by up to 2^-9 ≈ 0.2%
of itself. On the tiny preset and a fixed 8-row batch, measured here (32 rows: the same): the
gradient under bf16 compute is 0.8% (relative norm of the difference) from fp32's, cosine
1.0000 (rounding the fp32 weights alone to bf16 already moves it 0.5%); the loss and its KL term
0.4%; the trainer's log-probs 1.3e-3 nats/token (mean |Δ|) from fp32's. Bounds: 2e-2 and cosine
0.999 for the gradient, 2e-2 for the loss, 4e-3 for the log-probs — 2.5–5× above what bf16
costs. What a wrong implementation does: a log-softmax in bf16 moves the log-probs 8.6e-3
(fails the 4e-3 bound: ``test_a_bf16_log_softmax_fails_the_bound``); weights kept in bf16 (the
model cast, no fp32 masters) lose most of an update below bf16's resolution of the weights
(``test_bf16_master_weights_would_lose_a_small_step``). The gradient bound alone does not tell
them apart on this model (both ≈ 1%): each failure has its own test. Nothing here times
anything or depends on bit-exact bf16 results.
"""

import copy
from pathlib import Path

import pytest
import torch

import rollwise.model.logprobs as logprobs_module
import rollwise.model.packed as packed_module
from rollwise.bench.update_cost import task_batch
from rollwise.config import ConfigError
from rollwise.model.logprobs import token_logprobs_and_entropy
from rollwise.model.tiny import build_tiny
from rollwise.optim.objective import ObjectiveConfig
from rollwise.optim.update import UpdateSpec, policy_update
from test_precision import trainer_for  # a tiny arith run on the defaults, + the test's settings

SAMPLES = Path(__file__).parent / "fixtures" / "cpuinfo"
GRAD_REL, GRAD_COS, LOGPROB_GAP = 2e-2, 0.999, 4e-3  # the bounds (module docstring)


@pytest.fixture(scope="module")
def fixed():
    """The tiny preset (its own init, as a run starts), a reference 0.05 away from it, and a fixed batch of
    8 arith rollouts whose behaviour log-probs are the model's fp32 ones (an fp32 engine's)."""
    model, tok = build_tiny("tiny", seed=0)
    batch = task_batch(tok, rows=8, group=4)
    with torch.no_grad():
        lp, _ = token_logprobs_and_entropy(model, batch.input_ids, batch.attention_mask, with_entropy=False)
        ref = copy.deepcopy(model)
        gen = torch.Generator().manual_seed(1)
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    batch.behavior_logprobs = lp * batch.completion_mask
    return model, ref, batch


RESULTS = {}  # update()'s results by its arguments: bf16 runs slowly on a CPU without native bf16


def update(fixed, dtype, packed=True, lr=0.0, cast_model=False):
    """One SGD update of a copy of the model (GRPO with a KL term, so the loss depends on the log-probs'
    values); returns (metrics, gradient flattened in fp32, the weights' change flattened in fp32)."""
    key = (id(fixed), dtype, packed, lr, cast_model, packed_module._scored)  # a patched log-softmax runs anew
    if key not in RESULTS:
        model, ref, batch = fixed
        m = copy.deepcopy(model)
        if cast_model:  # the wrong implementation: no fp32 masters
            m.to(torch.bfloat16)
        start = torch.cat([p.detach().float().flatten() for p in m.parameters()])
        spec = UpdateSpec(ObjectiveConfig(method="grpo", beta=0.1), micro_batch_size=8, max_grad_norm=1e9,
                          max_len=96, packed=packed, compute_dtype=dtype, skip_zero_advantage=False)
        metrics = policy_update(m, torch.optim.SGD(m.parameters(), lr=lr), copy.deepcopy(batch), spec, ref)
        change = torch.cat([p.detach().float().flatten() for p in m.parameters()]) - start
        RESULTS[key] = metrics, torch.cat([p.grad.float().flatten() for p in m.parameters()]), change
    return RESULTS[key]


# -- the numbers ---------------------------------------------------------------------------------
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "hf"])
def test_bf16_loss_and_gradients_are_close_to_fp32(fixed, packed):
    m32, g32, _ = update(fixed, torch.float32, packed)
    m16, g16, _ = update(fixed, torch.bfloat16, packed)
    assert m32["mismatch/abs_logprob_diff"] < 1e-5  # fp32: the trainer reproduces the behaviour log-probs
    assert m16["mismatch/abs_logprob_diff"] < LOGPROB_GAP
    assert m16["mismatch/abs_logprob_diff"] > 1e-5  # bf16 really ran (autocast was on)
    rel = float((g16 - g32).norm() / g32.norm())
    cos = float(torch.nn.functional.cosine_similarity(g16, g32, dim=0))
    assert rel < GRAD_REL and cos > GRAD_COS, (rel, cos)
    # the loss: GRPO's surrogate (0 on average at ratio 1) plus β·KL to the reference, in fp32
    assert abs(m16["loss"] - m32["loss"]) < 2e-2 * abs(m32["loss"]) and abs(m32["loss"]) > 1e-4
    assert m16["kl"] == pytest.approx(m32["kl"], rel=2e-2)


def test_the_log_softmax_runs_in_fp32_under_autocast():
    """bf16 logits of a SmolLM2-sized vocabulary: the log-probs are the fp32 log-softmax of those
    logits (upcast first), which a bf16 log-softmax misses by more than 1e-3 nats."""
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 6, 49_152, generator=gen) * 3).to(torch.bfloat16)
    targets = torch.randint(0, 49_152, (2, 6, 1), generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ent = logprobs_module._scored(logits, targets, 1.0, 0, 1.0, True)
    want = logits.float().log_softmax(-1).gather(-1, targets).squeeze(-1)
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    assert torch.allclose(lp, want, atol=1e-5)
    in_bf16 = logits.log_softmax(-1).gather(-1, targets).squeeze(-1).float()
    assert (in_bf16 - want).abs().max() > 1e-3  # what the upcast prevents


def bf16_log_softmax(logits, targets, temperature, top_k, top_p, with_entropy):
    """The wrong implementation: the log-softmax over the vocabulary in bf16."""
    logp_all = (logits.to(torch.bfloat16) / temperature).log_softmax(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1).float().detach() if with_entropy else None
    return logp_all.gather(-1, targets).squeeze(-1).float(), entropy


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "hf"])
def test_a_bf16_log_softmax_fails_the_bound(fixed, packed, monkeypatch):
    monkeypatch.setattr(logprobs_module, "_scored", bf16_log_softmax)
    monkeypatch.setattr(packed_module, "_scored", bf16_log_softmax)
    wrong, _, _ = update(fixed, torch.bfloat16, packed)
    assert wrong["mismatch/abs_logprob_diff"] > LOGPROB_GAP


# -- the weights ---------------------------------------------------------------------------------
def test_master_weights_and_optimizer_state_stay_fp32(fixed):
    model, _, batch = fixed
    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    spec = UpdateSpec(ObjectiveConfig(method="grpo"), micro_batch_size=8, max_len=96, packed=True,
                      compute_dtype=torch.bfloat16)
    policy_update(m, opt, copy.deepcopy(batch), spec)
    moments = [t for s in opt.state.values() for k, t in s.items() if k in ("exp_avg", "exp_avg_sq")]
    assert len(moments) == 2 * len(list(m.parameters()))
    assert all(t.dtype == torch.float32 for t in moments)
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in m.parameters())
    assert any(not torch.equal(p, q) for p, q in zip(m.parameters(), model.parameters()))  # it stepped


def small_step(fixed, dtype, cast_model=False):
    """The change one SGD step makes to the weights, at a learning rate that moves the median weight by
    1e-4 of its size: 20× below bf16's resolution (2^-9 of a number, 2e-3)."""
    _, g32, _ = update(fixed, torch.float32)
    w = torch.cat([p.detach().flatten() for p in fixed[0].parameters()])
    lr = 1e-4 * float(w.abs().median() / g32.abs().median())
    return update(fixed, dtype, lr=lr, cast_model=cast_model)[2]


def test_a_step_below_bf16_resolution_reaches_the_fp32_masters(fixed):
    fp32, bf16 = small_step(fixed, torch.float32), small_step(fixed, torch.bfloat16)
    assert float((bf16 != 0).float().mean()) > 0.9  # (measured 99.9%: every weight with a gradient)
    assert float((bf16 - fp32).norm() / fp32.norm()) < GRAD_REL  # SGD: the step is lr × the gradient


def test_bf16_master_weights_would_lose_a_small_step(fixed):
    """The negative: the same step on a model cast to bf16 (no fp32 masters) mostly rounds away
    (measured: 6% of the weights move, the step 53% off fp32's)."""
    fp32, wrong = small_step(fixed, torch.float32), small_step(fixed, torch.bfloat16, cast_model=True)
    assert float((wrong != 0).float().mean()) < 0.25
    assert float((wrong - fp32).norm() / fp32.norm()) > 0.25


# -- what auto picks -----------------------------------------------------------------------------
def test_auto_computes_in_bf16_only_where_native():
    from rollwise.hardware import cpu_info
    from rollwise.train.precision import choose_update

    model = build_tiny("tiny")[0]
    genoa, avx2 = cpu_info(SAMPLES / "avx512_bf16_genoa.txt"), cpu_info(SAMPLES / "avx2_epyc.txt")
    asked = []
    faster = lambda shapes: asked.append(shapes) or 2.0  # noqa: E731  (the benchmark, stubbed)
    dtype, reason = choose_update("auto", model, avx2, faster)
    assert dtype == torch.float32 and "no native bf16" in reason and not asked  # AVX2-only: not even measured
    dtype, reason = choose_update("auto", model, genoa, faster)
    assert dtype == torch.bfloat16 and "native bf16" in reason and "optim.compute_dtype" not in reason
    assert choose_update("auto", model, genoa, lambda shapes: 1.0)[0] == torch.float32  # native, not faster
    assert choose_update("auto", model, cpu_info(SAMPLES / "avx512_cascade_lake.txt"), faster)[0] == torch.float32
    assert choose_update("bfloat16", model, avx2) == (torch.bfloat16, "optim.compute_dtype=bfloat16")
    assert choose_update("float32", model, genoa, faster) == (torch.float32, "optim.compute_dtype=float32")


@pytest.mark.parametrize("choice", ["auto", "float32", "bfloat16"])
def test_a_policy_loaded_in_bf16_keeps_its_dtype(choice):
    from rollwise.hardware import cpu_info
    from rollwise.train.precision import choose_update

    model = build_tiny("tiny", dtype=torch.bfloat16)[0]
    dtype, reason = choose_update(choice, model, cpu_info(SAMPLES / "avx2_epyc.txt"))
    assert dtype == torch.bfloat16 and "model.dtype" in reason


def test_a_bad_value_names_the_field():
    from rollwise.train.config import load_run_config

    with pytest.raises(ConfigError, match=r"'optim\.compute_dtype'.*'auto', 'float32' or 'bfloat16'"):
        load_run_config(None, ["optim.compute_dtype=float16"])


# -- in a run ------------------------------------------------------------------------------------
def test_auto_on_this_avx2_sample_updates_in_fp32(tmp_path, caplog):
    with caplog.at_level("INFO", logger="rollwise.train.precision"):
        t = trainer_for(tmp_path)  # conftest pins the AVX2 sample
    with t:
        assert t.compute_dtype == torch.float32 and t.update_spec(0).compute_dtype == torch.float32
        summary = t.summary()
        assert summary["compute_dtype"] == "float32" and "no native bf16" in summary["compute_dtype_reason"]
        assert summary["engine_dtype"] == "float32"
    notes = [r.getMessage() for r in caplog.records if "update computes in" in r.getMessage()]
    assert len(notes) == 1 and "float32" in notes[0]


def test_auto_on_a_native_bf16_cpu_updates_in_bf16(tmp_path, monkeypatch):
    import rollwise.hardware

    monkeypatch.setenv("ROLLWISE_CPUINFO", str(SAMPLES / "avx512_bf16_genoa.txt"))
    monkeypatch.setattr(rollwise.hardware, "bf16_speedup", lambda shapes, info=None: 2.0)
    with trainer_for(tmp_path) as t:
        assert t.compute_dtype == torch.bfloat16 and t.update_spec(0).compute_dtype == torch.bfloat16
        assert t.model.dtype == torch.float32  # the masters
        assert t.summary()["compute_dtype"] == "bfloat16"
    with trainer_for(tmp_path, "optim.compute_dtype=float32") as t:
        assert t.compute_dtype == torch.float32


def test_a_short_bf16_run_moves_the_parameters_with_a_finite_loss(tmp_path, warm):
    """From the suite's warm start (its groups come back mixed, so the steps carry gradient)."""
    import json
    import math

    with trainer_for(tmp_path, "name=bf16", "optim.compute_dtype=bfloat16", "train.steps=2", f"model.path={warm}",
                     "sft.steps=0", "rollout.prompts_per_step=4", "rollout.max_new_tokens=24") as t:
        t.prepare()
        before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
        summary = t.fit()
        moved = [n for n, p in t.model.named_parameters() if not torch.equal(p, before[n])]
        assert moved and all(p.dtype == torch.float32 for p in t.model.parameters())
    steps = [json.loads(line) for line in (tmp_path / "bf16" / "metrics.jsonl").read_text().splitlines()]
    losses = [s["loss"] for s in steps if "loss" in s]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
    assert all(s["update/skipped_nonfinite"] == 0 for s in steps if "loss" in s)
    assert summary["compute_dtype"] == "bfloat16" and summary["compute_dtype_reason"] == "optim.compute_dtype=bfloat16"


# -- the bench -----------------------------------------------------------------------------------
def test_bench_update_dtype_arm_measures_each_side_against_its_own_matmul():
    """``rollwise bench update --set arms=[dtype]``: fp32 and bf16 updates of one batch in turn; each
    side's utilisation divides by the matmul peak of its own dtype (speed itself is never asserted)."""
    import io

    from rich.console import Console

    from rollwise.bench.update import run_update_bench

    out = io.StringIO()
    res = run_update_bench(["arms=[dtype]", "dtype_models=[tiny]", "dtype_rows=4", "repeats=2", "matmul_size=128"],
                           Console(file=out, width=200))["dtype"]
    row, peak = res["models"]["tiny"], res["matmul_flop_s"]
    assert set(peak) == {"float32", "bfloat16"} and all(v > 0 for v in peak.values())
    assert row["rows"] == 4 and all(len(row["times"][d]) == 2 for d in ("float32", "bfloat16"))
    for d in ("float32", "bfloat16"):
        assert row[d]["seconds"] == min(row["times"][d][1:])  # the warm-up is not counted
        assert row[d]["flop_utilization"] == row["useful_flops"] / row[d]["seconds"] / peak[d]
    assert row["bf16_speedup"] == row["float32"]["seconds"] / row["bfloat16"]["seconds"]
    assert "fp32 / bf16 time" in out.getvalue()
