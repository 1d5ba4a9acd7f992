"""``task.labels``: train with the reference answers, or with them hidden (label-free RL).

``task.labels: none`` wraps the task's train stream (``HiddenLabels``): every train prompt
reaches training with ``answer`` None and the columns holding the reference answer (``answer``,
a file task's ``answer_field``) None, so no reward function, controller or log sees it; the answer moves to
``Prompt.hidden_answer``, which only ``train/pseudo_label_acc`` reads (``majority_vote``
measures how often its pseudo-label is right). The eval split is untouched: eval accuracy,
pass@k and maj@k use the true labels. Training then needs a reward that does without them —
``rewards: [{name: majority_vote}]`` — and a config without one is refused.

Only tasks whose verifier checks a reference answer have the key (arith, file, reasoning_gym);
countdown and the code tasks check a completion against the prompt itself (its target, its
tests), so there is no label to hide.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from rollwise.tasks.base import PromptSource, Task
from rollwise.types import Prompt

LabelsMode = Literal["given", "none"]
LABEL_FREE_REWARDS = ("majority_vote",)  # rewards that train without reference answers


def labels_field():
    """The ``labels`` key of a task whose verifier checks a reference answer."""
    return Field("given", description="given: training reads the reference answers; none: they are hidden from "
                 "training (label-free RL: needs rewards: [{name: majority_vote}]); eval always uses them")


def hide(prompt: Prompt, fields: tuple[str, ...] = ()) -> Prompt:
    """A copy of ``prompt`` without its reference answer: ``answer`` None, the ``answer`` column and
    the columns named in ``fields`` (a file task's ``answer_field``) None, the answer kept in
    ``hidden_answer``; a prompt without an answer as it is.

    >>> p = hide(Prompt("p", "2+2=", answer="4", columns={"a": 2, "answer": "4", "solution": "4"}), ("solution",))
    >>> p.answer, p.columns, p.hidden_answer, p.reward_columns()["answer"]
    (None, {'a': 2, 'answer': None, 'solution': None}, '4', None)
    """
    truth = prompt.answer if prompt.answer is not None else prompt.columns.get("answer")
    if truth is None:
        return prompt
    columns = {k: None if k == "answer" or k in fields else v for k, v in prompt.columns.items()}
    columns.setdefault("answer", None)  # the verifier's keyword is there, with nothing in it
    return dataclasses.replace(prompt, answer=None, columns=columns, hidden_answer=str(truth))


@dataclass
class HiddenLabels:
    """A train stream whose prompts come without their reference answers (``hide``)."""

    source: PromptSource
    fields: tuple[str, ...] = ()  # other columns holding the answer (a file task's answer_field)

    def get(self, index: int) -> Prompt:
        return hide(self.source.get(index), self.fields)


def with_labels(task: Task, task_cfg) -> Task:
    """``task`` as training sees it under ``task_cfg.labels``: ``none`` hides the train answers (never
    the eval split's); ``given`` (and a task without the key) leaves it as it is."""
    if getattr(task_cfg, "labels", "given") != "none":
        return task
    field = getattr(task_cfg, "answer_field", None)
    return dataclasses.replace(task, train=HiddenLabels(task.train, (field,) if field else ()))


def check_labels(task_cfg, rewards) -> None:
    """``task.labels: none`` needs a label-free reward among ``rewards`` (else every rollout would score 0)."""
    if getattr(task_cfg, "labels", "given") != "none":
        return
    names = [r.name for r in rewards or []]
    if not any(n in LABEL_FREE_REWARDS for n in names):
        raise ValueError("task.labels: none hides the reference answers from training, so the task's verifier "
                         "would score every rollout 0: add a label-free reward, rewards: [{name: majority_vote}]"
                         + (f" (rewards now: {', '.join(names)})" if names else ""))
