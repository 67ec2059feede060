"""Service errors: each says what went wrong in words a user can act on, and maps to one HTTP status."""

from __future__ import annotations


class ServiceError(Exception):
    status = 400
    retry_after: int | None = None  # seconds, sent as Retry-After (429, 503)

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Invalid(ServiceError):
    status = 422


class Unauthorized(ServiceError):
    status = 401


class Forbidden(ServiceError):
    status = 403


class NotFound(ServiceError):
    status = 404


class Conflict(ServiceError):
    status = 409


class PreconditionFailed(ServiceError):
    """The request was made against a version that is no longer the one in force (`If-Match`)."""

    status = 412


class Gone(ServiceError):
    """It existed and cannot be used any more (an expired or voided code)."""

    status = 410


class PaymentRequired(ServiceError):
    status = 402


class Unavailable(ServiceError):
    """Busy right now; try again after `retry_after` seconds."""

    status = 503

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after
