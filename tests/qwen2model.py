"""A small Qwen2-shaped model with a real byte-level BPE tokenizer and a ChatML chat template,
built locally (no hub): the path a user's Qwen2.5 checkpoint takes, at test size.

The tiny presets use a character tokenizer; this one is trained here with the ``tokenizers``
library (ByteLevel pre-tokenizer and decoder, BPE merges, the special tokens Qwen2.5 uses),
saved with ``save_pretrained`` and reloaded through ``AutoTokenizer`` like any model directory.
"""

from __future__ import annotations

from pathlib import Path

import torch

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus() -> list[str]:
    words = ("what is the answer to plus minus times equals so we get The final boxed number sum of and "
             "compute first then result is think step by step").split()
    lines = []
    for i in range(400):
        a, b = (i * 37) % 97, (i * 11) % 89
        lines.append(f"What is {a} + {b}? {' '.join(words[i % len(words):][:6])} \\boxed{{{a + b}}}\n")
    return lines


def build_qwen2(path: Path, vocab_merges: int = 700, seed: int = 0) -> Path:
    """Write a Qwen2ForCausalLM (tied embeddings, like Qwen2.5-0.5B) and its tokenizer to ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
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
    return path


def parity_reward(prompts, completions, **_) -> list[float]:
    """A stand-in user reward in TRL's convention (conversational completions) that gives a random
    model a mixed signal: 1 when the completion has an even number of characters."""
    text = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if len(t) % 2 == 0 else 0.0 for t in text]
