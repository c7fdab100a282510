"""The autoscaler's controller: reads the cluster, plans, and resizes jobs through their masters.

One synchronous loop in its own thread (the official `kubernetes` client and gRPC are both
blocking): every `interval_s`, and at once after a watch event on nodes or pods, the leader
(see `autoscaler.lease`) reads the nodes, the pods and the jobs (their master Deployments,
cluster-wide), asks each job's master for its range (GetStatus at the master's Service),
builds the planner's `Cluster` (`autoscaler.snapshot`), calls `plan`, and applies each change
through the job's own scale path: the master's `ScaleTrainers` RPC (`scale_trainers`, the call
`paddlecloud job scale` makes), shrinks before growths so room frees before it is taken,
each retried. Both calls carry the scaler token of the job's namespace (`Settings.token_for`,
derived from the autoscaler's key), which a master with tokens accepts for GetStatus and
ScaleTrainers and nothing else (`paddlecloud.auth`; the master mounts its namespace's token
from the Secret `paddlecloud-scaler`). Every change is logged with its reasons and recorded as a Kubernetes Event on
the job's master Deployment. With `dry_run` the plan is printed (logged) and nothing changes:
no RPC that writes, no Event.

The job's master does the resize: for a Volcano job its scale path keeps the PodGroup's
minMember (`paddlecloud.backends.k8s.deployer`), so the autoscaler needs no right on PodGroups. Pservers
are never scaled (the planner sizes trainers only; pservers are load).

What it does NOT guarantee: that the scheduler places the new trainers where the dry run
did; that a scale the master refused (outside the range, a job finishing) is retried beyond
`attempts` — the next round plans afresh from what the master then says; that a job whose
master cannot be reached is planned (its pods stay load, it is never resized).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from autoscaler.lease import LeaseElector
from autoscaler.planner import DEFAULT_MAX_LOAD_DESIRED, Change, Cluster, Plan, describe, plan
from autoscaler.snapshot import JobRange, build_cluster, job_key
from paddlecloud.auth import scaler_token
from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.k8s.jobs import fetch_master_status, master_ca, scale_trainers

logger = logging.getLogger(__name__)

COMPONENT = "paddlecloud-autoscaler"
EVENT_REASON = "AutoscalerScaled"
MASTER_QUERIES = 16  # GetStatus calls in flight at once
MASTER_SELECTOR = f"{manifests.APP_LABEL}={manifests.APP_NAME},{manifests.ROLE_LABEL}={manifests.MASTER}"


@dataclass(frozen=True)
class Settings:
    """How the controller runs; every field has the CLI's default."""

    dry_run: bool = False
    interval_s: float = 5.0
    max_load_desired: float = DEFAULT_MAX_LOAD_DESIRED
    rpc_timeout_s: float = 5.0
    attempts: int = 3
    retry_wait_s: float = 0.5
    # the autoscaler's key: each namespace's scaler token is derived from it (paddlecloud.auth)
    scaler_key: str | None = field(default=None, repr=False)
    watch_window_s: int = 30  # one watch request's life; a stopped controller's watches end within it

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"The interval ({self.interval_s!r} s) must be > 0.")
        if not 0 < self.max_load_desired <= 1:
            raise ValueError(f"max_load_desired ({self.max_load_desired!r}) must be in (0, 1].")
        if self.attempts < 1:
            raise ValueError(f"The attempts ({self.attempts!r}) must be >= 1.")

    def token_for(self, namespace: str) -> str | None:
        """The scaler token the masters of `namespace` accept; None without a key."""
        return scaler_token(self.scaler_key, namespace) if self.scaler_key else None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


REFUSALS = ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "PERMISSION_DENIED", "UNAUTHENTICATED")


