"""What ``Trainer.__init__`` and ``Trainer.prepare`` build from the config besides the stages:
the LR schedule, the update's forward, async's thread count, the reference model, the step's
optimizer with its extra terms — and the combinations they refuse."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import numpy as np
import torch

from rollwise.config import ConfigError
from rollwise.model import lora
from rollwise.model.packed import supports_packing


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def lr_lambda(cfg):
    """The LR factor per training step (``optim.warmup_steps``, ``optim.schedule``, over ``train.steps``)."""
    o, total = cfg.optim, max(cfg.train.steps, 1)

    def factor(step: int) -> float:
        if step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - o.warmup_steps) / max(total - o.warmup_steps, 1))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if o.schedule == "cosine" else 1 - progress
        return o.min_lr_ratio + (1 - o.min_lr_ratio) * shape

    return factor


def packed_forward(choice: str, model) -> bool:
    """Whether the update runs the packed forward (``optim.forward``)."""
    if choice == "hf":
        return False
    if supports_packing(model):
        return True
    if choice == "packed":
        raise ConfigError(f"optim.forward=packed runs Llama/Qwen2/Mistral models, not model_type "
                          f"{model.config.model_type!r}; set optim.forward=auto or hf")
    return False


def async_threads(cfg) -> int:
    """The torch thread count of ``train.mode=async`` (both sides: torch's count is process-wide)."""
    t = cfg.train
    gen = t.generation_threads or max(1, (os.cpu_count() or 2) // 2)
    upd = t.update_threads or gen
    if gen != upd:
        raise ConfigError(f"train.generation_threads={gen} and train.update_threads={upd} differ: in one process "
                          "torch's intra-op thread count is process-wide, so both sides run with one count; set them "
                          "equal (on N cores, N/2 each)")
    if t.max_staleness > 0 and cfg.objective.tis_mode == "none":
        raise ConfigError(f"train.mode=async with max_staleness={t.max_staleness} trains on tokens sampled by older "
                          "policies, but objective.tis_mode=none does not correct for it; set objective.tis_mode "
                          "(e.g. token_truncate: objective.method=decoupled_ppo) or train.max_staleness=0")
    if cfg.rollout.strategy == "april":
        raise ConfigError("rollout.strategy=april with train.mode=async: APRIL carries partial rollouts into later "
                          "steps, past the staleness bound; async already overlaps generation with the update — use "
                          "rollout.strategy=group, tree or latr, or train.mode=sync")
    return gen


def check_workers(cfg, controller) -> None:
    """``rollout.workers`` generate apart from the driver: refuse what needs the driver inside generation."""
    if not cfg.rollout.workers:
        return
    if controller.prunes_in_generation or controller.asks_should_continue or controller.restarts_episodes:
        raise ConfigError(f"control.method={cfg.control.method} stops or restarts rollouts inside generation, on the "
                          "driver's controller; rollout workers generate apart from it — set rollout.workers=0 "
                          "or choose a controller that selects or allocates (`rollwise list controllers`)")
    if cfg.rollout.strategy == "april":
        raise ConfigError("rollout.strategy=april carries partial rollouts from step to step inside one engine; "
                          "with rollout.workers use rollout.strategy=group, tree or latr (or rollout.workers=0)")


def reference_model(cfg, model, init_dir: Path, device):
    """The KL reference when the objective needs one (else None)."""
    return frozen_start(cfg, model, init_dir, device) if cfg.objective.needs_reference else None


def frozen_start(cfg, model, init_dir: Path, device):
    """The RL starting point, frozen: under ``model.lora`` the policy with its adapters off; otherwise
    a copy loaded from ``init_dir``."""
    if cfg.model.lora is not None:  # the base, adapters off
        return lora.AdapterDisabled(model)
    ref = type(model).from_pretrained(init_dir, dtype=model.dtype)
    return ref.to(device).eval()


def embedding_model(cfg, model, ref_model, init_dir: Path, device):
    """``difficulty_select``'s fixed embedding model (``embeddings: start``): the starting weights —
    the KL reference when there is one that stays put (ReMix moves it), else a frozen copy; None when
    nothing embeds with it."""
    ds = cfg.control.difficulty_select
    if cfg.control.method != "difficulty_select" or ds.embeddings != "start":
        return None
    if ref_model is not None and cfg.replay.method != "remix":
        return ref_model
    return frozen_start(cfg, model, init_dir, device)


def update_optimizer(trainer, step: int, groups, precision):
    """This step's optimizer: the trainer's AdamW, with the terms trained beside the policy loss
    (``optim/auxiliary.py``) — ``dph_rl``'s rehearsal, ``masa``'s self-alignment — when they are on;
    ``precision``: the update's forward context, which the terms' forwards run in too."""
    from rollwise.control.masa import alignment_loss
    from rollwise.optim.auxiliary import AuxiliaryTerm
    from rollwise.optim.dph import step_optimizer

    t, cfg = trainer, trainer.cfg
    optimizer = step_optimizer(t.dph_pool, groups, t.optimizer, t.model, cfg.objective, t.step_seed(step),
                               t.update_spec(step).sampling, t.tokenizer.pad_token_id, precision)
    if cfg.control.method == "masa" and cfg.control.masa.align_coef > 0:
        optimizer = AuxiliaryTerm(optimizer, lambda: alignment_loss(t.meta_align, t.model, groups),
                                  cfg.control.masa.align_coef, "masa/align_loss", precision)
    return optimizer


def harness_sampler(rollout, params, tokenizer, controller):
    """``rollout.harness``'s ``HarnessSampler``: episodes an agent program runs through the run's endpoint."""
    import importlib.util

    from rollwise.serve.harness import HarnessSampler, load_harness
    from rollwise.tasks.tool_calls import tool_format

    missing = [m for m in ("fastapi", "uvicorn", "openai") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"rollout.harness needs {', '.join(missing)}: pip install 'rollwise[serve]'")

    if rollout.environment is not None:
        raise ConfigError("rollout.harness and rollout.environment both set: a harness runs its own tools; choose one")
    if rollout.strategy != "group" or rollout.workers:
        raise ConfigError("rollout.harness runs with rollout.strategy=group and rollout.workers=0 (in-process)")
    if controller.prunes_in_generation or controller.asks_should_continue or controller.restarts_episodes:
        raise ConfigError("rollout.harness: a controller that prunes, stops or restarts rollouts inside generation "
                          "does not work on harness episodes; choose one that selects or allocates")
    try:
        fmt = tool_format(rollout.tool_format, tokenizer)
    except ValueError as err:
        raise ConfigError(f"rollout.tool_format: {err}") from None
    load_harness(rollout.harness)  # a ConfigError here, not in the harness worker process
    return HarnessSampler(params, tokenizer, fmt, rollout.harness, rollout.harness_timeout,
                          max_segments=rollout.harness_max_segments)


def episode_sampler(rollout, params, tokenizer, controller, sandbox=None):
    """``rollout.environment``'s ``EpisodeSampler``; refuses what episodes do not compose with yet.
    ``sandbox``: the run's, for environments that run code in it (``python_tool``)."""
    from rollwise.generate.episode import EpisodeSampler
    from rollwise.tasks.environment import episode_parts

    if rollout.strategy != "group":
        raise ConfigError(f"rollout.environment runs episodes with rollout.strategy=group, not {rollout.strategy}")
    if controller.prunes_in_generation or controller.asks_should_continue:
        raise ConfigError("rollout.environment: a controller that prunes or stops rollouts inside generation does not "
                          "work on episodes yet; choose one that selects or allocates (`rollwise list controllers`)")
    envs, fmt = episode_parts(rollout, tokenizer, sandbox)
    if controller.restarts_episodes:  # trace: the second pass restarts episodes from turn prefixes it plans
        from rollwise.generate.trace_episodes import TraceEpisodeSampler

        return TraceEpisodeSampler(params, tokenizer, envs, fmt, rollout.max_turns, planner=controller)
    return EpisodeSampler(params, tokenizer, envs, fmt, rollout.max_turns)
