"""Smoke tests of ``rollwise bench engine`` (speed itself is never asserted: see DESIGN.md)."""

import io
import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rollwise.bench.engine import run_engine_bench
from rollwise.config import ConfigError

SMALL = ["num_prompts=8", "repeats=1", "min_new_tokens=4", "max_new_tokens=8"]


def test_run_engine_bench_smoke():
    out = io.StringIO()
    res = run_engine_bench(SMALL + ["batch_size=3"], Console(file=out, width=200))
    for key in ("model", "params", "num_prompts", "batch_size", "rollwise_tok_s", "hf_tok_s", "ratio", "ratio_paired",
                "rollwise_stats", "settings", "useful_tokens"):
        assert key in res
    assert res["model"] == "tiny" and res["num_prompts"] == 8 and res["batch_size"] == 3
    assert res["params"] > 0
    assert res["rollwise_tok_s"] > 0 and res["hf_tok_s"] > 0
    assert res["ratio"] == pytest.approx(res["rollwise_tok_s"] / res["hf_tok_s"])
    assert 8 * 4 <= res["useful_tokens"] <= 8 * 8
    # EOS is off, so the engine keeps exactly the requested tokens; with the same static
    # batches, it computes the same decode rows as HF
    assert res["rollwise_stats"]["decode_tokens"] == res["useful_tokens"]
    assert res["rollwise_stats"]["padded_decode_slots"] == res["hf_computed_tokens"]
    assert res["settings"]["min_new_tokens"] == 4 and res["settings"]["max_new_tokens"] == 8
    assert "hf generate" in out.getvalue()


def test_bad_override_key_names_it():
    with pytest.raises(ConfigError, match="num_prompt"):
        run_engine_bench(["num_prompt=8"], Console(file=io.StringIO()))


def test_min_above_max_is_a_config_error():
    with pytest.raises(ConfigError, match="min_new_tokens"):
        run_engine_bench(["min_new_tokens=9", "max_new_tokens=8"], Console(file=io.StringIO()))


def test_cli_bench_engine(tmp_path):
    import rollwise.cli

    path = tmp_path / "b.json"
    args = ["bench", "engine", "--json", str(path)]
    for item in SMALL:
        args += ["--set", item]
    result = CliRunner().invoke(rollwise.cli.app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(path.read_text())
    assert data["rollwise_tok_s"] > 0 and data["hf_tok_s"] > 0


def test_cli_bench_engine_bad_key_exits_2(tmp_path):
    import rollwise.cli

    result = CliRunner().invoke(rollwise.cli.app, ["bench", "engine", "--set", "num_prompt=8"])
    assert result.exit_code == 2
