"""``rollwise bench ablate``: the ledger's arithmetic by hand, and a resumable smoke run."""

import json

import pytest
from typer.testing import CliRunner

from rollwise.bench.ablate import BASELINE, arm_lines, bootstrap_ci, default_arms, load_ablate_config, summarize, verdict
from rollwise.config import ConfigError


def run(arm, seed, acc, curve=None, refused=None):
    if refused:
        return {"task": "arith", "arm": arm, "seed": seed, "refused": refused}
    return {"task": "arith", "arm": arm, "seed": seed, "final_accuracy": acc, "curve": curve or [(0, 0.5), (100, acc)],
            "wall_seconds": 10.0}


def test_bootstrap_and_verdict():
    assert bootstrap_ci([0.1, 0.1, 0.1]) == (0.1, 0.1)
    lo, hi = bootstrap_ci([-0.1, 0.0, 0.1])
    assert lo < 0 < hi and lo >= -0.1 and hi <= 0.1
    assert bootstrap_ci([0.3, -0.2, 0.1]) == bootstrap_ci([0.3, -0.2, 0.1])  # a fixed generator
    assert (verdict(0.01, 0.2), verdict(-0.2, -0.01), verdict(-0.1, 0.1)) == (
        "better", "worse", "no detectable difference")


def test_summary_by_hand():
    runs = [run(BASELINE, s, a) for s, a in [(0, 0.6), (1, 0.7), (2, 0.8)]]
    runs += [run("objective:dapo", s, a + 0.1, curve=[(0, 0.5), (50, a), (100, a + 0.1)])
             for s, a in [(0, 0.6), (1, 0.7), (2, 0.8)]]
    runs += [run("objective:gspo", s, a) for s, a in [(0, 0.5), (1, 0.8), (2, 0.8)]]
    runs += [run("strategy:april", 0, None, refused="ConfigError: no")]
    table = summarize(runs, [BASELINE, "objective:dapo", "objective:gspo", "strategy:april"])
    d = table["objective:dapo"]
    assert d["difference"] == pytest.approx(0.1) and d["ci95"] == [pytest.approx(0.1), pytest.approx(0.1)]
    assert d["verdict"] == "better" and d["tokens_ratio"] == pytest.approx(0.5) and d["reached"] == 3
    g = table["objective:gspo"]
    assert g["difference"] == pytest.approx(0.0) and g["verdict"] == "no detectable difference"
    assert table["strategy:april"] == {"lines": ["rollout.strategy=april"], "refused": "ConfigError: no"}
    assert table[BASELINE]["verdict"] == "baseline"


def test_arms_and_their_lines():
    arms = default_arms()
    assert "objective:decoupled_ppo" in arms and "control:arrol" in arms and "replay:remix" in arms
    assert "objective:grpo" not in arms and "strategy:group" not in arms and "control:none" not in arms
    assert ("objective:dapo" in arms) != ("objective:dapo_clip_higher" in arms)  # one id per preset
    assert arm_lines("control:vade") == ["control.method=vade"]
    assert arm_lines("objective:mc_grpo") == ["objective.method=mc_grpo", "rollout.num_generations=7"]
    with pytest.raises(ConfigError, match="stage:id"):
        load_ablate_config(["arms=[vade]"])


def test_bench_ablate_smoke_resumes(tmp_path):
    from rollwise.cli import app

    out = tmp_path / "ablate"
    args = ["bench", "ablate", "--set", f"out={out}", "--set", "tasks=[arith]", "--set", "arms=[objective:dr_grpo]",
            "--set", "seeds=[0,1]", "--set", "sft_steps=5", "--set", "tokens=600", "--set", "eval_size=8",
            "--set", "prompts_per_step=4", "--set", "num_generations=4", "--set", "arith_max_digits=1",
            "--set", "arith_max_new_tokens=16", "--set", "eval_every=2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 4  # 2 arms x 2 seeds
    ledger = json.loads((out / "ledger.json").read_text())
    row = ledger["tasks"]["arith"]["objective:dr_grpo"]
    assert row["seeds"] == 2 and row["verdict"] in ("better", "worse", "no detectable difference")
    assert "objective:dr_grpo" in (out / "ledger.md").read_text() and "<table>" in (out / "ledger.html").read_text()
    # killed after three runs: only the missing one runs again
    (out / "results.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    again = (out / "results.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in again[:3]] == [json.loads(x) for x in lines[:3]] and len(again) == 4
    assert json.loads(again[-1])["arm"] == json.loads(lines[3])["arm"]
