"""The HTTP face of `mlxswitch serve`: a Starlette app over one worker (one answer at a time, or
a batch of them), run by uvicorn.

Every refusal is OpenAI's error object with a 4xx status; the server goes on after each. The
body is read with a byte limit before it is parsed, and the API key is compared in constant time.
"""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass, field

from jinja2 import TemplateError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..decoding.answer import AnswerSummary
from ..decoding.session import GenerationSettings
from ..errors import MlxSwitchError, PromptTooLongError, RequestError
from . import responses as out
from .batch_worker import BatchWorker
from .requests import Request, ServerLimits, parse_body
from .worker import Worker

RETRY_AFTER_S = 2


@dataclass
class ServeConfig:
    """What the app serves and how: the served profile's name, the defaults and limits, the key."""

    model: str
    settings: GenerationSettings
    limits: ServerLimits = field(default_factory=ServerLimits)
    api_key: str | None = None
    system: str | None = None  # prepended when a conversation brings no system message
    profiles: list[dict] = field(default_factory=list)  # rows of `mlxswitch models`, for /v1/models


def error_response(error: RequestError) -> JSONResponse:
    """An OpenAI error object with the error's status (429 adds Retry-After)."""
    headers = {"Retry-After": str(RETRY_AFTER_S)} if error.status == 429 else None
    if error.status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    return JSONResponse(out.error_body(error), status_code=error.status, headers=headers)


