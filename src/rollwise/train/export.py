"""``rollwise export RUN_DIR --merged OUT``: a run's policy as a plain Hugging Face model directory.

The policy of a run is its base model (``init_model/``, or the directory ``init_model.json``
records) plus the weights of its latest checkpoint: the LoRA adapter under ``model.lora``, the
whole model otherwise. Export rebuilds the policy exactly as a resumed run would, folds the
adapter into the base weights (W ← W + s·B·A) and saves model and tokenizer with
``save_pretrained``: the directory loads with ``AutoModelForCausalLM`` alone, no peft, and
computes the policy's logits (``tests/test_lora.py``).
"""

from __future__ import annotations

from pathlib import Path

from rollwise.config import ConfigError
from rollwise.model.load import load_model_and_tokenizer
from rollwise.model.lora import merge_into_base
from rollwise.train.checkpoint import latest_checkpoint, load_weights, weights_file
from rollwise.train.config import load_run_config


def export_merged(run_dir: Path, out: Path) -> Path:
    """Write the policy of ``run_dir``'s latest checkpoint to ``out`` (adapter merged); return ``out``."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"'{run_dir}' is not a run directory (no config.yaml)")
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise ConfigError(f"run '{run_dir}' has no checkpoint to export (train.checkpoint_every, or let fit() end)")
    cfg = load_run_config(str(run_dir / "config.yaml"))
    model_cfg = cfg.model.model_copy(update={"device": "cpu"})
    if (run_dir / "init_model").is_dir():  # the run built its starting point (a preset): the base is here
        model_cfg = model_cfg.model_copy(update={"path": str(run_dir / "init_model")})
    model, tokenizer = load_model_and_tokenizer(model_cfg, seed=cfg.seed)
    load_weights(ckpt, model, weights_file(model))
    merge_into_base(model)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
