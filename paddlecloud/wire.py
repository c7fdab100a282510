"""Contracts of the wire that both ends share: durations, errors a client acts on, and the
keep-alive pings of a connection to a master.

Durations cross the wire as `google.protobuf.Duration`; one conversion each way,
rounded to the nanosecond, so the master and the trainer never disagree by a tick.

Errors a client must act on (a standby's "the leader is HOST:PORT", "your session
expired", "you were superseded") carry a `google.rpc.ErrorInfo` in the gRPC rich
status (`grpc-status-details-bin`): a `reason` from `Reason` and its metadata. The
human message stays in the status's details text for people and grpcurl; no client
parses it.

What this does NOT do: map domain exceptions to codes (the servicer does that).
"""

from __future__ import annotations

import enum

import grpc
from google.protobuf import any_pb2
from google.protobuf.duration_pb2 import Duration
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

DOMAIN = "paddlecloud.org"

# Keep-alive pings on a client's connection to a master, while a call is under way. A
# trainer's call may wait in a busy master's queue longer than a short deadline allows, so
# it gets a long one (`paddlecloud.master_client.connection.CALL_TIMEOUT`); a master gone without closing
# the connection (its node lost, its process stopped) is noticed instead when a ping goes
# unanswered: within KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS.
KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000
# The most often a master accepts a client's pings while no data flows. gRPC's default is
# once per 5 minutes: a client pinging more often is sent GOAWAY (too_many_pings), which
# fails every call on its connection.
MIN_PING_INTERVAL_MS = 1_000


def client_keepalive(time_ms: int = KEEPALIVE_TIME_MS, timeout_ms: int = KEEPALIVE_TIMEOUT_MS
                     ) -> tuple[tuple[str, int], ...]:
    """The channel options of a connection to a master (see above)."""
    return (
        ("grpc.keepalive_time_ms", time_ms),
        ("grpc.keepalive_timeout_ms", timeout_ms),
        ("grpc.http2.ping_timeout_ms", timeout_ms),  # what grpcio 1.85 waits for a ping's ack
        ("grpc.http2.max_pings_without_data", 0),   # a queued call sends no data: ping on regardless
    )


CLIENT_KEEPALIVE = client_keepalive()
SERVER_KEEPALIVE = (("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),)


class Reason(str, enum.Enum):
    """`ErrorInfo.reason` values; the metadata each carries is named beside it."""

    NOT_LEADER = "NOT_LEADER"                  # metadata: leader = HOST:PORT, when known
    SESSION_EXPIRED = "SESSION_EXPIRED"        # register again
    SESSION_SUPERSEDED = "SESSION_SUPERSEDED"  # metadata: trainer = the trainer id; stop
    TRANSIENT = "TRANSIENT"                    # the leader is up but cannot answer now (etcd,
                                               # its cache rebuilt): retry it, not another
    RATE_LIMITED = "RATE_LIMITED"              # too many calls with this token: wait the
                                               # RetryInfo's delay, then retry


def duration(seconds: float) -> Duration:
    """Seconds -> Duration, rounded to the nanosecond."""
    nanos_total = round(seconds * 1e9)
    whole, nanos = divmod(nanos_total, 1_000_000_000)
    return Duration(seconds=whole, nanos=nanos)


def seconds(value: Duration) -> float:
    return value.seconds + value.nanos / 1e9


def retry_info(seconds: float) -> any_pb2.Any:
    """A `google.rpc.RetryInfo` detail: retry after `seconds` (clients jitter it)."""
    info = error_details_pb2.RetryInfo()
    info.retry_delay.FromNanoseconds(int(seconds * 1e9))
    detail = any_pb2.Any()
    detail.Pack(info)
    return detail


def error_status(code: grpc.StatusCode, message: str, reason: Reason | None,
                 metadata: dict[str, str] | None = None, *, retry_after: float | None = None) -> grpc.Status:
    """A status with `message` for people, and for programs an ErrorInfo (of `reason`) and a
    RetryInfo (of `retry_after`) where given (send it with `context.abort_with_status`)."""
    details = []
    if reason is not None:
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.ErrorInfo(reason=reason.value, domain=DOMAIN, metadata=metadata or {}))
        details.append(detail)
    if retry_after is not None:
        details.append(retry_info(retry_after))
    return rpc_status.to_status(status_pb2.Status(code=code.value[0], message=message, details=details))


def error_info(error: grpc.RpcError) -> tuple[Reason, dict[str, str]] | None:
    """The ErrorInfo of ours a failed call carries, as (reason, metadata); None if none."""
    try:
        status = rpc_status.from_call(error)  # type: ignore[arg-type]
    except (ValueError, AttributeError):
        return None
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == DOMAIN:
                try:
                    return Reason(info.reason), dict(info.metadata)
                except ValueError:
                    return None
    return None


SHORT_SESSION_DIGITS = 6


def short_session(session_id: int) -> str:
    """A session id as logs show it: the last 6 hex digits of its etcd lease id (`etcdctl
    lease list` shows the whole id in hex). etcd numbers leases from a per-member counter, so
    the low digits are what tells a job's sessions apart; the full 19-digit decimal id made
    every registration line hard to read."""
    return f"{session_id:x}"[-SHORT_SESSION_DIGITS:]