def scale_job(address: str, trainers: int, *, job: str, settings: Settings,
              token: str | None = None, ca: bytes | None = None) -> bool:
    """Sets a job's trainers through its master at `address` (`ScaleTrainers`, the call of
    `paddlecloud job scale`), retried with backoff while the master cannot be reached; False
    when it refused (out of range, a finishing job: the next round replans) or never answered.
    `token`: the caller's (the scaler token of the job's namespace); `ca`: the job's CA,
    published on its master Deployment (TLS)."""
    import grpc

    wait = settings.retry_wait_s
    for attempt in range(1, settings.attempts + 1):
        try:
            scale_trainers(address, trainers, timeout=settings.rpc_timeout_s, token=token, ca=ca)
            return True
        except grpc.RpcError as error:
            logger.warning("job %s: scale to %d failed (attempt %d/%d): %s %s", job, trainers,
                           attempt, settings.attempts, error.code(), error.details())
            if error.code().name in REFUSALS:
                return False  # an answer, not a failure to reach
        if attempt < settings.attempts:
            time.sleep(wait)
            wait *= 2
    return False


def _ca_of(deployment: Mapping[str, Any]) -> bytes | None:
    """The job's CA published on its master Deployment (`paddlecloud.backends.k8s.jobs.master_ca`)."""
    return master_ca((deployment.get("metadata") or {}).get("annotations"))


