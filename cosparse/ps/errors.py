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


class PSFull(PSError):
    """A shard refused new rows: its namespace's quota (``E_QUOTA``) or its row budget
    (``E_FULL``) is reached; the message names the limit and the key that sets it."""


class PSNonFinite(PSError):
    """A shard refused a PUSH whole: its gradients, or the rows and optimizer state it would
    leave, are NaN or infinite (``E_NONFINITE``); nothing was applied."""


class PSAccessDenied(PSError):
    """The client's namespace may not touch that table (``ps serve --namespaces``)."""


_BY_CODE: dict[int, type[PSError]] = {P.E_AUTH: PSAuthError, P.E_FULL: PSFull, P.E_QUOTA: PSFull,
                                      P.E_DENIED: PSAccessDenied, P.E_NONFINITE: PSNonFinite}


def error_reply(shard: int, endpoint: str, code: int, message: str) -> PSError:
    """The exception for a shard's error reply of ``code``."""
    return _BY_CODE.get(code, PSError)(shard, endpoint, code, message)


class PSUnavailable(RuntimeError):
    """A shard is dead or did not answer in time; ``silence_s``: how long it has been silent
    (None when unknown)."""

    def __init__(self, shard: int, endpoint: str, reason: str, silence_s: float | None = None) -> None:
        super().__init__(f"PS shard {shard} at {endpoint} is unavailable: {reason}")
        self.shard, self.endpoint, self.reason, self.silence_s = shard, endpoint, reason, silence_s
