"""Errors of the team chat API, all in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

`APIError` is what the service and the routes raise; `install_error_handlers` makes FastAPI answer
it, request validation failures (400), HTTP errors (status kept, type from the status) and any crash (500)
in that shape. `ERROR_RESPONSES` documents those answers in the OpenAPI schema of a route. A crash is
logged with its traceback (logger `teamtr.serving`) and named in its answer, with the graph, node and
task a failing episode adds (graphs/capture.py `EpisodeContext`).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from teamtr.client.protocol import ErrorResponse, error_body
from teamtr.engines.vllm_http import VLLMRequestError
from teamtr.graphs.capture import describe_error

log = logging.getLogger("teamtr.serving")

# the longest Retry-After a 429 asks for: a client told to wait longer would find its pooled connection
# closed; cli/serve.py keeps connections alive longer than this
MAX_RETRY_AFTER_S = 30

# OpenAI's error type for each status a route can answer besides 400 (invalid_request_error) and 500
TYPE_OF_STATUS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
}

# every error status a route can answer: 409 (candidate state, tracing off), 499 (client gone), 500, 503
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 401, 403, 404, 408, 409, 413, 429, 499, 500, 503)
}


class APIError(Exception):
    """An error answer: HTTP status plus the fields of OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers


def too_many_requests(message: str, retry_after_s: float, code: str) -> APIError:
    """429 in OpenAI's shape with a Retry-After header (whole seconds, 1 to MAX_RETRY_AFTER_S)."""
    seconds = min(MAX_RETRY_AFTER_S, max(1, math.ceil(retry_after_s)))
    return APIError(
        429,
        f"{message}; retry after {seconds} s",
        "rate_limit_error",
        code=code,
        headers={"Retry-After": str(seconds)},
    )


def error_response(
    status: int,
    message: str,
    type_: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


async def _api_error(_: Request, e: APIError) -> JSONResponse:
    return error_response(e.status, e.message, e.type, e.param, e.code, e.headers)


async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
    first = e.errors()[0] if e.errors() else {}
    if first.get("type") == "json_invalid":
        return error_response(
            400, "the request body is not valid JSON", "invalid_request_error", code="json_invalid"
        )
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "extra_forbidden" and loc:
        name = ".".join(loc)
        return error_response(
            400,
            f"{name}: this server does not support `{loc[-1]}` (docs/serving.md lists what a team "
            "honours); leave it out or null",
            "invalid_request_error",
            name,
            "unsupported_parameter",
        )
    message = first.get("msg", "invalid request")
    if loc:
        message = f"{'.'.join(loc)}: {message}"
    return error_response(400, message, "invalid_request_error", ".".join(loc) or None, first.get("type"))


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(request: Request) -> str:
    """Every method some route of the request's path answers (Starlette's 405 names the first route's)."""
    allowed = {"OPTIONS"}
    for method in METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in request.app.router.routes):
            allowed.add(method)
    return ", ".join(sorted(allowed))


async def _http(request: Request, e: StarletteHTTPException) -> Response:
    headers = getattr(e, "headers", None)
    if e.status_code == 405:
        allow = allowed_methods(request)
        if request.method == "OPTIONS":  # what the path answers, with no body
            return Response(status_code=204, headers={"Allow": allow})
        headers = {**(headers or {}), "Allow": allow}
    return error_response(
        e.status_code, str(e.detail), TYPE_OF_STATUS.get(e.status_code, "invalid_request_error"), headers=headers
    )


async def _engine_error(request: Request, e: VLLMRequestError) -> JSONResponse:
    """vLLM gone (no HTTP answer) or failing (5xx): 503, the engine is unavailable; anything else from
    vLLM is a crash of ours (500)."""
    if e.status_code == 0 or e.status_code >= 500:
        return error_response(503, f"the engine is unavailable: {e}", "server_error", code="engine_unavailable")
    return await _crash(request, e)


async def _group(request: Request, e: ExceptionGroup) -> JSONResponse:
    """A request's episodes run in a TaskGroup (serving/service.py): answer its first error as if it had
    been raised alone."""
    first: BaseException = e
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    if isinstance(first, APIError):
        return await _api_error(request, first)
    if isinstance(first, VLLMRequestError):
        return await _engine_error(request, first)
    return await _crash(request, first if isinstance(first, Exception) else e)


async def _crash(request: Request, e: Exception) -> JSONResponse:
    what = describe_error(e)
    log.error("%s %s: 500 internal error: %s", request.method, request.url.path, what, exc_info=e)
    return error_response(500, f"internal error: {what}", "server_error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http)  # type: ignore[arg-type]
    app.add_exception_handler(VLLMRequestError, _engine_error)  # type: ignore[arg-type]
    app.add_exception_handler(ExceptionGroup, _group)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _crash)
