"""Finding the master: a fixed endpoint, or the `leader` key in etcd.

`PADDLE_MASTER_ENDPOINT` wins when set (e.g. a Kubernetes Service that routes to the
ready leader). Otherwise the leader's address is read from etcd through its JSON
gateway (`/v3/kv/range`), which keeps this synchronous and free of an etcd client;
callers re-resolve whenever the master answers UNAVAILABLE.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from paddlecloud.etcd import parse_endpoints
from paddlecloud.keys import JobKeys

logger = logging.getLogger(__name__)


class DiscoveryError(RuntimeError):
    """The master could not be located; the message names where it looked."""


@dataclass(frozen=True)
class MasterLocator:
    master_endpoint: str | None = None
    etcd_endpoints: str | None = None
    job: str | None = None
    namespace: str = "local"

    def __post_init__(self) -> None:
        if not self.master_endpoint and not (self.etcd_endpoints and self.job):
            raise DiscoveryError(
                "cannot find the master: set PADDLE_MASTER_ENDPOINT, or PADDLE_ETCD_ENDPOINTS "
                "and PADDLE_JOB_NAME")
        if self.etcd_endpoints:
            parse_endpoints(self.etcd_endpoints)  # fail early on a malformed value

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MasterLocator:
        """From DESIGN.md section 8's variables: PADDLE_MASTER_ENDPOINT, or
        PADDLE_ETCD_ENDPOINTS + PADDLE_JOB_NAME (+ PADDLE_NAMESPACE, default `local`)."""
        env = os.environ if env is None else env
        return cls(
            master_endpoint=env.get("PADDLE_MASTER_ENDPOINT") or None,
            etcd_endpoints=env.get("PADDLE_ETCD_ENDPOINTS") or None,
            job=env.get("PADDLE_JOB_NAME") or None,
            namespace=env.get("PADDLE_NAMESPACE") or "local",
        )

    def describe(self) -> str:
        if self.master_endpoint:
            return self.master_endpoint
        return f"the leader of job {self.namespace}/{self.job} in etcd {self.etcd_endpoints}"

    def resolve(self, *, timeout: float = 5.0) -> str:
        """The master's HOST:PORT now. Raises DiscoveryError when no leader is published."""
        if self.master_endpoint:
            return self.master_endpoint
        key = JobKeys(self.namespace, self.job or "").leader
        errors = []
        for host, port in parse_endpoints(self.etcd_endpoints or ""):
            try:
                value = _etcd_get(f"http://{host}:{port}", key, timeout=timeout)
            except (OSError, ValueError) as error:
                errors.append(f"{host}:{port}: {error}")
                continue
            if value is None:
                raise DiscoveryError(f"no leader published yet for job {self.namespace}/{self.job}")
            return value
        raise DiscoveryError(f"etcd unreachable at {self.etcd_endpoints}: {'; '.join(errors)}")


def _etcd_get(base_url: str, key: bytes, *, timeout: float) -> str | None:
    body = json.dumps({"key": base64.b64encode(key).decode()}).encode()
    for path in ("/v3/kv/range", "/v3beta/kv/range"):
        request = urllib.request.Request(base_url + path, data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                kvs = json.loads(reply.read()).get("kvs") or []
        except urllib.error.HTTPError as error:
            if error.code == 404:
                continue  # an older gateway prefix
            raise
        return base64.b64decode(kvs[0]["value"]).decode() if kvs else None
    raise ValueError(f"etcd at {base_url} has no JSON gateway")
