"""The HTTP side: a FastAPI app with OpenAI's routes over a ``ChatService``, and ``Server``, which
runs it with uvicorn on a thread while the calling thread drives the engine.

Routes: ``GET /v1/models``, ``POST /v1/chat/completions``, ``GET /health``; the same under
``/episodes/{tag}/v1/...`` (an agent harness's base URL: every call is recorded under ``tag``;
the ``X-Rollwise-Episode`` header does the same on the plain routes); ``DELETE /episodes/{tag}``
forgets a tag's record and aborts its requests (not on a training run's endpoint: the run closes
its episodes). Every error — an unknown model, malformed messages or JSON, a completion that does
not fit the context, anything unexpected — is answered in OpenAI's error shape; none stops the
server. (FastAPI is imported at module level: only ``rollwise serve`` and ``rollout.harness``
import this package.)

Before any route (``Guard``): the Host header must name the address the server is bound to or a
loopback name (421 otherwise: a web page whose DNS name was rebound to 127.0.0.1 cannot reach
it); with an ``api_key``, every route but ``/health`` needs ``Authorization: Bearer <key>`` (401);
a body past ``max_body_mb`` is refused (413) before it is parsed.
"""

from __future__ import annotations

import asyncio
import hmac
import threading
import time

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from rollwise.serve.schema import ApiError, ChatRequest
from rollwise.serve.service import ChatService


LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARD = frozenset({"0.0.0.0", "::", ""})


def create_app(service: ChatService, *, api_key: str | None = None, host: str = "127.0.0.1",
               max_body_mb: float = 8.0) -> FastAPI:
    """The app; ``host``: the address it is served on (the Host header is checked against it)."""
    app = FastAPI(title="rollwise", docs_url=None, redoc_url=None)
    app.add_middleware(Guard, api_key=api_key, hosts=None if host in WILDCARD else LOOPBACK | {host.lower()},
                       max_body=int(max_body_mb * (1 << 20)))

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

    @app.delete("/episodes/{tag}")
    def close_episode(tag: str) -> dict:
        if service.episodes.open_tags_only:
            raise ApiError(403, "this endpoint serves a training run: its episodes are closed by the run", "tag",
                           "episode_owned_by_run")
        return {"id": tag, "object": "episode", "deleted": service.episodes.close(tag) is not None}

    return app


async def _gone(request: Request) -> None:
    """Returns when the client disconnects (the body is read by then: what else arrives is empty)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Guard:
    """ASGI middleware run before any route: Host header, API key, body size (module docstring)."""

    def __init__(self, app, *, api_key: str | None, hosts: frozenset[str] | None, max_body: int):
        self.app, self.key, self.hosts, self.max_body = app, api_key, hosts, max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refused = self._refuse(scope, headers)
        if refused is None and scope["method"] in ("POST", "PUT", "PATCH"):
            body, refused = await self._body(headers, receive)
            receive = _replay(body, receive)
        if refused is not None:
            return await refused(scope, receive, send)
        return await self.app(scope, receive, send)

    def _refuse(self, scope, headers: dict[str, str]) -> JSONResponse | None:
        name = _host_name(headers.get("host", ""))
        if self.hosts is not None and name not in self.hosts:
            return _error(421, f"Host {headers.get('host', '')!r} is not this server's (it answers "
                          f"{', '.join(sorted(self.hosts))})", "invalid_host")
        if self.key is None or scope["path"] == "/health":
            return None
        given = headers.get("authorization", "")
        if not hmac.compare_digest(given.encode("latin-1"), f"Bearer {self.key}".encode("latin-1")):
            return _error(401, "Incorrect API key provided: send the server's key as 'Authorization: Bearer <key>' "
                          "(the openai client's api_key)", "invalid_api_key")
        return None

    async def _body(self, headers: dict[str, str], receive) -> tuple[bytes, JSONResponse | None]:
        """The whole body, read before anything parses it; past ``max_body`` bytes, a 413 instead."""
        too_big = _error(413, f"the request body is larger than this server's limit ({self.max_body} bytes)",
                         "request_too_large")
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body:
            return b"", too_big
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body:
                return b"", too_big
            if not message.get("more_body", False):
                break
        return b"".join(chunks), None


def _replay(body: bytes, receive):
    """``receive`` that gives the buffered body once, then what the client sends (a disconnect)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _host_name(host: str) -> str:
    """The name in a Host header, without its port (``[::1]:80`` → ``::1``)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(ApiError(status, message, code=code).body(), status_code=status)


class Server:
    """The endpoint on ``host:port`` (0 = a free port) on a uvicorn thread; ``drive(stop)`` runs
    the engine in the calling thread until ``stop()``; ``close()`` shuts the HTTP side down."""

    def __init__(self, service: ChatService, host: str = "127.0.0.1", port: int = 0, *, api_key: str | None = None,
                 max_body_mb: float = 8.0):
        import uvicorn

        self.service, self.api_key = service, api_key
        app = create_app(service, api_key=api_key, host=host, max_body_mb=max_body_mb)
        # keep-alive past the clients' own idle expiry (httpx, hence openai: 5 s): the client closes an idle
        # connection first, never the server under a request the client has just sent on it (a ReadError)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=1, timeout_keep_alive=60)
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
                 host: str = "127.0.0.1", port: int = 0, api_key: str | None = None, max_model_len: int | None = None,
                 max_body_mb: float = 8.0, **limits) -> Server:
    """An endpoint for ``engine`` (started; drive it with ``server.drive(stop)``).

    ``api_key``: required from every client (``Authorization: Bearer``); ``max_model_len``: the most
    prompt + max_tokens a request may ask (default: the engine's ``max_len``) — the slot engine's
    cache grows to the longest request it admits and keeps that size; ``limits``: ``ChatService``'s
    caps (``open_tags_only``, ``kv_cache_mb``, ``max_calls``, ``max_tag_tokens``, ``max_n``, ...)."""
    from rollwise.serve.driver import EngineDriver

    max_len = getattr(engine, "max_len", None) or engine.model.config.max_position_embeddings
    driver = EngineDriver(engine, lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    service = ChatService(driver, tokenizer, fmt, model_name=model_name, max_len=min(max_len, max_model_len or max_len),
                          seed=seed, default_max_tokens=default_max_tokens, **limits)
    return Server(service, host, port, api_key=api_key, max_body_mb=max_body_mb)
