"""Supervised warm start on a task's synthetic demonstrations.

The loss covers completion tokens (and the EOS that ends each model turn) only, never the prompt.
A demonstration is one of:

- a string: one model turn;
- a ``tasks.tool_demos.Conversation`` (tool tasks: ``task.tool_demos``): a whole episode — the
  assistant turn with the call, the tool result, the final answer — rendered by the run's
  ``generate/conversation.ChatRenderer`` in the run's tool format, exactly as an RL episode with
  the same turns is (``demo_ids``): the prompt as the episode's first prompt (for a chat
  template, with the environment's tools in it — in a ``rollout.harness`` run, the tools the harness
  module declares, ``TOOLS``: what its calls send the endpoint), each assistant turn's text then EOS (trained),
  and between turns the ids the episode inserts (``ChatRenderer.suffix_ids``: the chat
  template's tool message and next assistant header), which are not trained — what an
  episode's loss weights do in RL (``generate/episode.py``);
- ``(text, trained)`` segments: an episode already written out as text (a ``plain``-format run).

In a run (``log_to``: the run directory's ``sft.jsonl``) every SFT step appends one line,
``{"sft_step": n, "sft/loss": ..., "sft/lr": ...}`` (n from 1; the loss is the step's mean over its
trained tokens, before the update). A task without demonstrations is a ``ConfigError`` naming the
setting that gives them (``task.demo_field`` for ``task.name: file``) or ``sft.steps=0``; so are
tool demonstrations in a run without ``rollout.environment`` or ``rollout.harness``, or calling a tool
it (or the harness's ``TOOLS``) does not have.
A row without a demonstration (``demonstrate`` returns None) is skipped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from rollwise.config import ConfigError
from rollwise.generate.conversation import ChatRenderer
from rollwise.model.load import encode_prompt
from rollwise.model.logprobs import token_logprobs_and_entropy
from rollwise.tasks.base import Task
from rollwise.tasks.tool_calls import tool_format
from rollwise.tasks.tool_demos import Conversation
from rollwise.types import Prompt

MAX_SKIPPED = 1000  # rows in a row without a demonstration before SFT gives up


@dataclass(frozen=True)
class EpisodeFormat:
    """What the run's episodes look like to the model: its tool format and its environment's tools."""

    fmt: object  # a tasks.tool_calls.ToolFormat
    schemas: list[dict]
    owner: str = "rollout.environment"  # what declares the tools (named in errors)

    @classmethod
    def of(cls, generator) -> "EpisodeFormat | None":
        """The format of ``generator``'s episodes (an ``EpisodeSampler``: ``rollout.environment``; a
        ``HarnessSampler``: the tools its module declares), else None."""
        declared = getattr(generator, "declared_tools", None)
        if declared is not None:
            return cls(generator.fmt, declared(), f"the harness module's TOOLS ({generator.spec})")
        envs = getattr(generator, "envs", None)
        if envs is None or getattr(generator, "fmt", None) is None:
            return None
        env = envs()  # one episode's environment, never reset: nothing runs, only its tools are read
        try:
            return cls(generator.fmt, list(env.schemas))
        finally:
            getattr(env, "close", lambda: None)()

    def renderer(self, tokenizer) -> ChatRenderer:
        return ChatRenderer(tokenizer, self.fmt)


def demo_ids(tokenizer, demonstration, fmt=None) -> tuple[list[int], list[int]]:
    """A demonstration's completion ids and their loss mask (1 = trained). ``fmt``: the run's tool
    format (None: ``auto`` for this tokenizer), used for ``Conversation`` demonstrations."""
    if isinstance(demonstration, Conversation):
        renderer = ChatRenderer(tokenizer, fmt or tool_format("auto", tokenizer))
        return conversation_ids(renderer, demonstration.written(renderer.fmt))
    if fmt is not None and fmt.uses_chat_template and not isinstance(demonstration, str):
        raise ConfigError(f"the task's demonstrations are episodes written as plain-format text; rollout.tool_format="
                          f"{fmt.name} inserts tool results through the chat template: use rollout.tool_format=plain")
    segments = [(demonstration, True)] if isinstance(demonstration, str) else demonstration
    ids, mask = [], []
    for text, trained in segments:
        seg = tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if trained else [])
        ids += seg
        mask += [int(trained)] * len(seg)
    return ids, mask


def conversation_ids(renderer: ChatRenderer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """The ids an episode with these turns has after its prompt, and which are trained: each assistant
    turn's text and EOS (what the model samples, trained); the messages between two assistant turns
    as ``renderer.suffix_ids`` renders them (what the episode inserts, not trained)."""
    tok = renderer.tokenizer
    ids, mask, i = [], [], 0
    while i < len(messages):
        if messages[i]["role"] == "assistant":
            seg = tok(messages[i]["content"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            trained, i = 1, i + 1
        else:
            j = next((k for k in range(i, len(messages)) if messages[k]["role"] == "assistant"), len(messages))
            seg, trained, i = renderer.suffix_ids(messages[i:j]), 0, j
        ids += list(seg)
        mask += [trained] * len(seg)
    return ids, mask


def demo_prompt_ids(tokenizer, prompt: Prompt, episodes: EpisodeFormat | None) -> list[int]:
    """The prompt as the run renders it: an environment run's episodes as ``EpisodeSampler`` renders their
    first prompt (the chat template with the tools), else as the trainer tokenizes prompts."""
    if episodes is None:
        return encode_prompt(tokenizer, prompt)
    plain = not episodes.fmt.uses_chat_template
    messages = (None if plain else prompt.messages) or [{"role": "user", "content": prompt.text}]
    return episodes.renderer(tokenizer).prompt_ids([dict(m) for m in messages], episodes.schemas)


def demo_rows(tokenizer, task: Task, start: int, size: int,
              episodes: EpisodeFormat | None = None) -> tuple[list[list[int]], list[list[int]], int]:
    """``size`` demonstrations from train row ``start`` on, each (prompt + completion ids, loss mask),
    skipping rows without one; and the row after the last one used."""
    rows, masks, i = [], [], start
    while len(rows) < size:
        if i - start >= size + MAX_SKIPPED:
            raise ConfigError(f"task {task.name!r}: no demonstration for {MAX_SKIPPED} train rows in a row; "
                              "set sft.steps=0")
        prompt = task.train.get(i)
        i += 1
        demo = task.demonstrate(prompt)
        if demo is None:
            continue
        p_ids = demo_prompt_ids(tokenizer, prompt, episodes)
        c_ids, c_mask = demo_ids(tokenizer, demo, episodes.fmt if episodes else None)
        rows.append(p_ids + c_ids)
        masks.append([0] * len(p_ids) + c_mask)
    return rows, masks, i


def demo_batch(tokenizer, task: Task, start: int, size: int, device,
               episodes: EpisodeFormat | None = None) -> tuple[torch.Tensor, ...]:
    """Right-padded (input_ids, attention_mask, loss_mask) [B, T] for ``size`` demonstrations from row ``start``."""
    rows, masks, _ = demo_rows(tokenizer, task, start, size, episodes)
    return pad(rows, masks, tokenizer.pad_token_id, device)


def pad(rows: list[list[int]], masks: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, ...]:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.float)
    for i, (r, m) in enumerate(zip(rows, masks)):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
        loss_mask[i, : len(m)] = torch.tensor(m, dtype=torch.float)
    return ids.to(device), attn.to(device), loss_mask[:, 1:].to(device)


def sft(
    model, tokenizer, task: Task, *, steps: int, batch_size: int = 64, lr: float = 1e-3, warmup: int = 20,
    data_offset: int = 10**9, on_step: Callable[[int, float], None] | None = None, log_to: Path | None = None,
    episodes: EpisodeFormat | None = None, micro_batch_size: int | None = None,
) -> list[float]:
    """Train on demonstrations for ``steps`` steps; return the loss per step (each also a line of
    ``log_to`` when given).

    ``data_offset`` keeps SFT examples apart from the RL stream's first prompts. ``episodes``: the
    run's episode format (``EpisodeFormat.of(trainer.generator)``) in an environment run, so that
    demonstrations are rendered as its episodes are. ``micro_batch_size``: demonstrations per
    forward/backward (None: the whole batch at once); the gradient is the batch's either way.
    """
    if task.demonstrate is None:
        raise ConfigError(no_demonstrations(task.name))
    check_demonstrations(task, episodes, data_offset)
    device = next(model.parameters()).device
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    losses, cursor = [], data_offset
    for step in range(steps):
        rows, masks, cursor = demo_rows(tokenizer, task, cursor, batch_size, episodes)
        opt.zero_grad(set_to_none=True)
        losses.append(accumulate(model, rows, masks, tokenizer.pad_token_id, device, micro_batch_size or len(rows)))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        lr_used = sched.get_last_lr()[0]
        opt.step()
        sched.step()
        if log_to is not None:
            with open(log_to, "a") as f:  # appended per step: a run stopped mid-warm-start keeps its lines
                f.write(json.dumps({"sft_step": step + 1, "sft/loss": losses[-1], "sft/lr": lr_used}) + "\n")
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    return losses


def warm_start(trainer, on_step: Callable[[int, float], None] | None = None, log_to: Path | None = None,
               settings=None) -> list[float]:
    """``sft.*`` (or ``settings``, an ``SFTConfig``) on a ``train.loop.Trainer``'s model: demonstrations
    rendered as its episodes are (an environment run), ``optim.micro_batch_size`` per forward; what
    ``rollwise train`` and ``rollwise sft`` run."""
    s = settings or trainer.cfg.sft
    losses = sft(trainer.model, trainer.tokenizer, trainer.task, steps=s.steps, batch_size=s.batch_size, lr=s.lr,
                 on_step=on_step, log_to=log_to, episodes=EpisodeFormat.of(trainer.generator),
                 micro_batch_size=trainer.cfg.optim.micro_batch_size)
    # an engine sampling from its own copy (rollout.engine_dtype bf16) cast the weights before the warm start:
    # it re-reads them now, at the same version (a token's version counts RL updates, not SFT steps)
    version = trainer.engine.version
    trainer.engine.load_weights(trainer.model)
    trainer.engine.version = version
    return losses


def accumulate(model, rows, masks, pad_id: int, device, micro: int) -> float:
    """Backward of the mean negative log-likelihood over every trained token of ``rows``, ``micro`` rows
    per forward; returns that mean."""
    total = float(sum(sum(m[1:]) for m in masks))  # the positions predicted: a row's first id never is
    loss_sum = 0.0
    for at in range(0, len(rows), micro):
        ids, attn, loss_mask = pad(rows[at: at + micro], masks[at: at + micro], pad_id, device)
        logprobs, _ = token_logprobs_and_entropy(model, ids, attn, with_entropy=False)
        loss = -(logprobs * loss_mask).sum() / total
        loss.backward()
        loss_sum += loss.item()
    return loss_sum


def check_demonstrations(task: Task, episodes: EpisodeFormat | None, row: int) -> None:
    """Tool demonstrations need an environment run whose tools they call: a ConfigError naming the setting
    otherwise (checked on the first demonstration)."""
    demo = next((d for d in map(task.demonstrate, map(task.train.get, range(row, row + 100))) if d is not None), None)
    if not isinstance(demo, Conversation):
        return
    if episodes is None:
        raise ConfigError(f"task {task.name!r}: the SFT demonstrations are tool episodes (task.tool_demos) but the run "
                          "has no environment: set rollout.environment (e.g. calculator), or task.tool_demos=false")
    tools = [s["function"]["name"] for s in episodes.schemas]
    missing = sorted({c.name for c in demo.calls()} - set(tools))
    if missing:
        fix = ("use rollout.environment=calculator" if episodes.owner == "rollout.environment" else
               "declare them there: TOOLS = [<the schemas its calls send>] beside the harness function")
        raise ConfigError(f"task {task.name!r}: the tool demonstrations call {', '.join(missing)}, which "
                          f"{episodes.owner} does not have (its tools: {', '.join(tools) or 'none'}); {fix}")


def no_demonstrations(task_name: str) -> str:
    """What to set when ``sft.steps > 0`` on a task that has no demonstrations."""
    if task_name == "file":
        return ("sft.steps > 0 but task 'file' has no demonstrations: set task.demo_field to the column holding a "
                "worked completion for each prompt, or sft.steps=0 to skip the SFT warm start")
    return f"sft.steps > 0 but task '{task_name}' has no demonstrations for the SFT warm start: set sft.steps=0"
