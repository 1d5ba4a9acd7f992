"""Two training loops judged side by side: one step at a time, in lockstep, by one evaluator.

``rollwise bench trl`` runs rollwise's and TRL's loops through these: each arm's loop runs in
its own thread but only while it holds the baton, so the arms never overlap and who goes
first alternates; each keeps its own global RNG state across hand-overs; the ``Evaluator``
(plain greedy HF ``generate``) judges both, outside the timed span.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import numpy as np
import torch

from rollwise.types import Prompt, is_correct


class Evaluator:
    """Greedy accuracy of a model on fixed prompts: plain HF ``generate`` (left-padded batches of the
    prompts' token ids, chat prompts through the chat template), judged by the task's reward."""

    def __init__(self, prompts: list[Prompt], judge: Callable, max_new_tokens: int, batch_size: int = 64):
        self.prompts, self.judge, self.max_new_tokens, self.batch_size = prompts, judge, max_new_tokens, batch_size

    @torch.no_grad()
    def accuracy(self, model, tokenizer) -> tuple[float, float]:
        from transformers import GenerationConfig

        from rollwise.bench.engine import left_pad
        from rollwise.model.load import encode_prompt

        gen = GenerationConfig(do_sample=False, max_new_tokens=self.max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                               pad_token_id=tokenizer.pad_token_id)
        was_training = model.training
        model.eval()
        completions, lengths = [], []
        for start in range(0, len(self.prompts), self.batch_size):
            # the arms' own prompt tokens: chat prompts through the chat template (rollwise's encode_prompt)
            ids, mask = left_pad([encode_prompt(tokenizer, p) for p in self.prompts[start : start + self.batch_size]],
                                  tokenizer.pad_token_id)
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)[:, ids.shape[1] :]
            for row in out.tolist():
                ids = row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row
                lengths.append(len(ids))
                completions.append(tokenizer.decode(ids, skip_special_tokens=True))
        model.train(was_training)
        cols = [p.reward_columns() for p in self.prompts]
        columns = {k: [c.get(k) for c in cols] for k in sorted({k for c in cols for k in c})}
        scores = self.judge(prompts=[p.text for p in self.prompts], completions=completions, completion_ids=None,
                            **columns)
        return sum(is_correct(float(s)) for s in scores) / len(scores), sum(lengths) / len(lengths)

    def record(self, model, tokenizer, step: int, seconds: float) -> dict:
        acc, length = self.accuracy(model, tokenizer)
        return {"step": step, "accuracy": acc, "mean_length": length, "train_seconds": seconds}


class Lockstep:
    """Runs the arms' training loops one step at a time, strictly alternating, in threads.

    An arm's loop calls ``arm.step_done(record)`` at the end of each step; that records the
    step's loop time, evaluates when due (untimed), then parks the thread until the conductor
    hands it the baton again.
    """

    def __init__(self, arms: dict, eval_every: int, evaluator: Evaluator):
        self.arms = arms
        for arm in arms.values():
            arm.attach(eval_every, evaluator)

    def run(self, steps: int, order: list[str], on_step: Callable[[int], None]) -> None:
        try:
            for step in range(1, steps + 1):
                for name in (order if step % 2 else order[::-1]):  # alternate who goes first
                    self.arms[name].advance()
                on_step(step)
            for arm in self.arms.values():  # let each loop finish (its final eval, summary) alone
                arm.advance(final=True)
        finally:
            for arm in self.arms.values():
                arm.stop()


class Arm:
    """A training loop in a thread that runs only while it holds the baton."""

    name = "arm"

    def __init__(self, steps: int) -> None:
        self.last_step = steps
        self.model = self.tokenizer = None  # set by the subclass: what the evaluator runs
        self.go, self.parked = threading.Semaphore(0), threading.Semaphore(0)
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.aborted = False
        self.rng = rng_state()
        self.records: list[dict] = []
        self.evals: list[dict] = []
        self.started_at = 0.0

    def attach(self, eval_every: int, evaluator: Evaluator) -> None:
        self.eval_every, self.evaluator = eval_every, evaluator

    def loop(self) -> None:  # the framework's training loop, calling self.step_done after each step
        raise NotImplementedError

    def _body(self) -> None:
        self.go.acquire()
        try:
            if not self.aborted:
                set_rng_state(self.rng)
                self.started_at = time.perf_counter()
                self.loop()
        except BaseException as err:  # handed to the conductor, raised there
            self.error = err
        finally:
            self.parked.release()

    def advance(self, final: bool = False) -> None:
        """Give this arm the baton: run one step (or, ``final``, the rest of its loop); wait for it."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._body, name=f"bench-{self.name}", daemon=True)
            self.thread.start()
        self.go.release()
        self.parked.acquire()
        if final and self.thread is not None:
            self.thread.join()
        if self.error is not None and not isinstance(self.error, _Aborted):
            raise self.error

    def mark_start(self) -> None:
        """The step clock starts now (after the framework's own setup and initial eval)."""
        self.started_at = time.perf_counter()

    def step_done(self, record: dict) -> None:
        record["began"] = self.started_at
        record["loop"] = time.perf_counter() - self.started_at
        record["other"] = record["loop"] - record["generate"] - record["score"] - record["update"]
        self.records.append(record)
        step = len(self.records)
        if step % self.eval_every == 0 or step == self.last_step:
            seconds = sum(r["loop"] for r in self.records)
            self.evals.append(self.evaluator.record(self.model, self.tokenizer, step, seconds))
        self.rng = rng_state()
        self.parked.release()
        self.go.acquire()
        if self.aborted:
            raise _Aborted()
        set_rng_state(self.rng)
        self.started_at = time.perf_counter()

    def stop(self) -> None:
        if self.thread is not None and self.thread.is_alive():
            self.aborted = True
            self.go.release()
            self.thread.join(timeout=60)

    def result(self) -> dict:
        return {"steps": self.records, "evals": self.evals}


class _Aborted(Exception):
    """Unwinds an arm's loop when the conductor stops early."""


def rng_state() -> tuple:
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def set_rng_state(state: tuple) -> None:
    torch.set_rng_state(state[0])
    random.setstate(state[1])
    np.random.set_state(state[2])