def build_app(config: ServeConfig, worker: Worker | BatchWorker) -> Starlette:
    """The Starlette app: /v1/chat/completions, /v1/completions, /v1/models[/{id}] and /health."""

    def authorize(request: HttpRequest) -> None:
        if config.api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), config.api_key.encode()
        ):
            raise RequestError(
                "a valid API key is required: send 'Authorization: Bearer KEY'",
                status=401,
                code="invalid_api_key",
            )

    async def read_body(request: HttpRequest) -> bytes:
        limit = config.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise RequestError(
                f"the body is larger than this server accepts ({limit} bytes)",
                status=413,
                code="request_too_large",
            )
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:  # a chunked body that lied about nothing but is too long
                raise RequestError(
                    f"the body is larger than this server accepts ({limit} bytes)",
                    status=413,
                    code="request_too_large",
                )
        return bytes(body)

    def check_model(name: str | None) -> str:
        if name is None or name == config.model:
            return config.model
        shown = name if len(name) <= 80 else name[:80] + "…"
        if any(row["name"] == name for row in config.profiles):
            raise RequestError(
                f"model '{shown}' is not loaded here: this server serves '{config.model}' "
                f"(start another with `mlxswitch serve --profile {name}`)",
                status=404,
                param="model",
                code="model_not_found",
            )
        raise RequestError(
            f"model '{shown}' does not exist: this server serves '{config.model}' (GET /v1/models)",
            status=404,
            param="model",
            code="model_not_found",
        )

    def model_object() -> dict:
        """OpenAI's model object for the served model (the only one this server answers for)."""
        row = next((row for row in config.profiles if row["name"] == config.model), None)
        extension: dict = {"served": True, "available": True}
        if row is not None:
            extension.update(
                mode=row["mode"], decoding=row["decoding"], tiers=row["tiers"], description=row["notes"]
            )
        return {
            "id": config.model,
            "object": "model",
            "created": 0,
            "owned_by": "mlxswitch",
            "mlxswitch": extension,
        }

    def preparer(req: Request):
        if req.kind == "text":
            return lambda session: session.prepare_text(req.prompt, req.settings)
        messages = list(req.messages)
        if config.system and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": config.system})
        return lambda session: session.prepare_conversation(messages, req.settings)

    async def generate(request: HttpRequest, kind: str) -> Response:
        authorize(request)
        req = parse_body(await read_body(request), kind, config.settings)
        model = check_model(req.model)
        try:
            job = await worker.run(preparer(req))
        except PromptTooLongError as exc:
            raise RequestError(
                f"the prompt is {exc.tokens} tokens but the model's context holds {exc.context}",
                param="messages" if kind == "chat" else "prompt",
                code="context_length_exceeded",
            ) from None
        except TemplateError as exc:  # the model's chat template refuses this conversation
            raise RequestError(
                f"the model's chat template refuses these messages: {exc}",
                param="messages",
                code="invalid_conversation",
            ) from None
        ident = out.new_id(kind)
        decode = _decoder(worker.session.ladder.tokenizer) if req.settings.top_logprobs is not None else None
        # An answer the cloud may take over (answer mode) is held until the hand-off chose it.
        cloud = worker.session.cloud
        hold = kind == "chat" and cloud is not None and not cloud.spans_on
        if req.stream:
            return StreamingResponse(
                _sse(job, kind, ident, model, req.include_usage, decode, hold),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        summary = None
        async for item in job.events():
            if isinstance(item, AnswerSummary):
                summary = item
            elif await request.is_disconnected():
                job.stop()
        if summary is None:  # the client left; nobody reads this
            return Response(status_code=499)
        return JSONResponse(out.completion(kind, ident, model, summary, decode))

    async def chat_completions(request: HttpRequest) -> Response:
        return await generate(request, "chat")

    async def completions(request: HttpRequest) -> Response:
        return await generate(request, "text")

    async def models(request: HttpRequest) -> Response:
        authorize(request)
        return JSONResponse({"object": "list", "data": [model_object()]})

    async def model(request: HttpRequest) -> Response:
        authorize(request)
        check_model(request.path_params["model"])
        return JSONResponse(model_object())

    async def health(request: HttpRequest) -> Response:
        last = worker.last_summary
        kept = worker.prompt_caches
        return JSONResponse(
            {
                "status": "ok",
                "model": config.model,
                "generating": worker.busy,
                "waiting": worker.waiting,
                "prompt_cache": None if kept is None else {"conversations": len(kept), "bytes": kept.nbytes},
                "last_answer": None
                if last is None
                else {"finish_reason": last.finish_reason, "tokens": last.generated},
            }
        )

    async def refused(request: HttpRequest, exc: Exception) -> Response:
        if isinstance(exc, RequestError):
            return error_response(exc)
        if isinstance(exc, HTTPException):
            kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
            return error_response(
                RequestError(
                    f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code, type=kind
                )
            )
        if isinstance(exc, ClientDisconnect):
            return Response(status_code=499)
        if isinstance(exc, MlxSwitchError):  # a setting the request made invalid
            return error_response(RequestError(str(exc)))
        # Reached through Starlette's last-resort middleware, which logs the traceback (server side only).
        return error_response(
            RequestError(f"internal error: {type(exc).__name__}", status=500, type="server_error")
        )

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    # Specific classes are answered where raised; Exception goes through the last-resort middleware.
    handlers = {
        cls: refused for cls in (RequestError, MlxSwitchError, HTTPException, ClientDisconnect, Exception)
    }
    return Starlette(routes=routes, exception_handlers=handlers)


def _decoder(tokenizer):
    """One token id → its text, for log-probability entries."""
    return lambda token: tokenizer.decode([token])


async def _sse(job, kind: str, ident: str, model: str, include_usage: bool, decode, hold: bool = False):
    """The streamed answer: one chunk per token (`hold`: one chunk of the answer shown, once a
    hand-off chose it), the finish chunk, the usage chunk, [DONE]."""
    created, first, offset = int(time.time()), True, 0
    async for item in job.events():  # a client that leaves cancels this: events() stops the job
        if isinstance(item, AnswerSummary):
            if hold:
                yield out.sse(out.held_chunk(kind, ident, model, created, item, decode))
            yield out.sse(out.final_chunk(kind, ident, model, created, item))
            if include_usage:
                yield out.sse(out.usage_chunk(kind, ident, model, created, item))
            break
        if hold:
            continue
        yield out.sse(out.chunk(kind, ident, model, created, [item], first, decode, offset))
        first, offset = False, offset + len(item.text)
    yield out.sse("[DONE]")
