"""One JSON POST to a model server, its failures sorted into retry or not, and the retry backoff.

Shared by the two HTTP clients: the ``openai`` reader (:mod:`memalpha.reader.openai_compat`)
and the vLLM rollout engine (:mod:`memalpha.lm.sampling.vllm_engine`). Standard library only.
"""

from __future__ import annotations

import http.client
import random
import urllib.error
import urllib.request


class RetryableRequestError(Exception):
    """A failure that may pass (timeout, refused or dropped connection, 5xx, 429): ask again after a
    backoff."""


class RefusedRequestError(Exception):
    """A failure a repeat would meet again: the server refused the request itself (a 4xx other than 429)."""


def post_json(url: str, payload: bytes, *, timeout_s: float, headers: dict[str, str] | None = None) -> bytes:
    """POST ``payload`` (JSON bytes) to ``url``; the reply's body.

    Raises :class:`RetryableRequestError` or :class:`RefusedRequestError` with a one-line
    message naming the URL (and, for an HTTP error, the status and the start of its body).
    """
    request = urllib.request.Request(
        url, data=payload, headers={"Content-Type": "application/json", **(headers or {})}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        try:
            detail = exc.read()[:300].decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):  # the error body itself was cut off
            detail = "(no readable body)"
        message = f"HTTP {exc.code} from {url}: {detail}"
        if exc.code >= 500 or exc.code == 429:
            raise RetryableRequestError(message) from exc
        raise RefusedRequestError(message) from exc
    except TimeoutError as exc:
        raise RetryableRequestError(f"timed out after {timeout_s}s waiting for {url}") from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise RetryableRequestError(f"timed out after {timeout_s}s connecting to {url}") from exc
        raise RetryableRequestError(f"cannot reach {url}: {exc.reason}") from exc
    except (OSError, http.client.HTTPException) as exc:
        raise RetryableRequestError(f"connection to {url} failed: {exc}") from exc


def backoff_delay(retry: int, first_s: float, max_s: float, rng: random.Random) -> float:
    """Seconds to wait before retry number ``retry`` (1 for the first retry).

    The ceiling doubles with every retry from ``first_s`` up to ``max_s``; the wait is drawn
    uniformly from the ceiling's upper half. The jitter keeps the many requests that failed
    together (one round's questions, or every rank's) from hitting a recovering server in
    lockstep, and the lower half bound keeps the wait growing from retry to retry.
    """
    ceiling = min(max_s, first_s * 2.0 ** min(retry - 1, 60))
    return ceiling * (0.5 + 0.5 * rng.random())
