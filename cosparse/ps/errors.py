"""What a ``PSClient`` call raises: a shard's error reply, a refused credential, a dead or silent
shard. Each names the shard index and endpoint."""

from __future__ import annotations

from cosparse.ps import protocol as P


class PSError(RuntimeError):
    """A shard answered with an error."""

    def __init__(self, shard: int, endpoint: str, code: int, message: str) -> None:
        super().__init__(f"PS shard {shard} at {endpoint}: {P.ERROR_NAMES.get(code, code)}: {message}")
        self.shard, self.endpoint, self.code = shard, endpoint, code


class PSAuthError(PSError):
    """A shard refused the request's credentials."""


class PSUnavailable(RuntimeError):
    """A shard is dead or did not answer in time; ``silence_s``: how long it has been silent
    (None when unknown)."""

    def __init__(self, shard: int, endpoint: str, reason: str, silence_s: float | None = None) -> None:
        super().__init__(f"PS shard {shard} at {endpoint} is unavailable: {reason}")
        self.shard, self.endpoint, self.reason, self.silence_s = shard, endpoint, reason, silence_s
