"""The gateway's input and errors: the request fields it reads, checked and bounded (a 400 naming the field), and
errors in OpenAI's shape. Pure: no I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

from suanli.control.errors import ServiceError

MAX_ITEMS = 10_000  # messages, prompts, inputs
MAX_TOKENS = 1 << 20
MAX_N = 16


class GatewayError(ServiceError):
    """An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.retry_after = status, param, retry_after

    def response(self) -> JSONResponse:
        kind = {401: "authentication_error", 404: "not_found_error", 503: "service_unavailable"}.get(
            self.status, "invalid_request_error" if self.status < 500 else "api_error"
        )
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}
        if self.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": None}}
        return JSONResponse(body, status_code=self.status, headers=headers)


PROMPT_OVERHEAD = 1024  # tokens a chat template or runtime may add to what the body holds
MEDIA_TOKENS = 16_384  # tokens one image, audio or video part of a message may stand for (a URL is a few bytes)
MEDIA = ("image_url", "input_audio", "video_url", "audio_url")  # content parts' types that stand for media


@dataclass(frozen=True)
class UsageCap:
    """The most tokens one request can honestly have used: what the replica reports is counted up to this. The
    replica runs its owner's code, and an owner who sells tokens must not bill a buyer (nor mint money) by reporting
    more than was asked for."""

    prompt: int
    completion: int
    prompt_estimate: int = 0  # counted where a stream ends before its usage: four bytes of the request a token


def usage_cap(route: str, raw_len: int, doc: dict[str, Any]) -> UsageCap:
    """A BPE token covers at least one byte of what was sent, beside a template's few (`PROMPT_OVERHEAD`); each of
    `n` choices (of each prompt) is at most `max_tokens` long (`MAX_TOKENS` where the request sets none)."""
    if route == "embeddings":
        return UsageCap(raw_len + PROMPT_OVERHEAD, 0, raw_len // 4)
    most = doc.get("max_completion_tokens") or doc.get("max_tokens") or MAX_TOKENS
    prompts = doc.get("prompt")
    many = 1  # a list of strings (or of token-id lists) is that many prompts; a list of token ids is one
    if route == "completions" and isinstance(prompts, list) and prompts and isinstance(prompts[0], (str, list)):
        many = len(prompts)
    media = sum(_count_parts(doc.get("messages"), m) for m in MEDIA) if route == "chat/completions" else 0
    prompt = raw_len + PROMPT_OVERHEAD + media * MEDIA_TOKENS
    return UsageCap(prompt, int(doc.get("n") or 1) * many * int(most), raw_len // 4)


def _count_parts(messages: Any, name: str) -> int:
    """How many content parts of a type (`image_url`, …) the messages hold."""
    n = 0
    for m in messages if isinstance(messages, list) else ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            n += sum(1 for part in content if isinstance(part, dict) and part.get("type") == name)
    return n


def _bad(param: str, why: str) -> GatewayError:
    return GatewayError(400, f"{param}: {why}", param)


def check_body(route: str, raw: bytes) -> dict[str, Any]:
    """The request's JSON, with the fields the gateway reads checked and bounded (others pass through to the
    runtime, which has its own checks); a 400 naming the field."""
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise _bad("body", "JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise _bad("body", f"not valid JSON ({str(e)[:120]})") from None
    if not isinstance(doc, dict):
        raise _bad("body", "must be a JSON object")
    model = doc.get("model")
    if not isinstance(model, str) or not 0 < len(model) <= 256:
        raise _bad("model", "is required: the endpoint's name (a string of at most 256 characters)")
    if "stream" in doc and not isinstance(doc["stream"], bool):
        raise _bad("stream", "must be true or false")
    if "stream_options" in doc and doc["stream_options"] is not None and not isinstance(doc["stream_options"], dict):
        raise _bad("stream_options", "must be an object")
    for name in ("max_tokens", "max_completion_tokens"):
        v = doc.get(name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_TOKENS):
            raise _bad(name, f"must be a whole number from 1 to {MAX_TOKENS}")
    n = doc.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N):
        raise _bad("n", f"must be a whole number from 1 to {MAX_N}")
    need = {"chat/completions": "messages", "completions": "prompt", "embeddings": "input"}[route]
    v = doc.get(need)
    if route == "chat/completions":
        if not isinstance(v, list) or not 0 < len(v) <= MAX_ITEMS or not all(isinstance(m, dict) for m in v):
            raise _bad("messages", f"must be a list of 1 to {MAX_ITEMS} message objects")
    elif not (isinstance(v, str) or (isinstance(v, list) and 0 < len(v) <= MAX_ITEMS)):
        raise _bad(need, f"is required: a string or a list of 1 to {MAX_ITEMS} items")
    return doc
