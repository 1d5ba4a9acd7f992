"""``rollwise bench serve``: its arithmetic on fake arms whose seconds, tokens and engine steps are set by
the test (numbers worked out by hand), and a smoke run whose measured counters are checked (speed itself
is never asserted: see DESIGN.md)."""

import io
import json
from types import SimpleNamespace

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
        assert all(len(r[arm]["seconds"]) == 2 for arm in ARMS)  # the arithmetic on them: test_bench_level_by_hand
    # one request in flight: one engine step per token in both arms; in-process, three in flight take
    # two waves of 5 steps (the endpoint's overlap depends on when its clients' requests arrive)
    one, three = res["levels"]["1"], res["levels"]["3"]
    assert one["endpoint"]["engine_steps"] == one["in_process"]["engine_steps"] == 30
    assert three["in_process"]["engine_steps"] == 10 and three["endpoint"]["engine_steps"] <= 30
    json.dumps(res)
    assert "the endpoint vs the in-process engine" in out.getvalue()



class FakeTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids)


def fake_arms(monkeypatch, seconds: dict[str, list[float]], placed: int):
    """Both arms replaced by fakes that take the given seconds (warm-up first) and count their own
    engine steps (endpoint 10, in-process 7 per run); the order they ran in is returned."""
    from rollwise.bench import serve

    calls = []
    queues = {arm: list(s) for arm, s in seconds.items()}
    endpoint_tokens, in_process_ids = [5, 5, 5, 5, 5, 2], [[0, 1, 2, 3, 4]] * 5 + [[0, 1, 3]]

    def endpoint(url, bodies, concurrency):
        calls.append("endpoint")
        engine.stats.steps += 10
        engine.stats.prefill_tokens += placed
        outs = [SimpleNamespace(usage=SimpleNamespace(completion_tokens=n),
                                choices=[SimpleNamespace(message=SimpleNamespace(content="abcde"[:n]))])
                for n in endpoint_tokens]
        return queues["endpoint"].pop(0), outs

    def in_process(engine_, requests, concurrency):
        calls.append("in_process")
        engine.stats.steps += 7
        return queues["in_process"].pop(0), [SimpleNamespace(token_ids=ids) for ids in in_process_ids]

    monkeypatch.setattr(serve, "run_endpoint", endpoint)
    monkeypatch.setattr(serve, "run_in_process", in_process)
    from rollwise.engine.state import SlotEngineStats

    engine = SimpleNamespace(stats=SlotEngineStats(slots=8))
    return engine, calls


def test_bench_level_by_hand(monkeypatch):
    """The table's numbers from fake arms whose seconds, tokens and engine steps are set here, worked
    out by hand: 6 requests, endpoint 2, 3, 6 s, in-process 1, 1.2, 2 s (after warm-ups of 100 s).
    req/s: medians of (3, 2, 1) and (6, 5, 3); tokens 27 (one early EOS at 2) and 28 (one at 3):
    tok/s medians of (13.5, 9, 4.5) and (28, 23.3, 14); paired in-process/endpoint medians of
    (0.5, 0.4, 0.33); overhead per call: median of (1, 1.8, 4) / 6 s; 5 of 6 texts the same."""
    from rollwise.bench.serve import bench_level, load_bench_config

    cfg = load_bench_config(["requests=6", "repeats=3"])
    requests = [SimpleNamespace(prompt_ids=[1, 2, 3, 4])] * 6
    engine, calls = fake_arms(monkeypatch, {"endpoint": [100.0, 2.0, 3.0, 6.0],
                                            "in_process": [100.0, 1.0, 1.2, 2.0]}, placed=24)
    r = bench_level(cfg, engine, SimpleNamespace(url="http://unused"), FakeTokenizer(), [{}] * 6, requests, 1,
                    SimpleNamespace(update=lambda _: None))
    # alternating, so drift in machine load hits both arms
    assert calls == ["endpoint", "in_process", "endpoint", "in_process", "in_process", "endpoint", "endpoint",
                     "in_process"]
    assert r["endpoint"]["seconds"] == [2.0, 3.0, 6.0] and r["in_process"]["seconds"] == [1.0, 1.2, 2.0]
    assert (r["endpoint"]["requests_s"], r["in_process"]["requests_s"]) == pytest.approx((2.0, 5.0))
    assert r["requests_ratio"] == pytest.approx(0.4)
    assert (r["endpoint"]["tokens"], r["in_process"]["tokens"]) == (27, 28)
    assert (r["endpoint"]["tokens_s"], r["in_process"]["tokens_s"]) == pytest.approx((9.0, 70 / 3))
    assert r["tokens_ratio"] == pytest.approx(27 / 70)
    assert r["ratio_paired"] == pytest.approx(0.4) and r["overhead_s_per_call"] == pytest.approx(0.3)
    assert r["same_text"] == pytest.approx(5 / 6) and (r["requests"], r["prompt_tokens"]) == (6, 24)
    # each arm's own counters of one run: not the warm-up's, not the other arm's, not summed over runs
    assert (r["endpoint"]["engine_steps"], r["in_process"]["engine_steps"]) == (10, 7)


def test_bench_level_refuses_arms_with_other_prompts(monkeypatch):
    from rollwise.bench.serve import bench_level, load_bench_config

    cfg = load_bench_config(["requests=6", "repeats=1"])
    engine, _ = fake_arms(monkeypatch, {"endpoint": [1.0, 1.0], "in_process": [1.0, 1.0]}, placed=23)
    with pytest.raises(RuntimeError, match="placed 23 prompt positions, the in-process prompts have 24"):
        bench_level(cfg, engine, SimpleNamespace(url="http://unused"), FakeTokenizer(), [{}] * 6,
                    [SimpleNamespace(prompt_ids=[1, 2, 3, 4])] * 6, 1, SimpleNamespace(update=lambda _: None))


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
