"""A ``.gguf`` file as ``model.path``: dequantized once into a cached Hugging Face directory.

A GGUF file (llama.cpp's format) holds the weights, often quantized to 4-8 bits, with the config
and the tokenizer (chat template included) as metadata. Training needs dense weights, so the file
is dequantized to ``model.dtype`` by transformers' GGUF loader and saved as an ordinary
``save_pretrained`` directory (config.json, model.safetensors, tokenizer files). Everything
downstream (the engine, the reference model, checkpoints, Ray workers) then sees a plain HF
directory and knows nothing of GGUF.

The directory lives in a cache shared by runs, ``<cache>/gguf/<sha256[:16]>-<dtype>/``, keyed by
the file's content, not its name: a second run skips the conversion, and a different file at the
same path gets its own entry. It is written to a temporary directory beside it and renamed into
place, so a killed conversion leaves no half-written entry and two concurrent converters both
succeed (the second rename loses and its copy is dropped).

The ``gguf`` and ``accelerate`` packages (``rollwise[gguf]``) are imported only here, inside the
functions that need them, and only when a conversion actually runs: a cached entry loads without them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path

from rollwise.config import ConfigError

log = logging.getLogger("rollwise")

CACHE_ENV = "ROLLWISE_CACHE"
INSTALL = "pip install 'rollwise[gguf]'"
MAGIC = b"GGUF"  # the first four bytes of every GGUF file (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md)


def cache_root(cache_dir: str | None) -> Path:
    """``model.cache_dir``, else ``$ROLLWISE_CACHE``, else ``~/.cache/rollwise``."""
    return Path(cache_dir or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rollwise").expanduser()


def gguf_model_dir(path: Path, dtype: str, cache_dir: str | None) -> Path:
    """The cached HF directory for the GGUF file ``path`` in ``dtype``, converting it on first use."""
    check_gguf_file(path)
    entry = cache_root(cache_dir) / "gguf" / f"{file_sha256(path)[:16]}-{dtype}"
    if (entry / "config.json").is_file():
        return entry
    require_extras()
    architecture = check_header(path)
    log.info("model.path %s: dequantizing %s to %s once, into %s", path.name, architecture, dtype, entry)
    return _write_atomically(entry, lambda tmp: convert(path, tmp, dtype))


def check_gguf_file(path: Path) -> None:
    """Exists, is a file, starts with the GGUF magic: else a one-line ConfigError."""
    if not path.exists():
        raise ConfigError(f"model.path: GGUF file '{path}' does not exist (give a .gguf file or a model directory)")
    if not path.is_file():
        raise ConfigError(f"model.path '{path}' ends in .gguf but is a directory; point it at the .gguf file")
    with path.open("rb") as f:
        if f.read(4) != MAGIC:
            raise ConfigError(f"model.path '{path}' is not a GGUF file (it does not start with the GGUF magic bytes)")


@functools.lru_cache(maxsize=16)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """The file's sha256, computed once per process per (path, size, mtime): the trainer, its
    reference model and the eval CLI all resolve the same path, and a 4 GB file takes seconds."""
    st = path.stat()
    return _sha256(str(path.resolve()), st.st_size, st.st_mtime_ns)


def require_extras() -> None:
    """``gguf`` reads and dequantizes the blocks; transformers refuses a gguf_file without ``accelerate``."""
    for name in ("gguf", "accelerate"):
        try:
            __import__(name)
        except ImportError:
            raise ConfigError(f"model.path is a .gguf file, which needs the '{name}' package: {INSTALL}") from None


def supported_architectures() -> list[str]:
    """The GGUF architectures transformers can map to a model (its legacy table and its newer one)."""
    try:
        from transformers.integrations.gguf import GGUF_CONFIG_ARCHS
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:  # moved in a later transformers: let the conversion itself decide
        return []
    return sorted({*GGUF_SUPPORTED_ARCHITECTURES, *GGUF_CONFIG_ARCHS} - {"general", "tokenizer"})


def check_header(path: Path) -> str | None:
    """Read the metadata and tensor table; a one-line ConfigError for a corrupt or truncated file or
    a tensor type gguf cannot dequantize. Returns the architecture. Whether transformers can map the
    architecture is left to transformers (it renames some of llama.cpp's names first), see `convert`."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
        field = reader.get_field("general.architecture")
        architecture = field.contents() if field is not None else None
        qtypes = {t.tensor_type for t in reader.tensors}
    except Exception as err:  # the reader raises ValueError, IndexError, struct/numpy errors on bad bytes
        raise ConfigError(f"model.path '{path}' is a corrupt or truncated GGUF file ({type(err).__name__}: "
                          f"{_first_line(err)}); download it again") from None
    # gguf.quants.dequantize handles F32, F16 and the types with a class in this (private) table
    traits = getattr(gguf.quants, "_type_traits", None)
    dequantizable = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, *(traits or ())}
    if traits is not None and (bad := sorted(q.name for q in qtypes - dequantizable)):
        raise ConfigError(f"model.path '{path}': tensor type {', '.join(bad)} cannot be dequantized by the gguf "
                          f"package; use a file in F32, F16, BF16, Q8_0, Q4_K... or a HF model directory")
    return architecture


