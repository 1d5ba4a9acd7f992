"""The ``reasoning_gym`` verifier: the completion's final answer, scored by its dataset's own ``score_answer``.

The final answer is read in the task's ``answer_format``:

- ``answer_tag``: the content of the last ``<answer>...</answer>`` (reasoning-gym's own
  ``utils.extract_answer``, the convention of its system prompts);
- ``boxed``: the content of the last ``\\boxed{...}`` (braces balanced, as ``math_answer`` reads it);
- ``lenient``: the last ``\\boxed{...}``, else the first number after the last ``answer is`` /
  ``####``, else the last number in the text (``math_answer``'s order, read as a number). A small chat model (SmolLM2-135M)
  answers arithmetic in prose ("6 + 6 = 12.") and never writes a box or a tag unprompted, so
  under a strict format every sample scores 0 and GRPO has no signal; lenient reading scores
  what it says.

It is then scored by reasoning-gym's ``score_answer(answer, entry)`` of the prompt's dataset,
the entry rebuilt from the prompt's columns (``question``, ``answer``, ``metadata``). Scores lie
in [0, 1] and may be fractional: several datasets give partial credit (``chain_sum`` pays
``len(expected)/len(answer)`` when the expected number appears inside a longer answer;
``countdown`` pays 0.05 for a wrong expression over the right numbers); ``rollwise.types.is_correct``
decides what counts as correct. Every verdict has a reason and carries the extracted answer,
whitespace collapsed (``Score.answer``, what maj@k votes with).

Never raises: a missing answer, a dataset this install does not know, or a scorer that raises
on model text all score 0 with the reason. Caveat: the scorers are reasoning-gym's code, and a
few (``countdown``, ``puzzle24``, the algebra datasets) hand the answer to sympy's parser, which
calls ``eval``; answers longer than ``MAX_ANSWER_CHARS`` are not scored, but a scorer is not a
sandbox.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

from rollwise.filter.math_answer import last_boxed
from rollwise.filter.rewards import as_text
from rollwise.types import Score

ANSWER_FORMATS = ("answer_tag", "boxed", "lenient")
MAX_ANSWER_CHARS = 2000
_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)  # reasoning_gym.utils.extract_answer's pattern
_MISSING = {"answer_tag": "no <answer>...</answer> tag", "boxed": "no \\boxed{...} answer", "lenient": "no final answer"}


def extract(completion: str, answer_format: str = "answer_tag") -> str | None:
    """The final answer in ``answer_format`` (stripped), or None when the completion has none.

    >>> extract("<think>2+2</think> <answer> 4 </answer>"), extract("so \\\\boxed{4}.", "boxed"), extract("4")
    ('4', '4', None)
    >>> extract("6 + 6 = 12.", "lenient"), extract("The answer is 12. Here it is: 1", "lenient")
    ('12', '12')
    """
    if answer_format == "boxed":
        return last_boxed(completion)
    if answer_format == "lenient":
        return last_boxed(completion) or _lenient_number(completion)
    matches = _TAG.findall(completion)
    return matches[-1].strip() if matches else None


_MARKER = re.compile(r"####|answer is", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def _lenient_number(completion: str) -> str | None:
    """The first number after the last ``answer is`` / ``####``, else the last number in the text."""
    markers = list(_MARKER.finditer(completion))
    if markers:
        after = _NUMBER.search(completion, markers[-1].end())
        if after:
            return after.group().replace(",", "")
    numbers = _NUMBER.findall(completion)
    return numbers[-1].replace(",", "") if numbers else None


def _short(text: Any, limit: int = 40) -> str:
    text = str(text).replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def score_one(completion: str, entry: dict, scorer: Callable, answer_format: str = "answer_tag") -> Score:
    """Score one completion against one reasoning-gym ``entry`` with its dataset's ``scorer``; never raises.

    >>> entry = {"question": "1 + 12 =", "answer": "13", "metadata": {}}
    >>> contains = lambda answer, entry: len(entry["answer"]) / len(answer) if entry["answer"] in answer else 0.0
    >>> [(float(s), s.reason) for s in (score_one(c, entry, contains) for c in
    ...  ("<answer>13</answer>", "<answer>12</answer>", "13", "<answer>x 13</answer>"))]
    [(1.0, ''), (0.0, 'wrong answer 12 (expected 13)'), (0.0, 'no <answer>...</answer> tag'), (0.5, 'partial credit 0.5 for x 13 (expected 13)')]
    """
    said = None  # the answer read, reported even when the scorer fails (no label under task.labels: none)
    try:
        answer = extract(completion, answer_format)
        if answer is None:
            return Score(0.0, _MISSING.get(answer_format, "no final answer"))
        said = " ".join(answer.split()) or None
        if len(answer) > MAX_ANSWER_CHARS:
            return Score(0.0, f"answer longer than {MAX_ANSWER_CHARS} characters", answer=said)
        value = float(scorer(answer, entry))
        expected = f" (expected {_short(entry['answer'])})" if entry.get("answer") is not None else ""
        if value >= 1.0:
            return Score(value, answer=said)
        if not answer.strip():
            return Score(value, "empty answer")
        if value > 0.0:
            return Score(value, f"partial credit {value:.3g} for {_short(answer)}{expected}", answer=said)
        return Score(value, f"wrong answer {_short(answer)}{expected}", answer=said)
    except Exception as err:  # never raise on model output: a scorer may choke on any text
        return Score(0.0, f"could not score the answer ({type(err).__name__}: {_short(err, 80)})", answer=said)


@functools.lru_cache(maxsize=None)
def _default_scorer(dataset: str) -> Callable | None:
    """reasoning-gym's ``score_answer`` for ``dataset`` under its default config, or None."""
    try:
        from reasoning_gym.factory import get_score_answer_fn

        return get_score_answer_fn(dataset)
    except Exception:  # not installed, or not a dataset of this version
        return None


def make_reward(scorers: Mapping[str, Callable] | None = None, answer_format: str = "answer_tag") -> Callable:
    """The TRL-style reward function, bound to the task's datasets (``scorers``: name → ``score_answer``
    of the configured generator); a dataset not in ``scorers`` uses its default-config scorer."""
    bound = dict(scorers or {})

    def reasoning_gym(prompts, completions, dataset, question, metadata, answer=None, **_) -> list[Score]:
        """TRL-style reward: each completion's final answer scored by its reasoning-gym dataset (partial credit passes through)."""
        answers = answer if answer is not None else [None] * len(completions)
        out = []
        for completion, name, q, meta, expected in zip(completions, dataset, question, metadata, answers):
            scorer = bound.get(name) or _default_scorer(name)
            if scorer is None:
                out.append(Score(0.0, f"unknown reasoning-gym dataset {name!r}"))
                continue
            entry = {"question": q, "answer": expected, "metadata": meta}
            out.append(score_one(as_text(completion), entry, scorer, answer_format))
        return out

    return reasoning_gym


reasoning_gym_reward = make_reward()  # unbound: default-config scorers, <answer> tags
