"""MLflow's error shape: ``{"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "..."}`` with
the HTTP status MLflow gives each code (``mlflow/exceptions.py``)."""

from __future__ import annotations

from django.http import JsonResponse

INVALID_PARAMETER_VALUE = "INVALID_PARAMETER_VALUE"
RESOURCE_DOES_NOT_EXIST = "RESOURCE_DOES_NOT_EXIST"
RESOURCE_ALREADY_EXISTS = "RESOURCE_ALREADY_EXISTS"
PERMISSION_DENIED = "PERMISSION_DENIED"
UNAUTHENTICATED = "UNAUTHENTICATED"
ENDPOINT_NOT_FOUND = "ENDPOINT_NOT_FOUND"
REQUEST_LIMIT_EXCEEDED = "REQUEST_LIMIT_EXCEEDED"
RESOURCE_CONFLICT = "RESOURCE_CONFLICT"
BAD_REQUEST = "BAD_REQUEST"
INTERNAL_ERROR = "INTERNAL_ERROR"

HTTP_STATUS = {
    INVALID_PARAMETER_VALUE: 400,
    RESOURCE_ALREADY_EXISTS: 400,
    BAD_REQUEST: 400,
    UNAUTHENTICATED: 401,
    PERMISSION_DENIED: 403,
    RESOURCE_DOES_NOT_EXIST: 404,
    ENDPOINT_NOT_FOUND: 404,
    RESOURCE_CONFLICT: 409,
    REQUEST_LIMIT_EXCEEDED: 429,
    INTERNAL_ERROR: 500,
}


class MlflowError(Exception):
    """A refusal in MLflow's terms; the door answers it with MLflow's error shape."""

    def __init__(self, code: str, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after

    @property
    def status(self) -> int:
        return HTTP_STATUS.get(self.code, 400)


def invalid(message: str) -> MlflowError:
    return MlflowError(INVALID_PARAMETER_VALUE, message)


def error_response(error: MlflowError, *, status: int | None = None) -> JsonResponse:
    response = JsonResponse(
        {"error_code": error.code, "message": error.message}, status=status or error.status
    )
    if error.retry_after is not None:
        response["Retry-After"] = str(error.retry_after)
    return response
