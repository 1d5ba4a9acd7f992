"""Smoke test of ``rollwise bench rollout`` on tiny settings (speed itself is never asserted)."""

import io
import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rollwise.bench.rollout import run_rollout_bench
from rollwise.cli import app

TINY = ["sft_steps=5", "num_prompts=4", "repeats=2", "train_seeds=[0]", "train_tokens=600", "eval_size=4",
        "april_steps=2", "april_prompts=2", "april_max_new_tokens=48", "max_new_tokens=32", "prompts_per_step=4"]


def test_rollout_bench_reports_every_arm():
    out = io.StringIO()
    res = run_rollout_bench(TINY, Console(file=out, width=200))
    tree, latr, april = res["tree"], res["latr"], res["april"]
    s = tree["sampling"]
    assert tree["tokens_per_leaf_ratio"] == pytest.approx(s["tree"]["tokens_per_leaf"] / s["group"]["tokens_per_leaf"])
    assert s["tree"]["leaves_per_prompt"] == s["group"]["leaves_per_prompt"] == 8  # equal leaves per prompt
    assert s["tree"]["same_tokens_every_run"] and s["group"]["same_tokens_every_run"]  # seeded: runs repeat exactly
    assert latr["sampling"]["latr"]["leaves_per_prompt"] == 8
    assert len(tree["accuracy_group"]) == len(tree["accuracy_tree"]) == 1
    for r in tree["training"]["group"] + tree["training"]["tree"]:
        assert r["generated_tokens"] >= 600 and r["steps"] >= 1  # stopped by the token budget, not before
    assert april["throughput_ratio"] == pytest.approx(
        april["april"]["tokens_per_second"] / april["group"]["tokens_per_second"])
    assert april["group"]["groups"] == 2 * 2 and april["april"]["groups"] >= 2 * 2
    text = out.getvalue()
    assert "tokens per leaf" in text and "equal generated tokens" in text and "long-tail" in text


def test_rollout_bench_cli_json_and_bad_setting(tmp_path):
    runner = CliRunner()
    path = tmp_path / "r.json"
    res = runner.invoke(app, ["bench", "rollout", "--json", str(path), *sum([["--set", s] for s in TINY + ["arms=[april]"]], [])])
    assert res.exit_code == 0, res.output
    assert set(json.loads(path.read_text())) >= {"april", "settings"}
    bad = runner.invoke(app, ["bench", "rollout", "--set", "arms=[forest]"])
    assert bad.exit_code == 2 and "arms" in bad.output
