"""A small Qwen2-shaped model with a real byte-level BPE tokenizer and a ChatML chat template,
built locally (no hub): the path a user's Qwen2.5 checkpoint takes, at test size.

The tiny presets use a character tokenizer; this one is trained here with the ``tokenizers``
library and laid out like Qwen2.5's ``tokenizer.json`` (NFC normalizer, Qwen's split regex then
a ByteLevel pre-tokenizer and decoder, BPE merges, the special tokens Qwen2.5 uses), saved with
``save_pretrained`` under ``tokenizer_class: Qwen2Tokenizer`` as Qwen2.5 checkpoints are, and
reloaded through ``AutoTokenizer`` like any model directory.

Why the layout matters: transformers 5 does not load a Qwen2 tokenizer from ``tokenizer.json``
as written. ``Qwen2Tokenizer`` (chosen for any ``model_type: qwen2`` directory, whatever its
``tokenizer_class``) rebuilds the pipeline from the vocabulary and merges with its own
normalizer and pre-tokenizer. A tokenizer.json laid out otherwise (a plain GPT-2-style
ByteLevel, say) then silently tokenizes differently under transformers than under
``tokenizers`` or vLLM; the tests check both give the same ids for this one.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2.5's pre-tokenizer split (tokenizer.json, and transformers' Qwen2Tokenizer): digits one by one
QWEN_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


NAMES = "Alice Bob Carla Dmitri Emma Farid Greta Hiro Ines Jonas".split()
THINGS = "apples oranges books marbles coins tickets pencils cookies stamps shells".split()
TEMPLATES = (
    "What is {a} + {b}?",
    "Compute {a} times {b}, then subtract {c}. Show your reasoning.",
    "{n} has {a} {t} and buys {b} more. How many {t} does {n} have now?",
    "{n} gave {c} of her {a} {t} to a friend; how many are left?",
    "A train travels {a} miles in {b} hours. What is its average speed?",
    "Let's think step by step.\nFirst, {a} + {b} = {s}.\nSo the answer is \\boxed{{{s}}}.",
    "We know that {a} - {c} = {d}, therefore the result is {d}.",
    "The final answer is \\boxed{{{s}}}.",
    "def add(x, y):\n    return x + y  # {a} + {b} == {s}\n",
    "I'm not sure, but it's probably {s}; we'll check: {a} + {b} equals {s}.",
)


def _corpus() -> list[str]:
    """Three thousand lines of math-word-problem text; BPE learns every word in it (~240 merges)."""
    lines = []
    for i in range(3000):
        a, b, c = (i * 37) % 97 + 3, (i * 11) % 89 + 1, (i * 7) % 3 + 1
        fields = {"a": a, "b": b, "c": c, "s": a + b, "d": a - c, "n": NAMES[i % 10], "t": THINGS[(i // 10) % 10]}
        lines.append(TEMPLATES[i % len(TEMPLATES)].format(**fields) + "\n")
    return lines


def build_qwen2(path: Path, vocab_merges: int = 700, seed: int = 0) -> Path:
    """Write a Qwen2ForCausalLM (tied embeddings, like Qwen2.5-0.5B) and its tokenizer to ``path``."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=256 + vocab_merges, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(_corpus(), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  chat_template=CHATML)
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         bos_token_id=None)
    Qwen2ForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    config_file = path / "tokenizer_config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"tokenizer_class": "Qwen2Tokenizer"}))
    return path


def parity_reward(prompts, completions, **_) -> list[float]:
    """A stand-in user reward in TRL's convention (conversational completions) that gives a random
    model a mixed signal: 1 when the completion has an even number of characters."""
    text = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if len(t) % 2 == 0 else 0.0 for t in text]
