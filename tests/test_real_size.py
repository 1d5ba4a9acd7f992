"""The real-model path at test size: a Qwen2-shaped model, a byte-level BPE tokenizer with a
ChatML chat template, chat-format JSONL and ``math_answer`` beside a user's TRL reward.

Covers what a user with a Qwen2.5 checkpoint hits: the tokenizer round trip, the chat
template, a run without an SFT warm start records the source directory instead of copying the
model (``init_model.json``), checkpoints hold the tied embedding once, and resume continues.
"""

import json
import struct

import pytest
import torch
from qwen2model import build_qwen2
from transformers import AutoTokenizer

from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer, Until


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    return build_qwen2(tmp_path_factory.mktemp("qwen2") / "model")


def test_byte_level_tokenizer_round_trips_and_applies_the_chat_template(qwen2_dir):
    tok = AutoTokenizer.from_pretrained(qwen2_dir)
    text = "What is 12 + 7?\n  Think:  step by step.\n\\boxed{19} é ü 中"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text and len(ids) < len(text)  # merges applied, bytes preserved
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


def _data(tmp_path):
    path = tmp_path / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)}
            for a, b in [(3, 4), (12, 7), (25, 17), (8, 8), (40, 2), (9, 13), (31, 11), (5, 60)]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _config(tmp_path, qwen2_dir, name, *extra):
    return load_run_config(None, [
        f"output_dir={tmp_path}", f"name={name}", f"model.path={qwen2_dir}", "model.threads=1", "sft.steps=0",
        "task.name=file", f"task.path={_data(tmp_path)}", "task.prompt_field=messages", "task.eval_fraction=0.25",
        "rewards=[{name: math_answer}, {name: 'qwen2model:parity_reward'}]",
        "rollout.prompts_per_step=3", "rollout.num_generations=4", "rollout.max_new_tokens=24",
        "train.eval_samples=0", "train.eval_every=0", "train.checkpoint_every=1", "optim.lr=1e-3", *extra])


def _safetensors_names(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return set(json.loads(f.read(n))) - {"__metadata__"}


def test_qwen2_chat_model_trains_checkpoints_once_and_resumes(tmp_path, qwen2_dir):
    with Trainer(_config(tmp_path, qwen2_dir, "full", "train.steps=2")) as full:
        full.prepare()
        assert type(full.engine).__name__ == "SlotEngine"
        assert full.eval_prompts[0].token_ids[:1] == full.tokenizer.convert_tokens_to_ids(["<|im_start|>"])
        before = [p.detach().clone() for p in full.model.parameters()]
        seen = []
        full.fit(on_step=lambda step, m: seen.append(m))
        assert seen[0]["groups/zero_signal"] < 1  # the user's reward gave the random model a signal
        assert all(not torch.equal(a, b) for a, b in zip(before, full.model.parameters()))
    run = tmp_path / "full"
    # no warm start ran: the run records where its starting weights live instead of copying them
    assert not (run / "init_model").exists()
    assert json.loads((run / "init_model.json").read_text())["path"] == str(qwen2_dir.resolve())
    names = _safetensors_names(run / "checkpoints" / "step_000002" / "model.safetensors")
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names  # the tie, stored once

    with Trainer(_config(tmp_path, qwen2_dir, "cut", "train.steps=2")) as cut:
        cut.prepare()
        cut.fit(Until(steps=1))
    with Trainer(_config(tmp_path, qwen2_dir, "cut", "train.steps=2")) as resumed:
        resumed.prepare(resume=True)
        assert resumed.model.lm_head.weight is resumed.model.model.embed_tokens.weight  # still tied
        m = resumed.step()
    assert m["loss"] == seen[1]["loss"] and m["reward/mean"] == seen[1]["reward/mean"]
