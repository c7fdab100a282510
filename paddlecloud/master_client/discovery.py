"""Finding the master: a fixed endpoint, or the `leader` key in etcd (or, while that key
still names a master that did not answer, a standby present in etcd).

`PADDLE_MASTER_ENDPOINT` wins when set (e.g. a Kubernetes Service that routes to the
ready leader). Otherwise the leader's address is read from etcd through its JSON
gateway (`/v3/kv/range`), which keeps this synchronous and free of an etcd client;
callers re-resolve whenever the master answers UNAVAILABLE. With `https://`
endpoints the gateway is read over TLS, the server's certificate checked against
`PADDLE_ETCD_CA_FILE` (else the system's CAs) and its host name, so whoever can
answer on the network cannot redirect the trainers. A trainer presents no etcd
user and no client certificate (docs/design.md section 8a: trainers need no etcd
credentials), so the leader key must be readable anonymously over TLS.

What this does NOT do: read an etcd that demands client certificates or auth for
every read (deploy/etcd.yaml does): that is refused with an error saying so, and
such a job's trainers use `PADDLE_MASTER_ENDPOINT` (the job's Service, as the
Kubernetes manifests set it).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from paddlecloud.etcd import parse_endpoints, uses_tls
from paddlecloud.keys import JobKeys, prefix_range_end

logger = logging.getLogger(__name__)


class DiscoveryError(RuntimeError):
    """The master could not be located; the message names where it looked."""


@dataclass(frozen=True)
class MasterLocator:
    master_endpoint: str | None = None
    etcd_endpoints: str | None = None
    job: str | None = None
    namespace: str = "local"
    etcd_ca_file: str | None = None  # the CA of https:// endpoints (None: the system's)

    def __post_init__(self) -> None:
        if not self.master_endpoint and not (self.etcd_endpoints and self.job):
            raise DiscoveryError(
                "cannot find the master: set PADDLE_MASTER_ENDPOINT, or PADDLE_ETCD_ENDPOINTS "
                "and PADDLE_JOB_NAME")
        if self.etcd_endpoints:
            parse_endpoints(self.etcd_endpoints)  # fail early on a malformed value

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MasterLocator:
        """From docs/design.md section 8's variables: PADDLE_MASTER_ENDPOINT, or
        PADDLE_ETCD_ENDPOINTS + PADDLE_JOB_NAME (+ PADDLE_NAMESPACE, default `local`)."""
        env = os.environ if env is None else env
        return cls(
            master_endpoint=env.get("PADDLE_MASTER_ENDPOINT") or None,
            etcd_endpoints=env.get("PADDLE_ETCD_ENDPOINTS") or None,
            job=env.get("PADDLE_JOB_NAME") or None,
            namespace=env.get("PADDLE_NAMESPACE") or "local",
            etcd_ca_file=env.get("PADDLE_ETCD_CA_FILE") or None,
        )

    def describe(self) -> str:
        if self.master_endpoint:
            return self.master_endpoint
        return f"the leader of job {self.namespace}/{self.job} in etcd {self.etcd_endpoints}"

    def resolve(self, *, timeout: float = 5.0, avoid: str | None = None) -> str:
        """The master's HOST:PORT now. Raises DiscoveryError when no leader is published.

        `avoid`: an address that just did not answer. A dead leader's key outlives it until
        its lease lapses; while the key still names `avoid`, another master present in etcd
        (a standby: it holds a trainer's call until the election is decided) is returned
        instead, if there is one."""
        if self.master_endpoint:
            return self.master_endpoint
        keys = JobKeys(self.namespace, self.job or "")
        found = self._range(keys.leader, timeout=timeout)
        if not found:
            raise DiscoveryError(f"no leader published yet for job {self.namespace}/{self.job}")
        leader = base64.b64decode(found[0]["value"]).decode()
        if leader != avoid:
            return leader
        present = keys.master("")  # every master's presence key: `masters/<advertise>`
        others = [name for kv in self._range(present, timeout=timeout, prefix=True)
                  if (name := base64.b64decode(kv["key"])[len(present):].decode(errors="replace")) != avoid]
        return random.choice(others) if others else leader

    def _range(self, key: bytes, *, timeout: float, prefix: bool = False) -> list[dict]:
        """The gateway's `kvs` for `key` (`prefix`: every key under it, names only), from the
        first etcd endpoint that answers."""
        errors = []
        endpoints = self.etcd_endpoints or ""
        scheme, context = "http", None
        if uses_tls(endpoints):
            scheme, context = "https", self._tls_context()
        for host, port in parse_endpoints(endpoints):
            try:
                return _etcd_range(f"{scheme}://{host}:{port}", key, timeout=timeout, context=context,
                                   prefix=prefix)
            except (OSError, ValueError) as error:
                errors.append(f"{host}:{port}: {_explain(error)}")
        raise DiscoveryError(f"etcd unreachable at {self.etcd_endpoints}: {'; '.join(errors)}")


    def _tls_context(self) -> ssl.SSLContext:
        """Server authentication only: the CA, and the host name checked; no client certificate."""
        try:
            return ssl.create_default_context(cafile=self.etcd_ca_file)
        except OSError as error:
            raise DiscoveryError(f"cannot read PADDLE_ETCD_CA_FILE {self.etcd_ca_file}: "
                                 f"{error.strerror or error}") from None


def _explain(error: Exception) -> str:
    """What a failed read of the leader key means, for the operator."""
    reason = getattr(error, "reason", error)  # urllib wraps the TLS error
    if isinstance(reason, ssl.SSLCertVerificationError):
        return (f"its TLS certificate is not trusted ({reason.verify_message}): check "
                "PADDLE_ETCD_CA_FILE")
    text = str(error)
    wants_credentials = (isinstance(reason, ssl.SSLEOFError)  # a handshake ended for want of one
                         or any(alert in text.upper().replace(" ", "_")  # TLS 1.3, 1.2 alerts
                                for alert in ("CERTIFICATE_REQUIRED", "ALERT_BAD_CERTIFICATE"))
                         or "HTTP Error 401" in text or "user name is empty" in text)
    if wants_credentials:
        return (f"it asks for etcd credentials (a client certificate or a user: {text}); trainers "
                "have none: set PADDLE_MASTER_ENDPOINT (the job's Service) instead of discovering "
                "the master through etcd")
    return text


def _etcd_range(base_url: str, key: bytes, *, timeout: float, context: ssl.SSLContext | None = None,
                prefix: bool = False) -> list[dict]:
    """The gateway's `kvs` for `key` (with `prefix`: every key under it, names only)."""
    request_body = {"key": base64.b64encode(key).decode()}
    if prefix:
        request_body.update(range_end=base64.b64encode(prefix_range_end(key)).decode(), keys_only=True)
    body = json.dumps(request_body).encode()
    for path in ("/v3/kv/range", "/v3beta/kv/range"):
        request = urllib.request.Request(base_url + path, data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as reply:
                return json.loads(reply.read()).get("kvs") or []
        except urllib.error.HTTPError as error:
            if error.code == 404:
                continue  # an older gateway prefix
            raise
    raise ValueError(f"etcd at {base_url} has no JSON gateway")
