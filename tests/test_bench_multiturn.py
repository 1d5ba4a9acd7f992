"""Smoke tests of ``rollwise bench multiturn`` (speed itself is never asserted: see DESIGN.md)."""

import io
import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rollwise.bench.multiturn import ARMS, bench_prompts, load_bench_config, run_multiturn_bench
from rollwise.config import ConfigError

SMALL = ["preset=tiny", "num_prompts=2", "episodes=2", "max_turns=[2, 3]", "turn_tokens=5", "shots=1",
         "repeats=1", "batch_size=4"]


def test_run_multiturn_bench_smoke():
    out = io.StringIO()
    res = run_multiturn_bench(SMALL, Console(file=out, width=220))
    assert set(res["turns"]) == {"2", "3"} and res["params"] > 0 and res["torch_threads"] == 1
    inserted = res["turns"]["2"]["inserted_per_turn"]
    prompt_lens = [len(p.text) + 1 for p in bench_prompts(load_bench_config(SMALL))]  # one id per character, BOS
    assert inserted == len("<result>42</result>")  # the char tokenizer: one id per character
    for turns, r in res["turns"].items():
        kept, naive, t = r["kept"], r["naive"], int(turns)
        assert r["episodes"] == 4 and r["same_completions"]  # the bench raises if the arms' ids differ
        assert 0 < kept["prefill_per_episode"] < naive["prefill_per_episode"]
        assert r["prefill_ratio"] == pytest.approx(naive["prefill_per_episode"] / kept["prefill_per_episode"])
        # every turn samples exactly turn_tokens ids, in both arms
        assert kept["decode_per_episode"] == naive["decode_per_episode"] == t * 5
        # turn k's prompt is the prompt + k turns and results; a kept turn after the first prefills only
        # the last sampled id and the inserted result, and restores the rest from the last turn's cache
        convo = [[p + k * (5 + inserted) for p in prompt_lens] for k in range(t)]  # [turn][prompt]
        restored = sum(n - inserted - 1 for later in convo[1:] for n in later)
        assert kept["stats"]["restored_tokens"] == 2 * restored  # two episodes per prompt
        for arm in (kept, naive):  # every position is computed, copied from a batch-mate, or restored
            s = arm["stats"]
            assert s["prefill_tokens"] + s["prefix_tokens_shared"] + s["restored_tokens"] == 2 * sum(map(sum, convo))
        assert naive["restored_per_episode"] == 0
        assert all(v > 0 for v in (kept["episodes_s"], naive["episodes_s"], r["time_ratio_paired"]))
    # the saving grows with the conversation
    assert res["turns"]["3"]["prefill_ratio"] > res["turns"]["2"]["prefill_ratio"]
    assert "KV kept vs re-prefilled" in out.getvalue()


def test_config_errors():
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        load_bench_config(["preset=huge"])
    with pytest.raises(ConfigError, match=">= 2"):
        load_bench_config(["max_turns=[1, 4]"])
    with pytest.raises(ConfigError, match="turn_token"):
        load_bench_config(["turn_token=3"])
    with pytest.raises(ConfigError, match="over the model's 512"):
        run_multiturn_bench(SMALL + ["max_turns=[8]", "turn_tokens=80"], Console(file=io.StringIO()))


def test_cli_bench_multiturn(tmp_path):
    import rollwise.cli

    path = tmp_path / "b.json"
    args = ["bench", "multiturn", "--json", str(path)]
    for item in SMALL + ["max_turns=[2]"]:
        args += ["--set", item]
    result = CliRunner().invoke(rollwise.cli.app, args)
    assert result.exit_code == 0, result.output
    r = json.loads(path.read_text())["turns"]["2"]
    assert set(r) >= {*ARMS, "prefill_ratio", "time_ratio_paired"}
    assert set(r["kept"]) >= {"episodes_s", "prefill_per_episode", "restored_per_episode"}
