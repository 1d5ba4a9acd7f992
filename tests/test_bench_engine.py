"""Smoke tests of ``rollwise bench engine`` (speed itself is never asserted: see DESIGN.md)."""

import io
import json
import statistics

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rollwise.bench.engine import EngineBenchConfig, load_bench_config, run_engine_bench, workload_lengths
from rollwise.config import ConfigError
from realmodel import require_smollm2

SMALL = ["models=[tiny]", "threads=1", "num_prompts=8", "repeats=1", "min_new_tokens=4", "max_new_tokens=8",
         "long_tail_median=4", "long_tail_share=0.2"]


def test_run_engine_bench_smoke():
    out = io.StringIO()
    res = run_engine_bench(SMALL + ["batch_size=3"], Console(file=out, width=200))
    assert set(res["workloads"]) == {"uniform", "long_tail", "fork"}
    assert res["models"]["tiny"]["workloads"] == res["workloads"] and res["models"]["tiny"]["params"] > 0
    assert res["matmul_flop_s"] > 0 and res["engine"] == "slots"
    for w in res["workloads"].values():
        assert w["rollwise_tok_s"] > 0 and w["hf_tok_s"] > 0
        assert w["ratio"] == pytest.approx(w["rollwise_tok_s"] / w["hf_tok_s"])
        assert w["flop_utilization"] == pytest.approx(
            2 * res["models"]["tiny"]["params"] * w["rollwise_tok_s"] / res["matmul_flop_s"])
        # EOS is off, so the engine keeps exactly the requested tokens, and with continuous
        # batching it computes no row it does not keep; HF's static batches compute more
        stats = w["rollwise_stats"]
        assert stats["decode_tokens"] == stats["padded_decode_slots"] == w["useful_tokens"]
        assert w["hf_computed_tokens"] >= w["useful_tokens"]
    fork = res["workloads"]["fork"]["rollwise_stats"]
    assert fork["prefix_tokens_shared"] > 0 and fork["prefill_tokens"] < fork["prefix_tokens_shared"]
    assert "HF generate" in out.getvalue() and "long_tail" in out.getvalue()


def test_v1_engine_computes_what_hf_computes():
    res = run_engine_bench(SMALL + ["batch_size=3", "workloads=[uniform]", "engine=v1"], Console(file=io.StringIO()))
    w = res["workloads"]["uniform"]
    assert w["rollwise_stats"]["padded_decode_slots"] == w["hf_computed_tokens"]  # the same static batches


def test_long_tail_lengths():
    cfg = EngineBenchConfig()
    lengths = workload_lengths(cfg, "long_tail")
    median = statistics.median(lengths)
    long = [n for n in lengths if n >= 5 * median]
    assert len(long) == round(0.1 * cfg.num_prompts)
    assert all(9 * cfg.long_tail_median <= n <= 11 * cfg.long_tail_median for n in long)  # ~10x the median
    assert workload_lengths(cfg, "fork") != lengths and workload_lengths(cfg, "long_tail") == lengths


def test_bad_override_key_names_it():
    with pytest.raises(ConfigError, match="num_prompt"):
        run_engine_bench(["num_prompt=8"], Console(file=io.StringIO()))


def test_config_errors():
    with pytest.raises(ConfigError, match="min_new_tokens"):
        load_bench_config(["min_new_tokens=9", "max_new_tokens=8"])
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        load_bench_config(["models=[tiny, huge]"])


def test_cli_bench_engine(tmp_path):
    import rollwise.cli

    path = tmp_path / "b.json"
    args = ["bench", "engine", "--json", str(path)]
    for item in SMALL + ["workloads=[long_tail]"]:
        args += ["--set", item]
    result = CliRunner().invoke(rollwise.cli.app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(path.read_text())
    w = data["workloads"]["long_tail"]
    assert set(w) >= {"rollwise_tok_s", "hf_tok_s", "ratio", "flop_utilization"}


def test_cli_bench_engine_bad_key_exits_2(tmp_path):
    import rollwise.cli

    result = CliRunner().invoke(rollwise.cli.app, ["bench", "engine", "--set", "num_prompt=8"])
    assert result.exit_code == 2


def test_real_model_option_runs_chat_prompts_at_each_batch_size(tmp_path):
    """models=[smollm2] on a tiny local Qwen2 chat model standing in for SmolLM2 (model_path)."""
    pytest.importorskip("reasoning_gym", reason="the chat prompts need the reasoning extra")
    from qwen2model import build_qwen2

    from rollwise.bench.chat import chat_prompt_ids

    path = build_qwen2(tmp_path / "chat")
    cfg = load_bench_config(["models=[smollm2]", "workloads=[chat]"])
    assert cfg.batch_sizes == [32, 64] and (cfg.chat_min_new_tokens, cfg.chat_max_new_tokens) == (64, 256)
    assert load_bench_config([]).workloads == ["uniform", "long_tail", "fork"]  # the tiny defaults stay
    res = run_engine_bench(["models=[smollm2]", f"model_path={path}", "threads=1", "num_prompts=4", "repeats=1",
                            "batch_sizes=[2, 4]", "chat_min_new_tokens=4", "chat_max_new_tokens=8"],
                           Console(file=io.StringIO(), width=200))
    assert set(res["workloads"]) == {"chat@2", "chat@4"}
    for w in res["workloads"].values():
        assert w["rollwise_tok_s"] > 0 and w["hf_tok_s"] > 0
        assert w["rollwise_stats"]["decode_tokens"] == w["useful_tokens"]
    assert res["workloads"]["chat@2"]["hf_computed_tokens"] <= res["workloads"]["chat@4"]["hf_computed_tokens"]
    # the prompts went through the chat template
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    ids = chat_prompt_ids(tok, 1)[0]
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n") and "arithmetic problem" in text


@pytest.mark.slow
def test_real_model_option_on_smollm2():
    """models=[smollm2] on SmolLM2-135M-Instruct from the wheel's GGUF, at toy sizes."""
    pytest.importorskip("reasoning_gym", reason="the chat prompts need the reasoning extra")
    require_smollm2()
    res = run_engine_bench(["models=[smollm2]", "threads=1", "num_prompts=4", "repeats=1", "batch_sizes=[4]",
                            "chat_min_new_tokens=8", "chat_max_new_tokens=16"], Console(file=io.StringIO(), width=200))
    w = res["workloads"]["chat@4"]
    assert w["rollwise_tok_s"] > 0 and w["hf_tok_s"] > 0 and res["models"]["smollm2"]["params"] > 100e6
