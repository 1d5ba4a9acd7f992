"""``rollwise bench precision``: its measures by hand, its schemes, and the command (speed is never asserted)."""

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from rollwise.bench.precision import (
    build_forward, compare, load_bench_config, summarize, teacher_logits, token_kl, verdict,
)
from rollwise.bench.quantize import map_weights, qdq_q8_0, qdq_rows, round_half_away
from rollwise.config import ConfigError
from rollwise.engine.llama import LlamaForward
from rollwise.model.tiny import build_tiny


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_tiny("tiny", seed=0)
    return model.eval(), tok


def _seqs(n: int = 5) -> list[tuple[list[int], list[int]]]:
    gen = torch.Generator().manual_seed(1)
    ids = lambda k: torch.randint(3, 90, (k,), generator=gen).tolist()  # noqa: E731
    return [(ids(3 + i), ids(2 + 2 * i)) for i in range(n)]  # prompts and completions of different lengths


def test_kl_on_a_three_token_vocabulary_by_hand():
    p = torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64)
    q = torch.tensor([[0.25, 0.5, 0.25]], dtype=torch.float64)
    # KL(p‖q) = .5 ln(.5/.25) + .25 ln(.25/.5) + .25 ln 1 = .25 ln 2; logits are log-probs up to a constant
    assert token_kl(p.log(), q.log() + 3.0).item() == pytest.approx(0.25 * math.log(2), abs=1e-12)
    assert token_kl(q.log(), p.log()).item() == pytest.approx(0.5 * math.log(2) - 0.25 * math.log(2), abs=1e-12)
    assert token_kl(p.log(), p.log() - 7.0).item() == pytest.approx(0.0, abs=1e-15)
    s = summarize(torch.tensor([0.0, 0.1, 0.2, 0.3]), torch.tensor([True, True, False, True]))
    assert s["kl_mean"] == pytest.approx(0.15) and s["top1"] == 0.75 and s["tokens"] == 4


def test_q8_0_of_a_hand_tensor():
    """Two blocks of 32, as ggml's quantize_row_q8_0_ref: d = absmax/127 stored as fp16, q = roundf(x/d)
    (ties away from zero), x̂ = q·fp16(d)."""
    a = torch.zeros(32)
    # absmax 7.9375 = 127/16: d = 1/16 exactly (fp16 too); 0.03125 = d/2 and 0.15625 = 2.5·d are ties
    a[:4] = torch.tensor([7.9375, 0.03125, -0.09375, 0.15625])
    b = torch.zeros(32)
    # absmax 1: d = 1/127 → fp16 0.00787353515625 (= 2^-7·(1 + 8/1024)); 0.25·127 = 31.75 → 32, -0.75·127 → -95
    b[:3] = torch.tensor([1.0, 0.25, -0.75])
    got = qdq_q8_0(torch.cat([a, b])[None])[0]
    want_a = torch.zeros(32)
    want_a[:4] = torch.tensor([127, 1, -2, 3]) / 16  # the ties went away from zero: 0.5 → 1, 2.5 → 3
    want_b = torch.zeros(32)
    want_b[:3] = torch.tensor([127, 32, -95]) * 0.00787353515625
    assert torch.equal(got, torch.cat([want_a, want_b]))
    assert torch.equal(qdq_q8_0(torch.zeros(2, 32)), torch.zeros(2, 32))  # an all-zero block: scale 0, no NaN
    assert round_half_away(torch.tensor([0.5, -2.5, 2.4])).tolist() == [1.0, -3.0, 2.0]
    with pytest.raises(ValueError, match="multiple of 32"):
        qdq_q8_0(torch.zeros(1, 40))


def test_int8_per_row_by_hand():
    w = torch.tensor([[127 / 64, -63.5 / 64, 0.0], [0.0, 0.0, 0.0]])
    # row 0: scale 1/64, q = [127, -64 (-63.5 ties to even), 0]; an all-zero row stays zero
    assert torch.equal(qdq_rows(w), torch.tensor([[127 / 64, -1.0, 0.0], [0.0, 0.0, 0.0]]))


def test_fp32_against_itself_is_zero_and_agrees(tiny):
    model, _ = tiny
    res = compare({"fp32": build_forward(model, "fp32"), "again": build_forward(model, "fp32")}, _seqs(), 2)
    for name in ("fp32", "again"):
        assert res[name]["kl_mean"] == 0.0 and res[name]["kl_max"] == 0.0 and res[name]["top1"] == 1.0
    assert res["fp32"]["tokens"] == sum(len(c) for _, c in _seqs())  # every completion position, batches of 2


def test_identity_scheme_is_zero_and_a_perturbed_weight_is_not(tiny):
    model, _ = tiny
    identity, perturbed = LlamaForward(model), LlamaForward(model)
    map_weights(identity, lambda w, b: w.clone(), lambda w: w.clone())
    gen = torch.Generator().manual_seed(0)
    map_weights(perturbed, lambda w, b: w + 0.05 * torch.randn(w.shape, generator=gen))
    res = compare({"fp32": LlamaForward(model), "identity": identity, "perturbed": perturbed}, _seqs(), 8)
    assert res["identity"]["kl_mean"] == 0.0 and res["identity"]["top1"] == 1.0
    assert res["perturbed"]["kl_mean"] > 1e-6
    for name in ("bf16", "int8_row", "q8_0", "fbgemm_int8"):  # every scheme changes the distribution, a little
        assert compare({"fp32": LlamaForward(model), name: build_forward(model, name)}, _seqs(), 8)[name]["kl_mean"] > 0
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the policy itself was never written


