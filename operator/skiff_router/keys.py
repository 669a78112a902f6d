"""API keys with allowed models and per-minute request / token quotas.

A key is stored in a Kubernetes Secret (one key per Secret) with these data fields:
  key     the bearer token clients send (`Authorization: Bearer <key>`)
  models  comma-separated served model names, or `*` for all (default `*`)
  rpm     requests per minute (optional, unlimited when absent)
  tpm     tokens per minute, prompt + completion as reported in each response's usage (optional)

Quotas are sliding 60-second windows. Tokens are only known after a response, so a request is admitted
while the window's tokens are below the limit and its usage is charged when it completes.
"""

from __future__ import annotations

import hmac
import math
import time
from collections import deque
from dataclasses import dataclass, field

WINDOW = 60.0


class AuthError(Exception):
    """An authentication or quota refusal with its HTTP status, OpenAI error type and headers."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}


@dataclass(frozen=True)
class ApiKey:
    name: str
    secret: str
    models: frozenset[str] | None = None  # None: every model
    rpm: int | None = None
    tpm: int | None = None

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models

    @classmethod
    def from_fields(cls, name: str, fields: dict[str, str]) -> ApiKey:
        secret = (fields.get("key") or "").strip()
        if not secret:
            raise ValueError(f"api key {name!r} has no `key` field")
        models_text = fields.get("models", "*").strip()
        models = (
            None if models_text == "*" else frozenset(m.strip() for m in models_text.split(",") if m.strip())
        )

        def limit(field_name: str) -> int | None:
            text = (fields.get(field_name) or "").strip()
            if not text:
                return None
            value = int(text)
            if value < 0:
                raise ValueError(f"api key {name!r}: {field_name} must be >= 0")
            return value

        return cls(name, secret, models, limit("rpm"), limit("tpm"))


@dataclass
class _Usage:
    requests: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    token_sum: int = 0

    def expire(self, now: float) -> None:
        while self.requests and self.requests[0] <= now - WINDOW:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= now - WINDOW:
            self.token_sum -= self.tokens.popleft()[1]


class KeyStore:
    """Keys by secret plus the usage windows (kept by key name, so a rotated secret keeps its quota).

    With N router replicas behind one Service each enforces 1/N of every limit (`share`), so that a key's
    total stays near its limit while the Service spreads its requests over the replicas; with W worker
    processes per replica (--workers, connections spread by the kernel) each process enforces 1/(N*W).
    """

    def __init__(self, clock=time.monotonic, share: int = 1, processes: int = 1) -> None:
        self._keys: dict[str, ApiKey] = {}
        self._usage: dict[str, _Usage] = {}
        self._clock = clock
        self.share = max(1, share)
        self.processes = max(1, processes)

    def set_share(self, replicas: int) -> None:
        self.share = max(1, replicas)

    def _limit(self, value: int | None) -> int | None:
        return None if value is None else max(1, math.ceil(value / (self.share * self.processes)))

    def set_keys(self, keys: list[ApiKey]) -> None:
        self._keys = {k.secret: k for k in keys}

    def __len__(self) -> int:
        return len(self._keys)

    def find(self, presented: str) -> ApiKey | None:
        for secret, key in self._keys.items():
            if hmac.compare_digest(secret.encode(), presented.encode()):
                return key
        return None

    def admit(self, key: ApiKey) -> dict[str, str]:
        """Count one request against the key's quotas; returns rate-limit headers or raises a 429."""
        now = self._clock()
        usage = self._usage.setdefault(key.name, _Usage())
        usage.expire(now)
        rpm, tpm = self._limit(key.rpm), self._limit(key.tpm)
        if rpm is not None and len(usage.requests) >= rpm:
            wait = usage.requests[0] + WINDOW - now if usage.requests else WINDOW
            raise AuthError(
                429,
                "rate_limit_exceeded",
                f"api key {key.name!r} is over its {key.rpm} requests per minute",
                {**self.headers(key, now), "Retry-After": str(max(1, math.ceil(wait)))},
            )
        if tpm is not None and usage.token_sum >= tpm:
            wait = usage.tokens[0][0] + WINDOW - now if usage.tokens else WINDOW
            raise AuthError(
                429,
                "rate_limit_exceeded",
                f"api key {key.name!r} is over its {key.tpm} tokens per minute",
                {**self.headers(key, now), "Retry-After": str(max(1, math.ceil(wait)))},
            )
        usage.requests.append(now)
        return self.headers(key, now)

    def charge(self, key: ApiKey, tokens: int) -> None:
        if tokens <= 0:
            return
        usage = self._usage.setdefault(key.name, _Usage())
        usage.tokens.append((self._clock(), tokens))
        usage.token_sum += tokens

    def headers(self, key: ApiKey, now: float | None = None) -> dict[str, str]:
        now = self._clock() if now is None else now
        usage = self._usage.setdefault(key.name, _Usage())
        usage.expire(now)
        out: dict[str, str] = {}
        rpm, tpm = self._limit(key.rpm), self._limit(key.tpm)  # this replica's share, as it enforces them
        if rpm is not None:
            reset = usage.requests[0] + WINDOW - now if usage.requests else 0.0
            out |= {
                "x-ratelimit-limit-requests": str(rpm),
                "x-ratelimit-remaining-requests": str(max(0, rpm - len(usage.requests))),
                "x-ratelimit-reset-requests": f"{max(0.0, reset):.0f}s",
            }
        if tpm is not None:
            reset = usage.tokens[0][0] + WINDOW - now if usage.tokens else 0.0
            out |= {
                "x-ratelimit-limit-tokens": str(tpm),
                "x-ratelimit-remaining-tokens": str(max(0, tpm - usage.token_sum)),
                "x-ratelimit-reset-tokens": f"{max(0.0, reset):.0f}s",
            }
        return out


def authenticate(store: KeyStore, authorization: str | None, *, required: bool) -> ApiKey | None:
    """The key a request presents: 401 when it is malformed, unknown, or missing while required."""
    presented = None
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError(401, "invalid_api_key", "Authorization must be `Bearer <api key>`")
        presented = token.strip()
    if presented is None:
        if required:
            raise AuthError(
                401, "invalid_api_key", "this endpoint requires an API key (Authorization: Bearer ...)"
            )
        return None
    key = store.find(presented)
    if key is None:
        if not required:
            return None  # an open model: clients' placeholder keys are fine (and get no quota)
        raise AuthError(401, "invalid_api_key", "incorrect API key provided")
    return key


def authorize(
    store: KeyStore,
    authorization: str | None,
    model: str,
    *,
    required: bool,
    extra_allowed: frozenset[str] = frozenset(),
) -> tuple[ApiKey | None, dict[str, str]]:
    """authenticate, then 403 for a model the key may not use and 429 over quota; admits the request.

    `extra_allowed`: names of keys allowed this model by its InferenceService's apiKeySecretRef.
    """
    key = authenticate(store, authorization, required=required)
    if key is None:
        return None, {}
    if not (key.allows(model) or key.name in extra_allowed):
        raise AuthError(403, "model_not_allowed", f"api key {key.name!r} may not use model {model!r}")
    return key, store.admit(key)
