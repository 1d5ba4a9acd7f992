"""The HTTP side: a FastAPI app with OpenAI's routes over a ``ChatService``, and ``Server``, which
runs it with uvicorn on a thread while the calling thread drives the engine.

Routes: ``GET /v1/models``, ``POST /v1/chat/completions``, ``GET /health``; the same under
``/episodes/{tag}/v1/...`` (an agent harness's base URL: every call is recorded under ``tag``;
the ``X-Rollwise-Episode`` header does the same on the plain routes). Every error — an unknown
model, malformed messages or JSON, a completion that does not fit the context, anything
unexpected — is answered in OpenAI's error shape; none stops the server. (FastAPI is imported at
module level: only ``rollwise serve`` and ``rollout.harness`` import this package.)
"""

from __future__ import annotations

import asyncio
import threading
import time

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from rollwise.serve.schema import ApiError, ChatRequest
from rollwise.serve.service import ChatService


def create_app(service: ChatService) -> FastAPI:
    app = FastAPI(title="rollwise", docs_url=None, redoc_url=None)

    @app.exception_handler(ApiError)
    async def api_error(_, err: ApiError):
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":  # its loc is ("body", character offset): no field to name
            at, why = first["loc"][-1], first.get("ctx", {}).get("error", "")
            return JSONResponse(ApiError(400, f"body: not valid JSON ({why} at character {at})", "body").body(),
                                status_code=400)
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        where = ".".join(loc) or "body"
        return JSONResponse(ApiError(400, f"{where}: {first.get('msg')}", where).body(), status_code=400)

    @app.exception_handler(Exception)
    async def unexpected(_, err: Exception):
        error = ApiError(500, f"internal error: {type(err).__name__}: {err}", kind="server_error")
        return JSONResponse(error.body(), status_code=500)

    def models() -> dict:
        return {"object": "list", "data": [{"id": service.model_name, "object": "model", "created": 0,
                                            "owned_by": "rollwise"}]}

    async def chat(body: ChatRequest, tag: str | None, request: Request):
        # a client that goes away before its (non-streamed) answer cancels the request: its sequences are
        # aborted at the engine's next step, as a stream's are when its client goes (StreamingResponse)
        work, gone = asyncio.ensure_future(service.complete(body, tag)), asyncio.ensure_future(_gone(request))
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not work.done():
            work.cancel()
            return Response(status_code=499)  # "client closed request": nobody reads it
        result = work.result()
        if isinstance(result, dict):
            return result
        return StreamingResponse(result, media_type="text/event-stream")

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "policy_version": service.engine.version}

    @app.get("/v1/models")
    def list_models() -> dict:
        return models()

    @app.get("/episodes/{tag}/v1/models")
    def list_models_tagged(tag: str) -> dict:
        return models()

    @app.post("/v1/chat/completions")
    async def completions(body: ChatRequest, request: Request, x_rollwise_episode: str | None = Header(None)):
        return await chat(body, x_rollwise_episode, request)

    @app.post("/episodes/{tag}/v1/chat/completions")
    async def completions_tagged(tag: str, body: ChatRequest, request: Request):
        return await chat(body, tag, request)

    return app


async def _gone(request: Request) -> None:
    """Returns when the client disconnects (the body is read by then: what else arrives is empty)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Server:
    """The endpoint on ``host:port`` (0 = a free port) on a uvicorn thread; ``drive(stop)`` runs
    the engine in the calling thread until ``stop()``; ``close()`` shuts the HTTP side down."""

    def __init__(self, service: ChatService, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.service = service
        config = uvicorn.Config(create_app(service), host=host, port=port, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="rollwise-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the endpoint did not start on {host}:{port} (is the port taken?)")
            time.sleep(0.01)
        self.host = host
        self.port = self._server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def episode_url(self, tag: str) -> str:
        return f"http://{self.host}:{self.port}/episodes/{tag}/v1"

    def drive(self, stop) -> None:
        self.service.driver.run(stop)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve_engine(engine, tokenizer, fmt, *, model_name: str, seed: int = 0, default_max_tokens: int = 512,
                 host: str = "127.0.0.1", port: int = 0) -> Server:
    """An endpoint for ``engine`` (started; drive it with ``server.drive(stop)``)."""
    from rollwise.serve.driver import EngineDriver

    max_len = getattr(engine, "max_len", None) or engine.model.config.max_position_embeddings
    driver = EngineDriver(engine, lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    service = ChatService(driver, tokenizer, fmt, model_name=model_name, max_len=max_len, seed=seed,
                          default_max_tokens=default_max_tokens)
    return Server(service, host, port)
