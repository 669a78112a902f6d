"""Errors in OpenAI's format: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import ValidationError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "invalid_request_error"),
            "param": param,
            "code": code if code is not None else str(status),
        }
    }


def from_validation(e: ValidationError) -> ApiError:
    first = e.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in first.get("loc", ()) if p not in ("function-after",))
    msg = first.get("msg", "invalid value")
    if first.get("type") == "extra_forbidden":
        msg = f"Unrecognized request argument supplied: {loc}"
    elif first.get("type") == "missing":
        msg = f"Missing required parameter: {loc}"
    elif loc:
        msg = f"Invalid value for '{loc}': {msg}"
    extra = len(e.errors()) - 1
    if extra:
        msg += f" (and {extra} more error{'s' if extra > 1 else ''})"
    return ApiError(400, msg, param=loc or None, code="invalid_value")