def convert(path: Path, out: Path, dtype: str) -> None:
    """Dequantize ``path`` into ``out`` as a plain HF directory: model, tokenizer and chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from rollwise.model.load import DTYPES

    # dequantize=True: dense weights even where transformers could keep GGUF blocks (with `kernels`
    # installed, for some architectures), which training cannot update.
    kwargs = dict(gguf_file=path.name, quantization_config=GgufConfig(dequantize=True))
    try:
        model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=DTYPES[dtype], **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except (ValueError, NotImplementedError, KeyError, OSError) as err:
        raise load_error(path, err) from None
    plain_model(model, DTYPES[dtype]).save_pretrained(out)
    tokenizer.save_pretrained(out)
    source = {"gguf": str(path.resolve()), "sha256": file_sha256(path), "dtype": dtype}
    (out / "rollwise_source.json").write_text(json.dumps(source, indent=2) + "\n")


def load_error(path: Path, err: Exception) -> ConfigError:
    """transformers' refusal in one line: for an architecture it cannot map ("GGUF model with
    architecture X is not supported yet"), with the list it can."""
    if "not supported" in str(err) and (supported := supported_architectures()):
        return ConfigError(f"model.path '{path}': {_first_line(err)} transformers' GGUF loader maps "
                           f"{', '.join(supported)}; use a HF model directory")
    return ConfigError(f"model.path '{path}': transformers cannot load this GGUF file "
                       f"({type(err).__name__}: {_first_line(err)}); use a HF model directory")


def plain_model(model, dtype):
    """``model`` itself if transformers will save it, else the same weights in a fresh model built
    from its config: a model transformers still counts as GGUF-quantized refuses ``save_pretrained``
    ("quantized with gguf and is not serializable") even when every weight is dense."""
    if getattr(model, "hf_quantizer", None) is None and not hasattr(model.config, "quantization_config"):
        return model
    from transformers import AutoModelForCausalLM

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    plain.load_state_dict(model.state_dict())  # tied embeddings stay tied: from_config ties them
    return plain


def _write_atomically(entry: Path, write) -> Path:
    """Run ``write(tmp)`` in a fresh directory beside ``entry``, then rename it to ``entry``.

    The rename is atomic on one filesystem, so ``entry`` is either absent or complete. A killed
    writer leaves only its ``.tmp-*`` directory, removed by the next writer on this host once its
    process is gone. If another process renamed first, ours is dropped and theirs is used."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(entry)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-{socket.gethostname()}-{os.getpid()}-", dir=entry.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private (0700); the cache may be shared by users
    try:
        write(tmp)
        try:
            os.replace(tmp, entry)
        except OSError:
            if not (entry / "config.json").is_file():
                raise
            log.info("model.path: another process cached %s first; using theirs", entry.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


def _remove_stale_temps(entry: Path) -> None:
    """Delete temporary directories of killed conversions of ``entry`` made on this host."""
    prefix = f".tmp-{entry.name}-{socket.gethostname()}-"
    for stale in entry.parent.glob(f"{prefix}*"):
        pid = stale.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
