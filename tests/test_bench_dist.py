"""``rollwise bench dist``: a smoke run of the command on the session's local Ray cluster."""

import json

import pytest
from typer.testing import CliRunner


@pytest.mark.slow  # ~20 s idle, 100 s on a loaded 2-core machine; tests/test_dist.py checks what the workers compute
def test_bench_dist_smoke(tmp_path, ray_cluster):
    from rollwise.cli import app

    out = tmp_path / "dist.json"
    result = CliRunner().invoke(app, ["bench", "dist", "--json", str(out), "--set", "rounds=2", "--set",
                                      "sft_steps=0", "--set", "prompts_per_step=4", "--set", "num_generations=2",
                                      "--set", "max_new_tokens=8", "--set", "syncs=2", "--set", "sync_presets=[tiny]"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    t = data["throughput"]
    assert t["same_tokens"]  # every arm sampled the same batches with the same seeds
    tokens = {t[arm]["tokens"] for arm in ("in_process", "in_process_all", "workers1", "workers2")}
    assert tokens == {t["in_process"]["tokens"]} and t["in_process"]["tokens"] > 0
    assert t["in_process"]["ratio"] == pytest.approx(1.0)
    assert all(t[arm]["seconds"] > 0 for arm in ("workers1", "workers2"))
    (sync,) = data["weight_sync"]
    assert sync["preset"] == "tiny" and sync["megabytes"] > 1 and sync["load_s"] > 0 and sync["put_s"] > 0
    assert "weight sync per version" in result.output
