"""One leader among the autoscaler's replicas: a `coordination.k8s.io/v1` Lease, the way
Kubernetes' own controllers elect theirs (client-go's leaderelection, learnt from, not copied).

The official Python client ships a `leaderelection` package, but it reads the process-wide
default configuration, exits the process on a bad setting and owns its loop with no way to
stop it; this elector is a single call, `try_acquire_or_renew()`, made by the controller at
the top of each round on its own API client.

How it decides: no Lease -> create it holding it (a create that answers 409 lost the race);
held by this replica -> renew it; held by another -> take it over only once its record has not
changed for `lease_duration_s` as measured on THIS replica's monotonic clock (client-go's
"observed time": clocks of different machines are never compared). Every write is a merge
patch naming the Lease's resourceVersion, so of two replicas that try at once the API server
lets one win (409 Conflict for the other).

What it does NOT guarantee: fencing. A leader paused longer than the lease (a GC stop, a
partition) may act once more after another took over; each round re-reads the cluster and
the masters' ranges, and a `scale` is idempotent (it sets a size, never adds), so a stale
leader's last round sets sizes a fresh plan would have set or corrects at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_LEASE_DURATION_S = 15


class LeaseElector:
    """Campaigns for, renews and releases the Lease `namespace/name` as `identity`."""

    def __init__(self, api_client: Any, *, name: str, namespace: str, identity: str,
                 lease_duration_s: int = DEFAULT_LEASE_DURATION_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from kubernetes import client

        if not identity:
            raise ValueError(f"The elector's identity ({identity!r}) must be a non-empty string.")
        if not isinstance(lease_duration_s, int) or lease_duration_s < 1:
            raise ValueError(f"The lease duration ({lease_duration_s!r} s) must be an integer >= 1.")
        self._api = client.CoordinationV1Api(api_client)
        self.name, self.namespace, self.identity = name, namespace, identity
        self.lease_duration_s = lease_duration_s
        self._clock = clock
        self._observed: tuple[Any, float] | None = None  # (the other holder's record, when seen)
        self.leading = False

    def _record(self, holder: str, *, acquired: str, transitions: int) -> dict[str, Any]:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return {"holderIdentity": holder, "leaseDurationSeconds": self.lease_duration_s,
                "acquireTime": acquired or now, "renewTime": now, "leaseTransitions": transitions}

    def try_acquire_or_renew(self) -> bool:
        """Whether this replica leads now (it holds a Lease it just wrote)."""
        from kubernetes.client.rest import ApiException

        try:
            lease = self._api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as error:
            if error.status != 404:
                return self._lost(f"cannot read the Lease: {error.status} {error.reason}")
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._record(self.identity, acquired="", transitions=0)}
            try:
                self._api.create_namespaced_lease(self.namespace, body)
            except ApiException as create_error:
                return self._lost(f"another replica created the Lease first ({create_error.status})")
            return self._won("created the Lease")
        spec = lease.spec
        holder = spec.holder_identity if spec else None
        mine = holder == self.identity
        if holder and not mine:
            record = (holder, spec.renew_time, spec.lease_transitions)
            now = self._clock()
            if self._observed is None or self._observed[0] != record:
                self._observed = (record, now)
            duration = spec.lease_duration_seconds or self.lease_duration_s
            if now - self._observed[1] < duration:
                return self._lost(f"held by {holder}")
        transitions = (spec.lease_transitions or 0) if spec else 0
        acquired = spec.acquire_time if mine and spec and spec.acquire_time else None
        # a merge patch that names the resourceVersion is conditional: 409 when it moved on
        body = {"metadata": {"resourceVersion": lease.metadata.resource_version},
                "spec": self._record(self.identity,
                                     acquired=acquired.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if acquired else "",
                                     transitions=transitions if mine else transitions + 1)}
        try:
            self._api.patch_namespaced_lease(self.name, self.namespace, body,
                                             _content_type="application/merge-patch+json")
        except ApiException as error:
            return self._lost(f"the Lease changed under us ({error.status})")
        return self._won("renewed the Lease" if mine else f"took the Lease over from {holder or 'nobody'}")

    def release(self) -> None:
        """Gives the Lease up (on shutdown) so another replica takes over at once."""
        from kubernetes.client.rest import ApiException

        if not self.leading:
            return
        self.leading = False
        try:
            lease = self._api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec and lease.spec.holder_identity == self.identity:
                self._api.patch_namespaced_lease(
                    self.name, self.namespace,
                    {"metadata": {"resourceVersion": lease.metadata.resource_version},
                     "spec": {"holderIdentity": None}},
                    _content_type="application/merge-patch+json")
                logger.info("%s released the Lease %s/%s", self.identity, self.namespace, self.name)
        except ApiException as error:
            logger.warning("could not release the Lease %s/%s: %s", self.namespace, self.name, error.reason)

    def _won(self, how: str) -> bool:
        if not self.leading:
            logger.info("%s leads the autoscaler: %s %s/%s", self.identity, how, self.namespace, self.name)
        self.leading = True
        return True

    def _lost(self, why: str) -> bool:
        if self.leading:
            logger.warning("%s no longer leads the autoscaler: %s", self.identity, why)
        else:
            logger.debug("%s follows: %s", self.identity, why)
        self.leading = False
        return False
