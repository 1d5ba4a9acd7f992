"""An OpenAI-compatible endpoint on rollwise's engine (``rollwise serve``; ``rollout.harness``).

``serve_engine(engine, tokenizer, fmt, model_name=...)`` starts ``/v1/chat/completions`` on
127.0.0.1 (``serve/app.py``); the calling thread drives the engine (``server.drive(stop)``), so
concurrent requests share its continuous batches (``serve/driver.py``). Calls under an episode's
base URL are recorded token-faithfully (``serve/service.py``) for training. FastAPI, uvicorn and
the ``openai`` client are the ``rollwise[serve]`` extra: nothing here is imported by the core.
"""

from rollwise.serve.app import Server, serve_engine

__all__ = ["Server", "serve_engine"]
