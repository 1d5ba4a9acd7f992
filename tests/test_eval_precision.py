"""``rollwise eval`` and ``rollwise serve`` sample in the precision ``rollout.engine_dtype`` chooses
(``train/precision.py`` ``choose``), as training does: eval through ``rollout.engine_dtype``, serve
through ``--engine-dtype``; the choice and its reason are in eval's JSON and serve's startup line.
The CPU is the suite's pinned AVX2 sample (conftest), so ``auto`` is fp32."""

import json
import types

import pytest
import torch
from typer.testing import CliRunner

from rollwise.cli import app

TASK = ["task.max_digits=2", "task.eval_size=2", "train.eval_samples=0", "model.threads=1",
        "rollout.max_new_tokens=4"]


@pytest.fixture
def engines(monkeypatch):
    """Every engine the trainer builds (``rollwise eval`` evaluates with the trainer's engine)."""
    import rollwise.train.loop as loop

    built = []

    def spy(*args, **kwargs):
        built.append(real(*args, **kwargs))
        return built[-1]

    real = loop.make_engine
    monkeypatch.setattr(loop, "make_engine", spy)
    return built


def run_eval(tmp_path, *sets):
    out = tmp_path / "eval.json"
    args = ["eval", *[x for s in (f"output_dir={tmp_path}", *TASK, *sets) for x in ("--set", s)], "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text()), result.output


def test_eval_samples_in_bf16_when_the_recipe_says_so(tmp_path, engines):
    record, output = run_eval(tmp_path, "rollout.engine_dtype=bfloat16")
    assert [e.dtype for e in engines] == [torch.bfloat16]
    assert record["engine_dtype"] == "bfloat16" and record["engine_dtype_reason"] == "rollout.engine_dtype=bfloat16"
    assert "eval/accuracy" in record and '"engine_dtype": "bfloat16"' in output


def test_eval_auto_on_an_avx2_cpu_stays_fp32(tmp_path, engines):
    record, _ = run_eval(tmp_path)  # rollout.engine_dtype defaults to auto
    assert [e.dtype for e in engines] == [torch.float32]
    assert record["engine_dtype"] == "float32" and "no native bf16" in record["engine_dtype_reason"]


@pytest.fixture
def served(monkeypatch):
    """What ``rollwise serve`` hands the server (the server itself is not started)."""
    pytest.importorskip("fastapi")
    seen = {}

    def fake_serve_engine(engine, tok, fmt, model_name, **kw):
        seen["engine"] = engine
        return types.SimpleNamespace(url="http://127.0.0.1:0", drive=lambda stop: None, close=lambda: None)

    monkeypatch.setattr("rollwise.serve.serve_engine", fake_serve_engine)
    return seen


@pytest.mark.parametrize("args, dtype, reason", [
    (["--engine-dtype", "bfloat16"], torch.bfloat16, "--engine-dtype bfloat16"),
    (["--engine-dtype", "float32"], torch.float32, "--engine-dtype float32"),
    ([], torch.float32, "no native bf16"),  # auto on the AVX2 sample
])
def test_serve_samples_in_the_chosen_precision(served, args, dtype, reason):
    result = CliRunner().invoke(app, ["serve", "tiny", *args])
    assert result.exit_code == 0, result.output
    assert served["engine"].dtype == dtype
    text = " ".join(result.output.split())
    assert f"engine {str(dtype).removeprefix('torch.')}" in text and reason in text


def test_serve_refuses_an_unknown_precision(served):
    result = CliRunner().invoke(app, ["serve", "tiny", "--engine-dtype", "float16"])
    assert result.exit_code == 2 and "engine" not in served
