"""Smoke tests of ``rollwise bench serve`` (speed itself is never asserted: see DESIGN.md)."""

import io
import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

pytest.importorskip("openai", reason="the serve extra is not installed: pip install 'rollwise[serve]'")

from rollwise.bench.serve import ARMS, load_bench_config, run_in_process, run_serve_bench  # noqa: E402
from rollwise.config import ConfigError  # noqa: E402

SMALL = ["concurrency=[1, 3]", "requests=6", "max_tokens=5", "repeats=2", "batch_size=4"]


def test_run_serve_bench_smoke():
    out = io.StringIO()
    res = run_serve_bench(SMALL, Console(file=out, width=220))
    assert set(res["levels"]) == {"1", "3"} and res["params"] > 0 and res["torch_threads"] == 1
    for c, r in res["levels"].items():
        assert r["requests"] == 6 and r["prompt_tokens"] > 6
        # same prompts and seeds: both arms sampled the same tokens (these seeds: no early EOS)
        assert r["endpoint"]["tokens"] == r["in_process"]["tokens"] == 6 * 5 and r["same_text"] == 1.0
        for arm in ARMS:
            assert len(r[arm]["seconds"]) == 2 and r[arm]["requests_s"] > 0
            assert r[arm]["tokens_s"] == pytest.approx(5 * r[arm]["requests_s"])
        assert r["requests_ratio"] == pytest.approx(r["endpoint"]["requests_s"] / r["in_process"]["requests_s"])
        assert r["tokens_ratio"] == pytest.approx(r["requests_ratio"])
    # one request in flight: one engine step per token in both arms; in-process, three in flight take
    # two waves of 5 steps (the endpoint's overlap depends on when its clients' requests arrive)
    one, three = res["levels"]["1"], res["levels"]["3"]
    assert one["endpoint"]["engine_steps"] == one["in_process"]["engine_steps"] == 30
    assert three["in_process"]["engine_steps"] == 10 and three["endpoint"]["engine_steps"] <= 30
    assert res["http_overhead_ms_per_call"] == pytest.approx(one["overhead_s_per_call"] * 1e3)
    json.dumps(res)
    assert "the endpoint vs the in-process engine" in out.getvalue()


def test_in_process_keeps_the_same_number_in_flight():
    from rollwise.engine.engine import Request
    from rollwise.engine.sampling import SamplingParams
    from rollwise.engine.slots import SlotEngine
    from rollwise.model.tiny import build_tiny

    model, tok = build_tiny("tiny", seed=0)
    engine = SlotEngine(model.eval(), pad_token_id=tok.pad_token_id, max_batch_size=8)
    lengths = [3, 9, 2, 5, 4, 7, 1]
    requests = [Request(tok(f"q{i}")["input_ids"], SamplingParams(max_new_tokens=n, seed=i))
                for i, n in enumerate(lengths)]
    _, done = run_in_process(engine, requests, 3)
    assert [len(c.token_ids) for c in done] == lengths  # request order
    assert max(engine.stats.rows_per_step) == 3 and engine.stats.decode_tokens == sum(lengths)


def test_config_errors():
    with pytest.raises(ConfigError, match="unknown model 'huge'"):
        load_bench_config(["model=huge"])
    with pytest.raises(ConfigError, match=">= 1"):
        load_bench_config(["concurrency=[0, 4]"])
    with pytest.raises(ConfigError, match="concurency"):
        load_bench_config(["concurency=[1]"])


def test_cli_bench_serve(tmp_path):
    from rollwise.cli import app

    path = tmp_path / "b.json"
    result = CliRunner().invoke(app, ["bench", "serve", "--json", str(path), *sum((["--set", s] for s in
                                      ["concurrency=[2]", "requests=2", "max_tokens=2", "repeats=1"]), [])])
    assert result.exit_code == 0, result.output
    assert set(json.loads(path.read_text())["levels"]) == {"2"}