class Controller:
    """One autoscaler replica: `step()` is one round; `run()` loops until stopped."""

    def __init__(self, api_client: Any, *, settings: Settings = Settings(),
                 master_address: Callable[[str, str], str] = manifests.master_address) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.settings = settings
        self.master_address = master_address
        self._core = client.CoreV1Api(api_client)
        self._apps = client.AppsV1Api(api_client)
        self.wake = threading.Event()
        self.last_plan: Plan | None = None
        self._refused: set[str] = set()  # jobs whose master refused our token (said once)

    # ---- reading ---------------------------------------------------------------------
    def _dicts(self, items: Iterable[Any]) -> list[dict[str, Any]]:
        return [self.api_client.sanitize_for_serialization(i) for i in items]

    def masters(self) -> list[dict[str, Any]]:
        """The jobs' master Deployments, cluster-wide."""
        found = self._apps.list_deployment_for_all_namespaces(label_selector=MASTER_SELECTOR)
        return self._dicts(found.items or [])

    def job_range(self, namespace: str, name: str, *, ca: bytes | None = None) -> JobRange | None:
        """The job's range and desired size as its master says (TLS checked against `ca`, the
        job's CA); None when it cannot tell."""
        import grpc

        address = self.master_address(name, namespace)
        key = job_key(namespace, name)
        try:
            reply = fetch_master_status(address, timeout=self.settings.rpc_timeout_s,
                                        token=self.settings.token_for(namespace), ca=ca)
        except grpc.RpcError as error:
            if error.code().name in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
                if key not in self._refused:  # a warning once, until the master accepts us again
                    self._refused.add(key)
                    logger.warning("job %s: its master refused our scaler token (%s): not planned "
                                   "until the Secret %s of namespace %s holds this autoscaler's token",
                                   key, error.code().name, manifests.SCALER_SECRET, namespace)
            else:
                logger.info("job %s: its master at %s did not answer (%s): not planned", key,
                            address, error.code())
            return None
        self._refused.discard(key)
        if reply.min_trainers < 1 or reply.max_trainers < reply.min_trainers:
            return None  # a master that knows no range yet
        return JobRange(namespace=namespace, name=name, min_trainers=reply.min_trainers,
                        max_trainers=reply.max_trainers, desired=reply.desired_trainers)

    def snapshot(self) -> tuple[Cluster, dict[str, dict[str, Any]]]:
        """The planner's Cluster, and each planned job's master Deployment by job key. The
        masters are asked at once (a pool of threads), so one that does not answer costs a
        round `rpc_timeout_s`, not that times the jobs."""
        nodes = self._dicts(self._core.list_node().items or [])
        pods = self._dicts(self._core.list_pod_for_all_namespaces().items or [])
        jobs = {}
        for deployment in self.masters():
            meta = deployment["metadata"]
            name = (meta.get("labels") or {}).get(manifests.JOB_LABEL)
            if name:
                jobs[job_key(meta["namespace"], name)] = (meta["namespace"], name, deployment)
        with ThreadPoolExecutor(max_workers=MASTER_QUERIES, thread_name_prefix="get-status") as pool:
            answers = list(pool.map(lambda job: self.job_range(job[0], job[1], ca=_ca_of(job[2])),
                                    jobs.values()))
        ranges = [found for found in answers if found is not None]
        deployments = {job_key(r.namespace, r.name): jobs[job_key(r.namespace, r.name)][2] for r in ranges}
        return build_cluster(nodes=nodes, pods=pods, ranges=ranges), deployments

    # ---- one round -------------------------------------------------------------------
    def step(self) -> Plan:
        """Reads, plans and (unless dry run) applies; returns the plan."""
        cluster, deployments = self.snapshot()
        seen = describe(cluster)
        logger.debug("cluster inquiry: %s", seen)
        if self.settings.dry_run:
            print(f"dry run: {seen}", flush=True)
        result = plan(cluster, max_load_desired=self.settings.max_load_desired)
        self.last_plan = result
        if not result.changes:
            logger.debug("plan: no change (%d jobs on %d nodes)", len(cluster.jobs), len(cluster.nodes))
            if self.settings.dry_run:
                print(f"dry run: no change ({len(cluster.jobs)} jobs on {len(cluster.nodes)} nodes)",
                      flush=True)
        for change in sorted(result.changes, key=lambda c: c.after - c.before):  # shrinks first
            why = "; ".join(change.reasons)
            if self.settings.dry_run:
                print(f"dry run: job {change.job} {change.before} -> {change.after} trainers ({why})",
                      flush=True)
                continue
            logger.info("job %s: %d -> %d trainers (%s)", change.job, change.before, change.after, why)
            if self.apply(change, ca=_ca_of(deployments[change.job])):
                self.record_event(deployments[change.job], change)
        return result

    def apply(self, change: Change, *, ca: bytes | None = None) -> bool:
        """Sets the job's trainers through its master (see `scale_job`)."""
        namespace, _, name = change.job.partition("/")
        return scale_job(self.master_address(name, namespace), change.after, job=change.job,
                         settings=self.settings, token=self.settings.token_for(namespace), ca=ca)

    def record_event(self, deployment: Mapping[str, Any], change: Change) -> None:
        """A core/v1 Event on the job's master Deployment (best effort: logged when refused)."""
        from kubernetes.client.rest import ApiException

        meta = deployment["metadata"]
        now = _now()
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "apps/v1", "kind": "Deployment", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta.get("uid")},
            "reason": EVENT_REASON, "type": "Normal",
            "message": (f"trainers {change.before} -> {change.after}: "
                        + "; ".join(change.reasons))[:1000],
            "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self._core.create_namespaced_event(meta["namespace"], body)
        except ApiException as error:
            logger.warning("job %s: could not record the Event: %s %s", change.job, error.status,
                           error.reason)

    # ---- the loop --------------------------------------------------------------------
    def run(self, stop: threading.Event, *, elector: LeaseElector | None) -> None:
        """Rounds until `stop` is set: each one renews (or campaigns for) the Lease first, and
        only the leader plans. A round that fails is logged and the next one comes."""
        try:
            while not stop.is_set():
                self.wake.clear()
                if elector is None or elector.try_acquire_or_renew():
                    try:
                        self.step()
                    except Exception:
                        logger.exception("autoscaler round failed; the next one comes in %.1f s",
                                         self.settings.interval_s)
                deadline = time.monotonic() + self.settings.interval_s
                while not stop.is_set() and time.monotonic() < deadline:
                    if self.wake.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
                        break
        finally:
            if elector is not None:
                elector.release()

    def watch(self, stop: threading.Event, *, list_fn: Callable[..., Any], what: str) -> None:
        """Sets `wake` on every event of `list_fn`'s watch until `stop`; reconnects on errors."""
        from kubernetes import watch

        while not stop.is_set():
            stream = watch.Watch()
            try:
                window = self.settings.watch_window_s
                for _ in stream.stream(list_fn, timeout_seconds=window, _request_timeout=2 * window):
                    self.wake.set()
                    if stop.is_set():
                        break
            except Exception as error:  # the API server went away: watch again shortly
                logger.debug("watch on %s ended: %s", what, error)
                stop.wait(1.0)
            finally:
                stream.stop()

    def start_watches(self, stop: threading.Event) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.watch, args=(stop,), daemon=True, name=f"watch-{what}",
                                    kwargs={"list_fn": fn, "what": what})
                   for what, fn in (("nodes", self._core.list_node),
                                    ("pods", self._core.list_pod_for_all_namespaces))]
        for thread in threads:
            thread.start()
        return threads
