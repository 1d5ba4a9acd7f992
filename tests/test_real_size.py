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
from tinymodel import redraw
from tokenizers import Tokenizer
from transformers import AutoTokenizer, Qwen2ForCausalLM

from rollwise.engine.engine import Request
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.slots import SlotEngine

from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer
from rollwise.train.state import RunLimits


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    return build_qwen2(tmp_path_factory.mktemp("qwen2") / "model")


TEXTS = ["What is 12 + 7?\n  Think:  step by step.\n\\boxed{19} é ü 中",
         "Let's think step by step.\nFirst, 91 + 56 = 147.\nSo the answer is \\boxed{147}.",
         "def add(x, y):\n    return x + y   \n\n\tdon't  I'M  ",
         "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"]


def test_byte_level_tokenizer_round_trips_and_applies_the_chat_template(qwen2_dir):
    tok = AutoTokenizer.from_pretrained(qwen2_dir)
    written = Tokenizer.from_file(str(qwen2_dir / "tokenizer.json"))  # what tokenizers / vLLM would use
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        assert ids == written.encode(text).ids  # transformers' rebuilt Qwen2Tokenizer agrees with the file
        assert tok.decode(ids) == text and len(ids) < len(text.encode())  # merges applied, bytes preserved
    assert tok(TEXTS[3])["input_ids"][:1] == tok.convert_tokens_to_ids(["<|im_start|>"])  # special, not split
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt == TEXTS[3]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


def test_engine_log_probs_match_hf_on_chat_prompts(qwen2_dir):
    """The slot engine runs this model (tied head, biased q/k/v, grouped KV heads): its sampled
    tokens' log-probs equal HF's forward on the same tokens, and greedy decoding equals HF's."""
    tok = AutoTokenizer.from_pretrained(qwen2_dir)
    model = redraw(Qwen2ForCausalLM.from_pretrained(qwen2_dir))  # peaked, so greedy and sampling vary
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.bias.normal_(0, 0.5)
            layer.self_attn.k_proj.bias.normal_(0, 0.5)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                       tokenize=False) for t in ("hi", TEXTS[1], "What is 3 + 4?")]
    prompt_ids = [tok(p)["input_ids"] for p in prompts]
    for temperature in (1.0, 0.0):
        params = SamplingParams(temperature=temperature, max_new_tokens=12, stop_token_ids=(tok.eos_token_id,))
        engine = SlotEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=2, seed=0)
        outs = engine.generate([Request(ids, params) for ids in prompt_ids])
        for ids, out in zip(prompt_ids, outs):
            with torch.no_grad():
                full = torch.tensor([ids + out.token_ids])
                hf = model(full).logits[0, len(ids) - 1: -1].log_softmax(-1)
                if temperature:
                    expected = hf.gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]
                    assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4)
                else:
                    greedy = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
                    assert out.token_ids == greedy[0, len(ids):].tolist()
        assert len({len(o.token_ids) for o in outs} | {tuple(o.token_ids) for o in outs}) > 1 or temperature == 0


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
        cut.fit(RunLimits(steps=1))
    with Trainer(_config(tmp_path, qwen2_dir, "cut", "train.steps=2")) as resumed:
        resumed.prepare(resume=True)
        assert resumed.model.lm_head.weight is resumed.model.model.embed_tokens.weight  # still tied
        m = resumed.step()
    assert m["loss"] == seen[1]["loss"] and m["reward/mean"] == seen[1]["reward/mean"]
