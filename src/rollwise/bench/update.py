"""``rollwise bench update``: the policy update with and without skipping zero-advantage rows.

Two trainers with the same recipe, seed and warm start — one with
``optim.skip_zero_advantage=true``, one with ``false`` — take ``steps`` training steps in
turn, in one process (alternating, so a change in the machine's load hits both arms alike).
Skipping changes no number of the update (``tests/test_loop.py`` checks the gradients are
equal), so the two runs train the same way and differ only in what the update runs.
Reported per arm: mean ``time/update``, ``time/generate`` and ``time/step``; the share of
rows skipped and of zero-signal groups; and the ratio of update times, measured side by side.

The ``memory`` arm measures the peak memory of one policy update on a large-vocabulary model
(a Qwen2-shaped random model built locally, 151,936 tokens by default) with the whole logits
and with the chunked LM head (``optim.logits_budget_mb``): each in a fresh process, peak RSS
after the update minus the RSS before it, so the model's own weights do not count.
"""

from __future__ import annotations

import tempfile
import json
import subprocess
import sys
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field
from rich.table import Table

from rollwise.bench.engine import _quiet_transformers
from rollwise.config import StrictModel, apply_overrides, validate


class UpdateBenchConfig(StrictModel):
    """Settings of ``rollwise bench update`` (override with ``--set key=value``)."""

    recipe: str | None = Field("recipes/demo.yaml", description="the recipe both arms run (null = defaults)")
    overrides: list[str] = Field([], description="extra key=value overrides for the recipe")
    steps: int = Field(40, ge=1, description="training steps per arm")
    seed: int = Field(0, description="run seed of both arms")
    threads: int = Field(1, ge=0, description="torch threads (0 = the recipe's); 1 is steadiest on shared machines")
    arms: list[Literal["skip", "memory"]] = Field(["skip", "memory"], min_length=1, description="what to run")
    vocab: int = Field(151_936, ge=2, description="memory arm: vocabulary of the random Qwen2-shaped model")
    hidden: int = Field(256, ge=8, description="memory arm: hidden size (the LM head dominates at a large vocabulary)")
    rows: int = Field(8, ge=1, description="memory arm: sequences in the update batch (one micro-batch; 16 rows of 256 take ~15 GB with whole logits)")
    width: int = Field(256, ge=4, description="memory arm: tokens per sequence")
    budget_mb: float = Field(512, gt=0, description="memory arm: optim.logits_budget_mb of the chunked run")


def run_update_bench(overrides: list[str], console) -> dict:
    cfg = validate(UpdateBenchConfig, apply_overrides({}, list(overrides)))
    out = {"settings": cfg.model_dump()}
    if "skip" in cfg.arms:
        with _quiet_transformers(), torch.random.fork_rng(), tempfile.TemporaryDirectory() as tmp:
            out |= _run(cfg, Path(tmp), console)
        _print(console, out)
    if "memory" in cfg.arms:
        with console.status("memory arm: one update, whole logits vs chunked LM head"):
            out["memory"] = {name: _measure_in_child(cfg, budget) for name, budget in
                             (("whole", None), ("chunked", cfg.budget_mb))}
        _print_memory(console, cfg, out["memory"])
    return out


def _run(cfg: UpdateBenchConfig, tmp: Path, console) -> dict:
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    base = [f"output_dir={tmp}", f"seed={cfg.seed}", "train.checkpoint_every=0", "train.eval_every=0",
            *([f"model.threads={cfg.threads}"] if cfg.threads else []), *cfg.overrides]
    with console.status("SFT warm start"):
        warm = Trainer(load_run_config(cfg.recipe, [*base, "name=warm", "train.steps=0"]))
        warm.prepare()
        warm_dir = warm.init_model_dir()
    arms = {}
    for skip in (True, False):
        run = load_run_config(cfg.recipe, [*base, f"name=skip_{skip}", f"model.path={warm_dir}", "sft.steps=0",
                                           f"optim.skip_zero_advantage={str(skip).lower()}"])
        arms[skip] = Trainer(run)
        arms[skip].prepare()
    rows: dict[bool, list[dict]] = {True: [], False: []}
    with console.status("update arms") as status:
        for step in range(cfg.steps):
            for skip in ((True, False) if step % 2 == 0 else (False, True)):  # alternate who goes first
                status.update(f"step {step + 1}/{cfg.steps}, skip_zero_advantage={skip}")
                rows[skip].append(arms[skip].step())
    for t in arms.values():
        t.close()

    def mean(skip, key):
        return sum(m[key] for m in rows[skip]) / len(rows[skip])

    out = {"torch_threads": torch.get_num_threads()}
    for skip, name in ((True, "skip"), (False, "no_skip")):
        out[name] = {k: mean(skip, k) for k in ("time/update", "time/generate", "time/score", "time/step",
                                                 "update/skipped_rows", "groups/zero_signal", "reward/mean")}
    out["update_time_ratio"] = out["skip"]["time/update"] / out["no_skip"]["time/update"]
    out["step_time_ratio"] = out["skip"]["time/step"] / out["no_skip"]["time/step"]
    # the two arms train identically up to float rounding; report how far their losses drifted
    out["max_loss_difference"] = max(abs(a["loss"] - b["loss"]) for a, b in zip(rows[True], rows[False]))
    return out


