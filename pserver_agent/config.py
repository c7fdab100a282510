"""What a pserver agent is told: the environment of docs/design.md section 8 plus its flags.

`AgentConfig.from_env()` reads and validates everything before the agent touches
etcd, so bad input ends the agent at once with one message that names the bad value
(the CLI turns `AgentConfigError` into exit code 2).

The pserver index comes from the StatefulSet ordinal on Kubernetes — the
`PADDLE_PSERVER_ID` the manifests set from the pod-index label, or else the `-<n>`
at the end of `POD_NAME` (clusters older than 1.28 have no pod-index label, so
`PADDLE_PSERVER_ID` is empty there) — and is `None` locally, meaning "the first free
slot below PADDLE_PSERVERS_NUM".

What this does NOT check: that etcd answers, that POD_IP is an address of this
machine, or that a fixed PADDLE_PORT is free; those show up when the agent runs.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

from paddlecloud.etcd import parse_endpoints

DEFAULT_POD_IP = "127.0.0.1"
_ORDINAL = re.compile(r".+-(\d+)")


class AgentConfigError(ValueError):
    """Bad input to the agent; the message names the bad value and what would be right."""


@dataclass(frozen=True)
class AgentConfig:
    """Settings of one pserver agent; `__post_init__` rejects bad values by name."""

    command: tuple[str, ...]
    etcd_endpoints: str
    job: str
    num_pservers: int
    namespace: str = "local"
    num_trainers: str | None = None  # passed through to the pserver as given
    pod_ip: str = DEFAULT_POD_IP
    port: int | None = None  # None: a free port, chosen at the first claim of a slot
    index: int | None = None  # None: the first free slot
    index_source: str = ""  # where the index came from, for messages
    restart_limit: int = 5
    restart_backoff: float = 1.0  # seconds before the first restart; doubles each time
    max_backoff: float = 30.0
    grace: float = 10.0  # seconds between SIGTERM and SIGKILL when stopping the pserver
    lease_ttl: float = 10.0
    etcd_timeout: float = 10.0
    trainers_grace: float = 60.0  # seconds a pserver serves on after the job's end, for its trainers

    def __post_init__(self) -> None:
        if not self.command or not self.command[0]:
            raise AgentConfigError(
                "no pserver command: give it after `--`, e.g. `paddlecloud pserver -- python -m my_pserver`")
        if os.sep not in self.command[0] and shutil.which(self.command[0]) is None:
            raise AgentConfigError(f"pserver command {self.command[0]!r} not found on PATH")
        if not self.etcd_endpoints:
            raise AgentConfigError("no etcd endpoints: set PADDLE_ETCD_ENDPOINTS or --etcd-endpoints")
        try:
            parse_endpoints(self.etcd_endpoints)
        except ValueError as error:
            raise AgentConfigError(str(error)) from None
        if not self.job:
            raise AgentConfigError("no job name: set PADDLE_JOB_NAME or --job")
        if "/" in self.job or "/" in self.namespace or not self.namespace:
            raise AgentConfigError(
                f"job {self.job!r} in namespace {self.namespace!r}: neither may be empty or contain '/'")
        if self.num_pservers < 1:
            raise AgentConfigError(f"PADDLE_PSERVERS_NUM={self.num_pservers} must be a positive integer")
        if self.index is not None and not 0 <= self.index < self.num_pservers:
            raise AgentConfigError(
                f"pserver index {self.index} (from {self.index_source or 'the environment'}) is out of "
                f"range: PADDLE_PSERVERS_NUM={self.num_pservers} has slots 0..{self.num_pservers - 1}")
        if self.port is not None and not 1 <= self.port <= 65535:
            raise AgentConfigError(f"PADDLE_PORT={self.port} is not a port: use 1..65535")
        if not self.pod_ip or (":" in self.pod_ip and not self.pod_ip.startswith("[")):
            raise AgentConfigError(
                f"POD_IP={self.pod_ip!r}: give a host name or address (IPv6 in brackets)")
        if self.restart_limit < 0:
            raise AgentConfigError(f"--restart-limit {self.restart_limit} is negative: use 0 for no restart")
        if self.restart_backoff < 0:
            raise AgentConfigError(f"--restart-backoff {self.restart_backoff:g}s is negative")
        if self.grace <= 0:
            raise AgentConfigError(f"--grace {self.grace:g}s must be positive")
        if self.lease_ttl < 2:
            raise AgentConfigError(f"--lease-ttl {self.lease_ttl:g}s is too short: etcd leases need at least 2s")
        if self.trainers_grace < 0:
            raise AgentConfigError(f"--trainers-grace {self.trainers_grace:g}s is negative")
        if self.etcd_timeout <= 0:
            raise AgentConfigError(f"--etcd-timeout {self.etcd_timeout:g}s must be positive")

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, command: tuple[str, ...], etcd_endpoints: str | None,
                 job: str | None, namespace: str | None, **settings: float) -> AgentConfig:
        """Flags (the keyword arguments, None when not given) win over the environment."""
        index, source = index_from_env(env)
        return cls(
            command=tuple(command),
            etcd_endpoints=(etcd_endpoints or env.get("PADDLE_ETCD_ENDPOINTS", "")).strip(),
            job=(job or env.get("PADDLE_JOB_NAME", "")).strip(),
            namespace=(namespace or env.get("PADDLE_NAMESPACE", "") or "local").strip(),
            num_pservers=_positive_int(env, "PADDLE_PSERVERS_NUM",
                                       hint="the number of pserver slots of the job"),
            num_trainers=_trainers(env),
            pod_ip=env.get("POD_IP", "").strip() or DEFAULT_POD_IP,
            port=_port(env),
            index=index,
            index_source=source,
            **settings,
        )


def index_from_env(env: Mapping[str, str]) -> tuple[int | None, str]:
    """(index, where it came from): PADDLE_PSERVER_ID, else POD_NAME's ordinal, else (None, "")."""
    raw = env.get("PADDLE_PSERVER_ID", "").strip()
    if raw:
        if not raw.isdigit():
            raise AgentConfigError(f"PADDLE_PSERVER_ID={raw!r} is not a non-negative integer")
        return int(raw), f"PADDLE_PSERVER_ID={raw}"
    pod = env.get("POD_NAME", "").strip()
    match = _ORDINAL.fullmatch(pod)
    if match:
        return int(match.group(1)), f"POD_NAME={pod}"
    return None, ""


def _positive_int(env: Mapping[str, str], name: str, *, hint: str) -> int:
    raw = env.get(name)
    if raw is None or not raw.strip():
        raise AgentConfigError(f"{name} is not set: give {hint} (a positive integer)")
    try:
        value = int(raw.strip())
    except ValueError:
        raise AgentConfigError(f"{name}={raw!r} is not a positive integer ({hint})") from None
    if value < 1:
        raise AgentConfigError(f"{name}={raw!r} is not a positive integer ({hint})")
    return value


def _trainers(env: Mapping[str, str]) -> str | None:
    raw = env.get("PADDLE_TRAINERS_NUM", "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise AgentConfigError(f"PADDLE_TRAINERS_NUM={raw!r} is not a non-negative integer")
    return raw


def _port(env: Mapping[str, str]) -> int | None:
    raw = env.get("PADDLE_PORT", "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise AgentConfigError(f"PADDLE_PORT={raw!r} is not a port: use 1..65535, or leave it unset")
    return int(raw)


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """`HOST:PORT` -> (HOST, PORT); IPv6 hosts keep their brackets."""
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"endpoint {endpoint!r} is not HOST:PORT")
    return host, int(port)
