"""Where a ``judge`` reward's requests go: a local model on rollwise's own engine, or any
OpenAI-compatible server.

A backend is anything with ``complete(texts) -> list[JudgeReply]``: one reply per request text,
in order, never raising for one bad request (its reply carries ``error``; the judge scores that
completion 0 with the reason). ``rollwise.filter.judge`` sends it every request of a scoring call
at once (one batch per step). Tests use a scripted backend of fixed texts.

- ``LocalBackend``: any ``model.path`` form (a HF directory, a ``.gguf`` file, ``pkg:...``, a
  run directory, or a tiny preset) loaded by ``rollwise.model.load`` in the judge's own dtype, and
  sampled greedily on ``rollwise.engine.make_engine``. ``model.threads`` applies while the judge
  runs (torch's thread count is per process: the previous count is restored after each batch).
  A request longer than the model's context keeps its last tokens (where the template asks for
  the score).
- ``HttpBackend``: ``POST {base_url}/chat/completions`` with the standard library (no client
  dependency), ``concurrency`` requests at a time, two retries on a connection error or a 5xx;
  tokens are read from the server's ``usage`` (0 where it reports none).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace

import torch


@dataclass
class JudgeReply:
    text: str | None  # the judge's answer; None when the request failed
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None  # why the request failed (the completion scores 0 with it)


@contextlib.contextmanager
def torch_threads(n: int | None):
    """``torch.set_num_threads(n)`` for the block, the previous count restored (None: unchanged)."""
    if not n:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class LocalBackend:
    """A judge model on rollwise's engine, greedy, in its own dtype (``JudgeConfig.model``)."""

    def __init__(self, model_cfg, max_new_tokens: int, max_batch_size: int, seed: int = 0):
        from rollwise.engine import make_engine
        from rollwise.model.load import load_model_and_tokenizer

        self.model, self.tokenizer = load_model_and_tokenizer(model_cfg, seed=seed)
        self.model.requires_grad_(False)  # never trained: no gradients kept
        self.engine = make_engine(self.model, pad_token_id=self.tokenizer.pad_token_id,
                                  max_batch_size=max_batch_size, seed=seed)
        self.max_new_tokens, self.threads = max_new_tokens, model_cfg.threads
        context = getattr(self.model.config, "max_position_embeddings", None) or 4096
        self.max_prompt = max(1, context - max_new_tokens)

    def encode(self, text: str) -> list[int]:
        """The request as one user message (the chat template where the tokenizer has one), its
        last ``max_prompt`` tokens."""
        from rollwise.model.load import encode_prompt

        ids = encode_prompt(self.tokenizer, SimpleNamespace(messages=[{"role": "user", "content": text}], text=text))
        return list(ids)[-self.max_prompt:]

    def complete(self, texts: list[str]) -> list[JudgeReply]:
        from rollwise.engine.engine import Request
        from rollwise.engine.sampling import SamplingParams

        params = SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens,
                                stop_token_ids=(self.tokenizer.eos_token_id,))
        requests = [Request(self.encode(t), params) for t in texts]
        with torch_threads(self.threads), torch.no_grad():
            done = self.engine.generate(requests)
        return [JudgeReply(self.tokenizer.decode(c.token_ids, skip_special_tokens=True), len(c.prompt_ids),
                           len(c.token_ids)) for c in done]


class HttpBackend:
    """Any OpenAI-compatible ``/v1/chat/completions`` (``JudgeConfig.base_url``), greedy."""

    RETRIES = 2

    def __init__(self, base_url: str, model: str, api_key_env: str, max_new_tokens: int, concurrency: int,
                 timeout_s: float):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.max_new_tokens, self.concurrency, self.timeout_s = model, max_new_tokens, concurrency, timeout_s
        self.key = os.environ.get(api_key_env, "")

    def complete(self, texts: list[str]) -> list[JudgeReply]:
        if not texts:
            return []
        with ThreadPoolExecutor(min(self.concurrency, len(texts))) as pool:
            return list(pool.map(self.one, texts))

    def one(self, text: str) -> JudgeReply:
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": text}],
                           "max_tokens": self.max_new_tokens, "temperature": 0.0}).encode()
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        for attempt in range(self.RETRIES + 1):
            try:
                request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return _reply(json.loads(response.read()))
            except urllib.error.HTTPError as err:
                error = f"HTTP {err.code} from {self.url}"
                if err.code < 500:  # the request itself is wrong: retrying will not help
                    break
            except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as err:
                error = f"{type(err).__name__}: {err}"
            if attempt < self.RETRIES:
                time.sleep(0.5 * (attempt + 1))
        return JudgeReply(None, error=f"request failed ({error})")


def _reply(body: dict) -> JudgeReply:
    """A chat-completions response body as a ``JudgeReply`` (a malformed one raises, caught by the caller)."""
    text = body["choices"][0]["message"]["content"]
    usage = body.get("usage") or {}
    return JudgeReply(str(text or ""), int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
