"""Prompt rewrites for ``clpo`` (``control/clpo.py``): the task's answer-keeping templates, or a model's.

A rewriter is ``(prompt, kind, shift) -> (rewritten prompt or None, tokens it cost)``, ``kind`` is
``diversify`` (restate) or ``simplify`` (add a given). The controller sets the rewrite's id and checks
that its reference answer is the original's.

- ``template_rewrite``: through the task generator's parameters. ``arith`` (columns a, op, b):
  diversify restates the same sum (a+b as b+a, a·b as b·a, a−b as (a+k)−(b+k), k = ``shift``);
  simplify adds the first column of the working after the prompt (a product, or one column: none).
  A prompt of another task has no template (None).
- ``ModelRewriter``: the judge interface's backend (``filter/judge.py``: a local model on rollwise's
  engine or an OpenAI-compatible server) asked to restate or simplify keeping the answer
  (``REWRITE_REQUEST``); the reply's first line is the new prompt text, the answer and columns are
  the original's; an empty or failed reply gives None. Whether the model kept the answer is not
  checked — the drop rule (4 rollouts that all agree) catches a rewrite it broke only partly.
"""

from __future__ import annotations

import dataclasses

from rollwise.types import Prompt

REWRITE_REQUEST = {
    "diversify": "Restate this problem in different words. Keep every number and the answer ({answer}) the same.\n"
                 "Problem: {prompt}\nRestated problem:",
    "simplify": "Make this problem easier by adding one helpful given fact. Keep the answer ({answer}) the same.\n"
                "Problem: {prompt}\nEasier problem:",
}


def arith_rewrite(prompt: Prompt, kind: str, shift: int) -> Prompt | None:
    """The ``arith`` rewrite of ``prompt``, or None when there is none.

    >>> from rollwise.tasks.arith import make_prompt
    >>> p = make_prompt("p", 347, "+", 58)
    >>> [(q.text, q.answer) for q in (arith_rewrite(p, "diversify", 3), arith_rewrite(p, "simplify", 3))]
    [('58+347=', '405'), ('347+58= 7+8+0=15', '405')]
    """
    from rollwise.filter.arith import solve
    from rollwise.tasks.arith import make_prompt

    c = prompt.columns or {}
    if not {"a", "op", "b"} <= set(c):
        return None
    a, op, b = c["a"], c["op"], c["b"]
    if kind == "diversify":
        return make_prompt(prompt.id, *((b, op, a) if op in "+*" else (a + shift, op, b + shift)))
    steps = solve(a, op, b).rsplit("#", 1)[0].split()
    if len(steps) < 2:  # no working (a product) or one column: nothing to give
        return None
    new = make_prompt(prompt.id, a, op, b)
    return dataclasses.replace(new, text=f"{new.text} {steps[0]}")


def template_rewrite(prompt: Prompt, kind: str, shift: int) -> tuple[Prompt | None, int]:
    return arith_rewrite(prompt, kind, shift), 0


class ModelRewriter:
    """Rewrites written by a model through the judge interface's backend (``complete(texts)``)."""

    def __init__(self, backend) -> None:
        self.backend = backend

    def __call__(self, prompt: Prompt, kind: str, shift: int) -> tuple[Prompt | None, int]:
        from rollwise.filter.rewards import as_text

        reply = self.backend.complete([REWRITE_REQUEST[kind].format(prompt=as_text(prompt.text),
                                                                    answer=prompt.answer)])[0]
        tokens = reply.prompt_tokens + reply.completion_tokens
        text = (reply.text or "").strip().split("\n")[0].strip()
        if not text:
            return None, tokens
        return dataclasses.replace(prompt, text=text, token_ids=[], messages=None,
                                   columns=dict(prompt.columns or {})), tokens


def build_rewriter(clpo, seed: int = 0):
    """The rewriter ``control.clpo`` names: the templates, or a model from its ``judge`` section."""
    if clpo.rewriter == "template":
        return template_rewrite
    from rollwise.config import ConfigError
    from rollwise.filter.judge import JudgeConfig, build_backend

    try:
        judge = JudgeConfig.model_validate(clpo.judge)
    except ValueError as e:
        raise ConfigError(f"control.clpo.judge: {e}") from None
    return ModelRewriter(build_backend(judge, seed))