def test_teacher_forcing_reproduces_the_engines_own_logprobs(tiny):
    """The fp32 engine's behaviour log-probs (temperature 1) are the teacher-forced log-softmax at the
    tokens it sampled: the bench scores the positions the engine sampled, aligned."""
    from rollwise.engine.engine import Request
    from rollwise.engine.sampling import SamplingParams
    from rollwise.engine.slots import SlotEngine

    model, tok = tiny
    prompts = [[5, 6, 7, 8, 9] + p for p, _ in _seqs(3)]  # a shared prefix: prefilled once, copied to every row
    engine = SlotEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=4, seed=0)
    with torch.no_grad():
        outs = engine.generate([Request(p, SamplingParams(max_new_tokens=6)) for p in prompts])
        seqs = [(p, o.token_ids) for p, o in zip(prompts, outs)]
        forced = [[] for _ in seqs]
        for t, (logits, rows) in enumerate(teacher_logits(LlamaForward(model), seqs)):
            for i in torch.nonzero(rows).flatten().tolist():
                forced[i].append(torch.log_softmax(logits[i], -1)[seqs[i][1][t]].item())
    for o, f in zip(outs, forced):
        assert f == pytest.approx(o.logprobs, abs=1e-5)


def test_verdict_needs_both_speed_and_closeness():
    def scheme(kind, kl, vs_fp32):
        return {"kind": kind, "sampled": {"kl_mean": kl}, "speed": None if vs_fp32 is None else {"vs_fp32": vs_fp32}}

    base = {"fp32": scheme("reference", 0.0, 1.0), "bf16": scheme("engine copy", 0.001, 1.6),
            "q8_0": scheme("probe", 0.004, None)}
    fast_far = {**base, "dyn": scheme("kernel", 1.4, 2.1)}
    v = verdict(fast_far, {"lib": "not installed"})
    assert v["int8_engine"] is False and v["fastest_reference"] == "bf16"
    assert any("dyn" in line and "over 0.01" in line for line in v["lines"])
    assert any(line.startswith("lib: not measured") for line in v["lines"])
    assert verdict({**base, "ok": scheme("kernel", 0.004, 1.2)}, {})["int8_engine"] is False  # slower than bf16
    assert verdict({**base, "ok": scheme("kernel", 0.004, 1.7)}, {})["kernels_that_qualify"] == ["ok"]


def test_config_errors():
    with pytest.raises(ConfigError, match="model.dtype"):
        load_bench_config(["model.dtype=bfloat16"])
    with pytest.raises(ConfigError, match="scheme"):
        load_bench_config(["schemes=[int4]"])
    assert load_bench_config(["schemes=[bf16]"]).schemes == ["fp32", "bf16"]  # the reference is always measured


def test_cli_writes_json_with_the_cpu(tmp_path):
    import rollwise.cli

    path = tmp_path / "p.json"
    args = ["bench", "precision", "--json", str(path)]
    for item in ["num_prompts=3", "max_new_tokens=4", "speed_prompts=2", "speed_new_tokens=2", "repeats=1",
                 "schemes=[fp32, bf16, q8_0, fbgemm_int8]"]:
        args += ["--set", item]
    result = CliRunner().invoke(rollwise.cli.app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(path.read_text())
    assert {"model", "cores", "flags", "native_bf16", "torch"} <= set(data["cpu"])
    assert data["torch"] == torch.__version__ and data["torch_threads"] == 1
    assert set(data["schemes"]) == {"fp32", "bf16", "q8_0", "fbgemm_int8"}
    assert data["schemes"]["fp32"]["sampled"]["kl_mean"] == 0.0 and data["schemes"]["q8_0"]["speed"] is None
    assert data["schemes"]["bf16"]["speed"]["tokens"] == 4 and data["tokens"]["fixed"] > 0
    assert data["verdict"]["int8_engine"] in (True, False) and "int8 verdict" in result.output


def test_cli_bad_key_exits_2():
    import rollwise.cli

    assert CliRunner().invoke(rollwise.cli.app, ["bench", "precision", "--set", "num_prompt=3"]).exit_code == 2


@pytest.mark.slow
def test_smollm2_int8_fails_by_its_scheme_not_by_being_int8():
    """Issue 34 on the real model: per-tensor dynamic int8 (fbgemm) is far from fp32, weight-only
    per-row int8 and Q8_0 blocks are close (the docs' figures are 1.4 and ~0.004 nats/token)."""
    from realmodel import require_smollm2
    from rich.console import Console

    from rollwise.bench.chat import SMOLLM2
    from rollwise.bench.precision import run_precision_bench

    require_smollm2()
    pytest.importorskip("reasoning_gym", reason="the chat prompts need the reasoning extra")
    res = run_precision_bench([f"model.path={SMOLLM2}", "num_prompts=4", "max_new_tokens=24", "speed=false",
                               "schemes=[int8_row, q8_0, fbgemm_int8]"], Console(file=None, quiet=True))
    kl = {name: s["sampled"]["kl_mean"] for name, s in res["schemes"].items()}
    assert kl["int8_row"] < 0.05 and kl["q8_0"] < 0.05 and kl["fbgemm_int8"] > 0.2, kl
    assert res["verdict"]["int8_engine"] is None  # no speed measured: no verdict