def _print(console, out: dict) -> None:
    table = Table(title="policy update: skip zero-advantage rows vs run every row (side by side, alternating)")
    for col in ("arm", "update s/step", "generate s/step", "step s", "rows skipped", "zero-signal groups"):
        table.add_column(col)
    for name in ("skip", "no_skip"):
        a = out[name]
        table.add_row(name, f"{a['time/update']:.3f}", f"{a['time/generate']:.3f}", f"{a['time/step']:.3f}",
                      f"{a['update/skipped_rows']:.0%}", f"{a['groups/zero_signal']:.0%}")
    console.print(table)
    console.print(f"update time ratio (skip / no skip): {out['update_time_ratio']:.2f}×; "
                  f"step time ratio: {out['step_time_ratio']:.2f}×; "
                  f"max loss difference between the arms: {out['max_loss_difference']:.2e}")


def _measure_in_child(cfg: UpdateBenchConfig, budget_mb: float | None) -> dict:
    """Run ``peak_update_memory`` in a fresh interpreter (peak RSS is per process)."""
    args = json.dumps({"vocab": cfg.vocab, "hidden": cfg.hidden, "rows": cfg.rows, "width": cfg.width,
                       "budget_mb": budget_mb, "threads": cfg.threads or 1})
    code = f"import json; from rollwise.bench.update import peak_update_memory; print(json.dumps(peak_update_memory(**json.loads({args!r}))))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def peak_update_memory(vocab: int, hidden: int, rows: int, width: int, budget_mb: float | None, threads: int) -> dict:
    """Peak RSS growth (MB) of one policy update on a random Qwen2-shaped model (call in a fresh process)."""
    import resource
    import time

    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rollwise.optim.batch import TrainBatch
    from rollwise.optim.objective import ObjectiveConfig
    from rollwise.optim.update import policy_update

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2 * width,
                         tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, vocab, (rows, width))
    mask = torch.zeros(rows, width - 1)
    mask[:, width // 4 :] = 1  # the last three quarters are the completion
    adv = torch.where(torch.arange(rows)[:, None] % 2 == 0, 1.0, -1.0) * mask
    batch = TrainBatch(input_ids=ids, attention_mask=torch.ones_like(ids), completion_mask=mask, loss_weights=mask.clone(),
                       behavior_logprobs=torch.full_like(mask, -12.0) * mask, advantages=adv,
                       rewards=torch.zeros(rows), group_ids=torch.arange(rows) // 4)
    # a first update allocates the optimizer state: measure the second one
    kwargs = dict(micro_batch_size=rows, num_iterations=1, max_grad_norm=1.0, max_len=width,
                  logits_budget_mb=budget_mb)
    policy_update(model, opt, batch, ObjectiveConfig(), **kwargs)
    before = _rss_mb()
    start = time.perf_counter()
    policy_update(model, opt, batch, ObjectiveConfig(), **kwargs)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux
    return {"budget_mb": budget_mb, "peak_mb": peak, "before_mb": before, "update_peak_mb": peak - before,
            "seconds": seconds, "params": sum(p.numel() for p in model.parameters())}


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _print_memory(console, cfg: UpdateBenchConfig, mem: dict) -> None:
    table = Table(title=f"one policy update, vocabulary {cfg.vocab:,}, {cfg.rows} × {cfg.width} tokens")
    for col in ("logits", "peak RSS growth MB", "update s"):
        table.add_column(col)
    for name, m in mem.items():
        label = "whole" if m["budget_mb"] is None else f"chunked ({m['budget_mb']:.0f} MB budget)"
        table.add_row(label, f"{m['update_peak_mb']:.0f}", f"{m['seconds']:.2f}")
    console.print(table)
