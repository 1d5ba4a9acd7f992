"""Replay: what a step trains on besides its fresh groups (METHODS.md, replay/; docs/replay.md).

A ``Replay`` (``replay/base.py``) is built from ``replay.method`` with its options under
``replay.<method>.*`` and called by the loop at fixed points: ``fresh_prompts`` before
generation, ``compose`` after scoring and advantages, ``update_passes`` and ``reincarnate`` around
the update. ``ReplayBuffer`` (``replay/buffer.py``) is the FIFO of groups the methods share.
The method's state (buffer contents included) is saved with every checkpoint.
``replay.method: none`` is on-policy training: every step trains exactly its fresh groups.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollwise.config import ConfigError, StrictModel
from rollwise.replay.base import Replay
from rollwise.replay.buffer import ReplayBuffer
from rollwise.replay.remix import RemixConfig
from rollwise.replay.rollout_replay import RolloutReplayConfig
from rollwise.replay.rorecomp import RorecompConfig

__all__ = ["REPLAY_METHODS", "Replay", "ReplayBuffer", "ReplayConfig", "build_replay", "check_composition",
           "remix_objective", "replay_serves_stored_groups"]

REPLAY_METHODS = {
    "none": "on-policy: every step trains exactly its fresh groups",
    "rollout_replay": "Rollout Replay: half of each step's groups from a FIFO of groups at most 2 versions old",
    "remix": "ReMix: 1:1 fresh/replayed (last 4 versions), UTD 2, KL-convex constraint, reincarnation at mid-run",
    "rorecomp": "RoRecomp: short correct + long incorrect trained now, the rest as a compensation batch every 4th step",
}


class ReplayConfig(StrictModel):
    method: Literal[tuple(REPLAY_METHODS)] = Field("none", description="the replay method (`rollwise list replay`)")
    rollout_replay: RolloutReplayConfig = Field(default_factory=RolloutReplayConfig,
                                                description="method=rollout_replay options")
    remix: RemixConfig = Field(default_factory=RemixConfig, description="method=remix (ReMix) options")
    rorecomp: RorecompConfig = Field(default_factory=RorecompConfig, description="method=rorecomp (RoRecomp) options")


def remix_objective(cfg: ReplayConfig) -> dict:
    """The objective fields ReMix's KL-convex constraint sets: ``beta`` and ``prox_kl_coef`` = β/2
    each (``replay.remix.beta``); ``{}`` for every other method."""
    if cfg.method != "remix":
        return {}
    half = cfg.remix.beta / 2
    return {"beta": half, "prox_kl_coef": half}


def replay_serves_stored_groups(cfg: ReplayConfig) -> bool:
    """The method trains groups sampled by older policies: ``rollout_replay`` and ``remix`` with
    ``share > 0``, ``rorecomp`` (its compensation batches)."""
    if cfg.method in ("rollout_replay", "remix"):
        return getattr(cfg, cfg.method).share > 0
    return cfg.method == "rorecomp"


def check_composition(cfg: ReplayConfig, rollout, objective=None) -> None:
    """Refuse combinations that make no sense, naming the fields and the fix (``objective``: the
    run's ``ObjectiveConfig``, whose ``tis_mode`` must weight replayed groups)."""
    if objective is not None and objective.tis_mode == "none" and replay_serves_stored_groups(cfg):
        raise ConfigError(f"replay.method={cfg.method} trains groups sampled by older policies, but "
                          "objective.tis_mode=none weights them as if they were fresh; drop objective.tis_mode "
                          "(with replay it defaults to token_truncate, cap 2: the decoupled PPO weight) or set it "
                          "to token_truncate, token_mask or sequence_truncate")
    if cfg.method == "rorecomp" and rollout.strategy in ("tree", "latr"):
        raise ConfigError(f"replay.method=rorecomp with rollout.strategy={rollout.strategy}: rorecomp splits each "
                          "group's responses, and a tree trains a shared prefix once in one leaf; set "
                          "rollout.strategy=group")


def build_replay(cfg: ReplayConfig, *, seed: int, prompts_per_step: int, total_steps: int) -> Replay:
    """The replay method ``cfg.method`` names (``total_steps`` places ReMix's reincarnation)."""
    from rollwise.replay.remix import Remix
    from rollwise.replay.rollout_replay import RolloutReplay
    from rollwise.replay.rorecomp import Rorecomp

    kw = {"seed": seed, "prompts_per_step": prompts_per_step, "total_steps": total_steps}
    if cfg.method == "rollout_replay":
        return RolloutReplay(cfg.rollout_replay, **kw)
    if cfg.method == "remix":
        return Remix(cfg.remix, **kw)
    if cfg.method == "rorecomp":
        return Rorecomp(cfg.rorecomp, **kw)
    return Replay(**kw)
