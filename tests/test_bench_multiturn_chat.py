"""``rollwise bench multiturn`` on a model with a chat template (``model=``): the episodes go through
the template with the ``hermes`` format, as a SmolLM2 agent's do (speed itself is never asserted)."""

import io

import pytest
from rich.console import Console

from rollwise.bench.multiturn import load_bench_config, run_multiturn_bench
from rollwise.config import ConfigError


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    """A small Qwen2 model with a ChatML template that ignores `tools`, as SmolLM2's does, and room for
    the tools' system message (~560 ids in its small vocabulary: JSON is mostly single bytes)."""
    import json

    from qwen2model import build_qwen2

    path = build_qwen2(tmp_path_factory.mktemp("qwen2") / "model")
    config = path / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"max_position_embeddings": 2048}))
    return path


def small(chat_dir, *extra):
    return [f"model={chat_dir}", "num_prompts=2", "episodes=2", "max_turns=[2, 3]", "turn_tokens=5", "shots=0",
            "repeats=1", "batch_size=4", *extra]


def test_hermes_episodes_through_the_chat_template(chat_dir):
    from transformers import AutoTokenizer

    from rollwise.generate.conversation import chat_suffix_ids

    tok = AutoTokenizer.from_pretrained(chat_dir)
    out = io.StringIO()
    res = run_multiturn_bench(small(chat_dir), Console(file=out, width=220))
    assert res["tool_format"] == "hermes" and res["model"] == str(chat_dir) and res["params"] > 0
    # a turn cut at turn_tokens is closed with the end-of-turn token, then the template's tool message and
    # the next assistant header: what SmolLM2's template puts between two turns (the bench checks every episode)
    tool = [{"role": "tool", "name": "calculate", "content": "42"}]
    inserted = [tok.eos_token_id] + chat_suffix_ids(tok, tool)
    assert res["inserted_text"] == "<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    # the prompt is the template's: the tools in a system message (the template ignores `tools`), the question
    assert res["prompt_tokens"] > 500
    for turns, r in res["turns"].items():
        kept, naive, t = r["kept"], r["naive"], int(turns)
        assert r["inserted_per_turn"] == len(inserted)
        assert r["same_completions"] and r["episodes"] == 4  # the bench raises if the arms' ids differ
        assert kept["decode_per_episode"] == naive["decode_per_episode"] == t * 5
        ks, ns = kept["stats"], naive["stats"]
        computed = {a: s["prefill_tokens"] + s["prefix_tokens_shared"] for a, s in (("kept", ks), ("naive", ns))}
        # what the naive arm prefilled (or copied from a batch-mate) beyond the kept arm, the kept arm restored
        assert computed["naive"] - computed["kept"] == ks["restored_tokens"] > 0
        # a kept turn after the first prefills only the last sampled id and the inserted ids
        first_turn = computed["kept"] - 4 * (t - 1) * (1 + len(inserted))
        assert first_turn == 4 * res["prompt_tokens"]
        assert naive["restored_per_episode"] == 0
        # the process's CPU time beside wall time (on a shared machine wall time is mostly load): both paired
        assert len(kept["cpu_seconds"]) == len(kept["seconds"]) == 1 and r["cpu_ratio_paired"] > 0
    assert res["turns"]["3"]["prefill_ratio"] > res["turns"]["2"]["prefill_ratio"] > 1
    assert f"{chat_dir.name}" in out.getvalue() and "hermes" in out.getvalue()


def test_model_errors_name_the_field(chat_dir):
    with pytest.raises(ConfigError, match="config field 'model':.*no_such_package"):
        run_multiturn_bench(["model=pkg:no_such_package/m.gguf", "max_turns=[2]"], Console(file=io.StringIO()))
    with pytest.raises(ConfigError, match="config field 'model':.*does not exist"):
        run_multiturn_bench([f"model={chat_dir}/nowhere", "max_turns=[2]"], Console(file=io.StringIO()))
    with pytest.raises(ConfigError, match="config field 'preset'.*not both"):
        load_bench_config([f"model={chat_dir}", "preset=tiny"])
    with pytest.raises(ConfigError, match="over the model's 2048"):
        run_multiturn_bench(small(chat_dir, "max_turns=[8]", "turn_tokens=200"), Console(file=io.StringIO()))
