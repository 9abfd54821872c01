"""Errors as OpenAI sends them: a status code and ``{"error": {message, type, param, code}}``.

Clients in every language already know this shape (the ``openai`` SDKs raise
``BadRequestError``, ``AuthenticationError``, ``RateLimitError``, ... from it)::

    raise ApiError(400, "messages[2].role must be one of ...", param="messages[2].role")
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "upstream_timeout",
}


class ApiError(Exception):
    """An error a client gets, with the status code and the body that explain it."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.extra = extra or {}

    @property
    def kind(self) -> str:
        """The ``type`` of the error body (``invalid_request_error``, ...)."""
        default = "invalid_request_error" if self.status < 500 else "server_error"  # 405, ...
        return _TYPES.get(self.status, default)

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }
        return {"error": error, **self.extra}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)
