"""Supervised warm start on a task's synthetic demonstrations.

The loss covers completion tokens (and the closing EOS) only, never the prompt. A multi-turn
demonstration (``Task.demonstrate`` returning segments) trains each model turn and the EOS that
ends it, never the text the environment inserts between turns — what an episode's loss weights
do in RL (``generate/episode.py``).

In a run (``log_to``: the run directory's ``sft.jsonl``) every SFT step appends one line,
``{"sft_step": n, "sft/loss": ..., "sft/lr": ...}`` (n from 1; the loss is the step's mean over its
trained tokens, before the update). A task without demonstrations is a ``ConfigError`` naming the
setting that gives them (``task.demo_field`` for ``task.name: file``) or ``sft.steps=0``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from rollwise.config import ConfigError
from rollwise.model.load import encode_prompt
from rollwise.model.logprobs import token_logprobs_and_entropy
from rollwise.tasks.base import Task


def demo_ids(tokenizer, demonstration: str | list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """A demonstration's completion ids and their loss mask: each model segment (a turn) then EOS,
    trained; each inserted segment untrained."""
    segments = [(demonstration, True)] if isinstance(demonstration, str) else demonstration
    ids, mask = [], []
    for text, trained in segments:
        seg = tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if trained else [])
        ids += seg
        mask += [int(trained)] * len(seg)
    return ids, mask


def demo_batch(tokenizer, task: Task, start: int, size: int, device) -> tuple[torch.Tensor, ...]:
    """Right-padded (input_ids, attention_mask, loss_mask) [B, T] for demonstrations start..start+size."""
    rows, masks = [], []
    for i in range(start, start + size):
        prompt = task.train.get(i)
        p_ids = encode_prompt(tokenizer, prompt)
        c_ids, c_mask = demo_ids(tokenizer, task.demonstrate(prompt))
        rows.append(p_ids + c_ids)
        masks.append([0] * len(p_ids) + c_mask)
    width = max(map(len, rows))
    ids = torch.full((size, width), tokenizer.pad_token_id, dtype=torch.long)
    attn = torch.zeros((size, width), dtype=torch.long)
    loss_mask = torch.zeros((size, width), dtype=torch.float)
    for i, (r, m) in enumerate(zip(rows, masks)):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
        loss_mask[i, : len(m)] = torch.tensor(m, dtype=torch.float)
    return ids.to(device), attn.to(device), loss_mask[:, 1:].to(device)


def sft(
    model, tokenizer, task: Task, *, steps: int, batch_size: int = 64, lr: float = 1e-3, warmup: int = 20,
    data_offset: int = 10**9, on_step: Callable[[int, float], None] | None = None, log_to: Path | None = None,
) -> list[float]:
    """Train on demonstrations for ``steps`` steps; return the loss per step (each also a line of
    ``log_to`` when given).

    ``data_offset`` keeps SFT examples apart from the RL stream's first prompts.
    """
    if task.demonstrate is None:
        raise ConfigError(no_demonstrations(task.name))
    device = next(model.parameters()).device
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    losses = []
    for step in range(steps):
        ids, attn, loss_mask = demo_batch(tokenizer, task, data_offset + step * batch_size, batch_size, device)
        logprobs, _ = token_logprobs_and_entropy(model, ids, attn, with_entropy=False)
        loss = -(logprobs * loss_mask).sum() / loss_mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        lr_used = sched.get_last_lr()[0]
        opt.step()
        sched.step()
        losses.append(loss.item())
        if log_to is not None:
            with open(log_to, "a") as f:  # appended per step: a run stopped mid-warm-start keeps its lines
                f.write(json.dumps({"sft_step": step + 1, "sft/loss": losses[-1], "sft/lr": lr_used}) + "\n")
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    return losses


def no_demonstrations(task_name: str) -> str:
    """What to set when ``sft.steps > 0`` on a task that has no demonstrations."""
    if task_name == "file":
        return ("sft.steps > 0 but task 'file' has no demonstrations: set task.demo_field to the column holding a "
                "worked completion for each prompt, or sft.steps=0 to skip the SFT warm start")
    return f"sft.steps > 0 but task '{task_name}' has no demonstrations for the SFT warm start: set sft.steps=0"
