"""Tiny presets: a character-level tokenizer and a small Llama-style causal LM.

Built locally (no hub), saved with ``save_pretrained`` so ``AutoModelForCausalLM`` and
``AutoTokenizer`` reload them identically. The tokenizer is a ``tokenizers`` BPE model
with no merges (so every character is one token) saved with
its own ``tokenizer.json``. We use a ``llama`` config, not ``qwen2``: for ``qwen2``,
``AutoTokenizer`` (transformers 5) always rebuilds a ``Qwen2Tokenizer`` whatever
``tokenizer_config.json`` says, swapping in a byte-level pre-tokenizer that silently drops
spaces from a character vocabulary. ``tests/test_model.py`` checks the round trip.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
CHARS = string.digits + string.ascii_letters + string.punctuation + " \n"


@dataclass(frozen=True)
class TinyPreset:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_positions: int = 512


PRESETS = {
    # ~0.8M parameters: the demo and the tests.
    "tiny": TinyPreset(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=384),
    # ~3M parameters.
    "small": TinyPreset(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4, intermediate_size=768),
    # ~19M parameters: big enough that matrix multiplies, not Python, dominate a decode step.
    "medium": TinyPreset(hidden_size=512, num_layers=6, num_heads=8, num_kv_heads=4, intermediate_size=1536),
}


def char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, *CHARS])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False))
    core.decoder = decoders.Fuse()  # concatenate characters back, spaces included
    # prompts start with <bos>, as Llama-family tokenizers do with add_special_tokens=True
    core.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, clean_up_tokenization_spaces=False,
        padding_side="left",
    )
    return tok


def build_tiny(preset: str = "tiny", seed: int = 0, dtype: torch.dtype = torch.float32):
    """A freshly initialised (model, tokenizer) pair for ``preset``."""
    if preset not in PRESETS:
        raise ValueError(f"unknown tiny preset '{preset}'; choose one of {sorted(PRESETS)}")
    p = PRESETS[preset]
    tok = char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size,
        num_hidden_layers=p.num_layers,
        num_attention_heads=p.num_heads,
        num_key_value_heads=p.num_kv_heads,
        max_position_embeddings=p.max_positions,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        rope_theta=10000.0,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(dtype)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    return model, tok


def save_tiny(path: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Build a tiny model and save it as a Hugging Face model directory."""
    model, tok = build_tiny(preset, seed)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
