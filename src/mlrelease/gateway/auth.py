"""API keys (stored as SHA-256 in a keys file) and per-client token-bucket rate limits.

A keys file is YAML: `clients: [{name, key_sha256, rate: {per_second, burst}}]`; `rate` is optional.
The token bucket is a dozen lines, written here rather than pulling a rate-limit library into the
request path; limits are per replica (a shared limit would need Redis on every request).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mlrelease.errors import StepError
from mlrelease.gateway.config import RateLimit
from mlrelease.storage import write_text_atomic
from mlrelease.yamlconfig import StrictModel, safe_load, validation_problems


class ClientEntry(StrictModel):
    """One API client in the keys file."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    rate: RateLimit | None = None


class KeysFile(BaseModel):
    """The whole keys file."""

    model_config = ConfigDict(extra="forbid")

    clients: list[ClientEntry] = Field(default_factory=list)


def hash_key(key: str) -> str:
    """Hex SHA-256 of an API key (what the keys file stores)."""
    return hashlib.sha256(key.encode()).hexdigest()


def read_keys(path: Path) -> KeysFile:
    """Parse a keys file; a missing file is an empty one, a malformed one a StepError naming the problem."""
    if not path.is_file():
        return KeysFile()
    try:  # every problem, YAML syntax included, reads "API keys file … is invalid"
        return KeysFile.model_validate(safe_load(path.read_text(encoding="utf-8")) or {})
    except yaml.YAMLError as exc:
        raise StepError(f"API keys file {path} is invalid: {exc}") from None
    except ValidationError as exc:
        raise StepError(f"API keys file {path} is invalid: {validation_problems(exc)}") from None


def add_client(path: Path, name: str, rate: RateLimit | None = None) -> str:
    """Create a client with a fresh random key; returns the key (shown once, only its hash is stored)."""
    keys = read_keys(path)
    if any(c.name == name for c in keys.clients):
        raise StepError(f"API client {name!r} already exists in {path}")
    key = secrets.token_urlsafe(32)
    keys.clients.append(ClientEntry(name=name, key_sha256=hash_key(key), rate=rate))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, yaml.safe_dump(keys.model_dump(mode="json", exclude_none=True), sort_keys=False))
    path.chmod(0o600)
    return key


@dataclass
class TokenBucket:
    """Allows `per_second` sustained and `burst` at once."""

    per_second: float
    burst: int
    clock: Callable[[], float] = time.monotonic
    tokens: float = field(init=False)
    stamp: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens, self.stamp = float(self.burst), self.clock()

    def take(self) -> float:
        """0.0 when a request may pass now, else the seconds until one may."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.per_second)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.per_second


class Authenticator:
    """Resolves an API key to its client and applies that client's rate limit."""

    def __init__(self, keys: KeysFile, default_rate: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self._by_hash = {c.key_sha256: c for c in keys.clients}
        self._buckets = {
            c.name: TokenBucket((c.rate or default_rate).per_second, (c.rate or default_rate).burst, clock)
            for c in keys.clients
        }

    @property
    def client_count(self) -> int:
        """Number of configured clients."""
        return len(self._by_hash)

    def client_for(self, key: str | None) -> str | None:
        """The client name for a key, or None for a missing or unknown key.

        Looked up by the key's SHA-256, so timing can at most reveal something about a hash, never the key.
        """
        if not key:
            return None
        entry = self._by_hash.get(hash_key(key))
        return entry.name if entry else None

    def retry_after(self, client: str) -> float:
        """0.0 if the client may proceed, else seconds until it may (the request counts against its bucket)."""
        return self._buckets[client].take()
