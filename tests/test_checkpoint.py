"""Checkpoints store tied tensors once and restore the tie; a mismatched model is a clear error."""

import json
import struct

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rollwise.config import ConfigError
from safetensors.torch import load_file, save_file

from rollwise.train.checkpoint import load_weights, save_checkpoint, unique_weights


def _model(tied: bool, vocab: int = 300, layers: int = 1):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=tied)
    return LlamaForCausalLM(config)


def _save(tmp_path, model, name="run"):
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return save_checkpoint(tmp_path / name, 1, model, opt, sched, {"step": 1}, keep=2)


def _header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


@pytest.mark.parametrize("tied", [True, False])
def test_tied_embeddings_are_stored_once(tmp_path, tied):
    model = _model(tied)
    ckpt = _save(tmp_path, model)
    header = _header(ckpt / "model.safetensors")
    names = set(header) - {"__metadata__"}
    assert "model.embed_tokens.weight" in names
    assert ("lm_head.weight" in names) is not tied
    unique = {p.untyped_storage().data_ptr(): p.numel() * p.element_size() for p in model.state_dict().values()}
    stored = sum(b - a for a, b in (header[n]["data_offsets"] for n in names))
    assert stored == sum(unique.values())  # every distinct tensor once, nothing twice
    assert json.loads(header["__metadata__"]["aliases"]) == ({"lm_head.weight": "model.embed_tokens.weight"}
                                                             if tied else {})


def test_loading_restores_the_weights_and_keeps_the_tie(tmp_path):
    trained = _model(True)
    with torch.no_grad():
        trained.model.embed_tokens.weight.mul_(3.0)
    ckpt = _save(tmp_path, trained)
    fresh = _model(True)
    load_weights(ckpt, fresh)
    assert fresh.lm_head.weight is fresh.model.embed_tokens.weight
    assert torch.equal(fresh.model.embed_tokens.weight, trained.model.embed_tokens.weight)
    assert torch.equal(fresh.lm_head.weight, trained.lm_head.weight)
    with torch.no_grad():  # still one tensor: a change to the embedding shows in the output head
        fresh.model.embed_tokens.weight[0, 0] = 123.0
    assert fresh.lm_head.weight[0, 0] == 123.0


def test_untied_model_keeps_both_matrices(tmp_path):
    trained = _model(False)
    with torch.no_grad():
        trained.lm_head.weight.mul_(-1.0)
    fresh = _model(False)
    load_weights(_save(tmp_path, trained), fresh)
    assert torch.equal(fresh.lm_head.weight, trained.lm_head.weight)
    assert not torch.equal(fresh.lm_head.weight, fresh.model.embed_tokens.weight)


def test_a_checkpoint_of_another_model_is_a_config_error(tmp_path):
    ckpt = _save(tmp_path, _model(True))
    with pytest.raises(ConfigError, match="does not match the model"):
        load_weights(ckpt, _model(True, layers=2))  # a layer the checkpoint does not have


def test_a_checkpoint_of_another_vocabulary_is_a_config_error(tmp_path):
    ckpt = _save(tmp_path, _model(True))
    with pytest.raises(ConfigError, match=r"shapes \['model.embed_tokens.weight \[300, 32\] vs \[400, 32\]"):
        load_weights(ckpt, _model(True, vocab=400))


def test_an_untied_checkpoint_does_not_load_into_a_tied_model(tmp_path):
    trained = _model(False)
    with torch.no_grad():
        trained.lm_head.weight.mul_(-1.0)
    with pytest.raises(ConfigError, match="as different tensors, but the model ties them"):
        load_weights(_save(tmp_path, trained), _model(True))  # one of the two would be lost


def test_a_checkpoint_with_both_names_stored_still_loads_tied(tmp_path):
    """Checkpoints written before aliases hold the tied matrix under both names, equal."""
    trained = _model(True)
    with torch.no_grad():
        trained.model.embed_tokens.weight.mul_(3.0)
    ckpt = _save(tmp_path, trained)
    both = {k: v.clone() for k, v in trained.state_dict().items()}
    save_file(both, str(ckpt / "model.safetensors"))  # no aliases metadata
    fresh = _model(True)
    load_weights(ckpt, fresh)
    assert fresh.lm_head.weight is fresh.model.embed_tokens.weight
    assert torch.equal(fresh.lm_head.weight, trained.lm_head.weight)


def test_cpu_weights_are_written_without_a_second_copy_in_memory():
    model = _model(True)
    weights, _ = unique_weights(model.state_dict())
    assert weights["model.embed_tokens.weight"].data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_overlapping_views_are_stored_apart(tmp_path):
    base = torch.arange(12.0)
    state = {"a": base[:8], "b": base[4:], "c": base[:8]}  # a and c alias; b overlaps a
    weights, aliases = unique_weights(state)
    assert aliases == {"c": "a"} and sorted(weights) == ["a", "b"]
    save_file(weights, str(tmp_path / "w.safetensors"))
    loaded = load_file(str(tmp_path / "w.safetensors"))
    assert torch.equal(loaded["a"], base[:8]) and torch.equal(loaded["b"], base[4:])
