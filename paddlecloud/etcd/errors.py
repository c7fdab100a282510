"""What an etcd call fails with, named by what the caller can do about it: `EtcdUnavailable`
(wait and try again, or give up after a deadline) and `EtcdAuthError` (nothing: the
credentials are wrong, and retrying sends them again)."""

from __future__ import annotations

import aetcd
import grpc


class EtcdUnavailable(RuntimeError):
    """etcd did not answer; the message names the endpoints tried."""


class EtcdAuthError(EtcdUnavailable):
    """etcd refused our credentials (or asked for some we lack): retrying cannot help."""


_AUTH_FAILURES = ("user name is empty", "authentication failed", "permission denied",
                  "invalid auth token", "user name not found", "auth: ")


def is_auth_failure(error: BaseException) -> bool:
    """Whether `error` (of aetcd or of gRPC) is etcd refusing who we are or what we may do."""
    text = str(error).lower()
    return (isinstance(error, aetcd.exceptions.UnauthenticatedError)
            or (isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.UNAUTHENTICATED)
            or any(marker in text for marker in _AUTH_FAILURES))
