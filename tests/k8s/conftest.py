"""A Kubernetes API for the tests: kmock's emulator served over HTTP, driven by the real client.

kmock (PyPI) keeps objects in memory and answers the Kubernetes REST API; the code
under test talks to it through the official `kubernetes` client over a real HTTP
socket — nothing in the client is patched. Where kmock falls short of a real API
server, the gap is filled HERE, in `_fill_kmock_gaps`, and nowhere else:

1. uid: a real API server gives every created object a uid (owner references
   need it); kmock stores the body as sent, so created objects get one here.
2. 201 Created: the client maps only a 201 answer of a create to a body for
   custom objects (the Volcano PodGroup); kmock answers 200, so creates answer 201.
3. label selectors: kmock ignores `?labelSelector=`; lists are filtered here.
4. no controllers run: nothing fills a Job's status or makes pods; tests play the
   Job controller with `set_job_status` and create pods with `add_pod`.
5. error answers write anyway: kmock stores a created object even when a test
   makes the create answer an error (as a server whose answer was lost would);
   tests that inject errors rely on no more than that.
6. one Namespace: kmock takes `GET /api/v1/namespaces/NAME` for that namespace's root,
   not for the Namespace object; it is answered here, with the labels a test gives in
   `Cluster.namespace_labels` (and the API server's own `kubernetes.io/metadata.name`).
9. server-side apply: kmock takes an apply (`PATCH`, `application/apply-patch+yaml`) for
   a merge patch, answers 404 when the object is absent, and keeps no field managers.
   `ServerSideApply` (the class the `kmock` fixture runs) plays the API server's part:
   an apply to an absent object creates it; otherwise the fields the apply states are set,
   those its manager stated before and omits now are removed (unless another manager holds
   them), and a field another manager owns that the apply would change is a 409 naming the
   manager and the field, unless `force=true` takes it over. An update (`PUT`) replaces the
   object with what it sends (kmock serves none). Every other write (a create, a merge patch) makes its manager (`?fieldManager=`, else the client's user agent, as the
   API server defaults it) the owner of the fields it changed (operation Update); a JSON
   patch (Kopf's) changes no owner. Kept simple: a list is one field (the API server merges some lists by key), and the managers
   are kept beside the objects (`Cluster.managers`), not in their `metadata.managedFields`.
10. foreground deletion: kmock removes a deleted object at once, whatever the propagation.
   A test that plays the kubelet and the garbage collector (`Cluster.hold_foreground_deletions`)
   gets the API server's behaviour for the resources it names: a delete with
   `propagationPolicy: Foreground` gives the object the `foregroundDeletion` finalizer and a
   deletionTimestamp, so it stays readable until the test, once the dependents are gone,
   finishes the deletion (`Cluster.collect_garbage`).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import re
import uuid
from collections.abc import Callable
from typing import Any

import kmock as kmocklib
import kubernetes_validate.utils
import pytest
import waiting

from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.k8s.client import APPLY_PATCH
from paddlecloud.jobspec import JobSpec

# kubernetes-validate reads and parses its schema files (a `_definitions.json` of megabytes)
# on every call: 0.11 s a manifest here, most of the k8s tests' time. The files never change
# and jsonschema does not mutate a schema, so each is read once per process (0.012 s a call).
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(
    kubernetes_validate.utils.schema_contents)

# The `reason` of an error status the tests inject (Cluster.fail, Cluster.slow).
REASONS = {403: "Forbidden", 404: "NotFound", 409: "AlreadyExists", 429: "TooManyRequests",
           500: "InternalError", 503: "ServiceUnavailable"}
RESOURCES = {
    "configmaps": kmocklib.resource("", "v1", "configmaps"),
    "services": kmocklib.resource("", "v1", "services"),
    "secrets": kmocklib.resource("", "v1", "secrets"),
    "networkpolicies": kmocklib.resource("networking.k8s.io", "v1", "networkpolicies"),
    "pods": kmocklib.resource("", "v1", "pods"),
    "deployments": kmocklib.resource("apps", "v1", "deployments"),
    "statefulsets": kmocklib.resource("apps", "v1", "statefulsets"),
    "jobs": kmocklib.resource("batch", "v1", "jobs"),
    "podgroups": kmocklib.resource("scheduling.volcano.sh", "v1beta1", "podgroups"),
    "serviceaccounts": kmocklib.resource("", "v1", "serviceaccounts"),
    "roles": kmocklib.resource("rbac.authorization.k8s.io", "v1", "roles"),
    "rolebindings": kmocklib.resource("rbac.authorization.k8s.io", "v1", "rolebindings"),
}


def _matches(labels: dict[str, str], selector: str) -> bool:
    """Equality-based label selectors (`a=b,c=d`), the only kind the code under test sends."""
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _fill_kmock_gaps(kmock: Any, namespace_labels: dict[str, dict[str, str]]) -> None:
    """The one place where the emulator is made to act like an API server (see the module doc)."""

    def namespace(request: Any) -> dict[str, Any]:  # gap 6
        name = request.url.path.rsplit("/", 1)[1]
        labels = {manifests.NAMESPACE_NAME_LABEL: name, **namespace_labels.get(name, {})}
        return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}

    def created(request: Any) -> dict[str, Any]:  # gaps 1 and 2
        meta = (request.data or {}).get("metadata") or {}
        obj = kmock.objects[request.resource, request.namespace or meta.get("namespace"), meta["name"]]
        if not (obj.get("metadata") or {}).get("uid"):
            obj.patch({"metadata": {"uid": str(uuid.uuid4()),
                                    "creationTimestamp": "2026-01-01T00:00:00Z"}})
        return obj.raw

    def listed(request: Any) -> Any:  # gap 3
        if request.resource is None or not request.resource.plural:
            return NotImplemented  # discovery (/apis/GROUP/VERSION): kmock's own answer
        selector = request.params.get("labelSelector", "")
        items = [
            obj.raw for (resource, namespace, _), obj in kmock.objects.items()
            if resource == request.resource and not obj.deleted
            and (request.namespace is None or namespace == request.namespace)
            and _matches((obj.raw.get("metadata") or {}).get("labels") or {}, selector)
        ]
        return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"},
                "items": items}

    # Priority -1: below the reactions a test adds (errors), above kmock's own fallbacks.
    (kmock ** -1)[kmocklib.action.CREATE] << 201 << created
    # before `listed`: kmock parses this GET as a list too, and a reaction that answers
    # NotImplemented is disabled for good
    (kmock ** -1)[kmocklib.method.GET, re.compile(r"^/api/v1/namespaces/[^/]+$")] << namespace
    (kmock ** -1)[kmocklib.action.LIST] << listed


# ---- 9. server-side apply ------------------------------------------------------------------------
Path = tuple[str, ...]
IDENTITY: frozenset[Path] = frozenset({("apiVersion",), ("kind",), ("metadata", "name"),
                                       ("metadata", "namespace"), ("metadata", "uid"),
                                       ("metadata", "resourceVersion")})
ABSENT = object()
FOREGROUND_FINALIZER = "foregroundDeletion"  # what the API server adds for a foreground delete


def _leaves(obj: dict[str, Any], prefix: Path = ()) -> dict[Path, Any]:
    """The fields an object states, by path: a non-empty dict is its fields, anything else
    (a list included: kept simple, see gap 9) is one field."""
    out: dict[Path, Any] = {}
    for key, value in obj.items():
        path = (*prefix, key)
        if isinstance(value, dict) and value:
            out.update(_leaves(value, path))
        elif path not in IDENTITY:
            out[path] = value
    return out


def _at(obj: Any, path: Path) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return ABSENT
        obj = obj[key]
    return obj


def _put(obj: dict[str, Any], path: Path, value: Any) -> None:
    for key in path[:-1]:
        obj = obj.setdefault(key, {})
    obj[path[-1]] = copy.deepcopy(value)


def _remove(obj: dict[str, Any], path: Path) -> None:
    for key in path[:-1]:
        obj = obj.get(key)
        if not isinstance(obj, dict):
            return
    obj.pop(path[-1], None)


def _overlap(a: Path, b: Path) -> bool:
    return a[:len(b)] == b or b[:len(a)] == a


def _dotted(path: Path) -> str:
    return "." + ".".join(path)


class ServerSideApply(kmocklib.KubernetesEmulator):
    """kmock's emulator, with the API server's server-side apply and field managers (gap 9)."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # (resource, namespace, name) -> (manager, operation) -> the fields it owns
        self.managed: dict[Any, dict[tuple[str, str], set[Path]]] = {}
        self.creating: set[int] = set()  # the ids of the applies that created their object
        self.held_deletions: set[str] = set()  # resource plurals deleted in the foreground (gap 10)
        self.fallback[kmocklib.method.PUT] << self._serve_replace

    async def _serve_replace(self, request: Any) -> dict[str, Any]:
        async with self._lock:
            return self._objects[request.resource, request.namespace, request.name].raw

    async def _handle(self, request: Any) -> Any:
        method = str(request.method.value).upper() if request.method else ""
        if method == "PUT" and request.resource is not None and request.name:
            async with self._lock:
                await self._replace(request)
            return await kmocklib.RawHandler._handle(self, request)
        if method == "DELETE" and request.resource is not None and request.name:
            await self._hold_for_foreground(request)
        if request.resource is None or method not in ("POST", "PATCH"):
            return await super()._handle(request)
        if method == "PATCH" and request.name and str(
                request.headers.get("Content-Type", "")).startswith(APPLY_PATCH):
            async with self._lock:
                await self._apply(request)
            # the object is written: reactions (a test's injected error) and the answer
            return await kmocklib.RawHandler._handle(self, request)
        if not isinstance(request.data, dict):  # a JSON patch (Kopf's): not kept, kept simple
            return await super()._handle(request)
        meta = request.data.get("metadata") or {}
        key = (request.resource, request.namespace or meta.get("namespace"),
               request.name or meta.get("name"))
        before = self._current(key)
        response = await super()._handle(request)
        if response.status < 300 and request.subresource is None:
            self._updated(key, before or {}, request.data, self._manager(request))
        return response

    async def _hold_for_foreground(self, request: Any) -> None:
        """A foreground delete of a held resource (gap 10): the API server's finalizer, so
        kmock marks the object deleting instead of removing it."""
        if (request.resource.plural not in self.held_deletions
                or (request.data or {}).get("propagationPolicy") != "Foreground"):
            return
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            current = self._current(key)
            if current is None or current["metadata"].get("deletionTimestamp"):
                return
            finalizers = current["metadata"].get("finalizers") or []
            if FOREGROUND_FINALIZER not in finalizers:
                self._objects[key].patch({"metadata": {"finalizers": [*finalizers, FOREGROUND_FINALIZER]}})

    def _current(self, key: Any) -> dict[str, Any] | None:
        if key not in self._objects or self._objects[key].deleted:
            return None
        return copy.deepcopy(self._objects[key].raw)

    @staticmethod
    def _manager(request: Any) -> str:
        """`?fieldManager=`, else the user agent's product, as the API server defaults it."""
        agent = str(request.headers.get("User-Agent", "unknown"))
        return request.params.get("fieldManager") or agent.split("/", 1)[0]

    def _updated(self, key: Any, before: dict[str, Any], written: dict[str, Any],
                 manager: str) -> None:
        """A create or a merge patch: its manager now owns the fields it changed."""
        owners = self.managed.setdefault(key, {})
        changed = {path for path, value in _leaves(written).items()
                   if value is not None and _at(before, path) != value}
        removed = {path for path, value in _leaves(written).items() if value is None}
        for fields in owners.values():
            fields -= {f for f in fields if any(_overlap(f, p) for p in changed | removed)}
        owners.setdefault((manager, "Update"), set()).update(changed)

    async def _apply(self, request: Any) -> None:
        manager = request.params.get("fieldManager")
        if not manager:
            raise kmocklib.KubernetesError(status=422, reason="Invalid",
                                           message="fieldManager is required for apply patch")
        force = str(request.params.get("force", "")).lower() == "true"
        body = request.data or {}
        key = (request.resource, request.namespace, request.name)
        current = self._current(key)
        applied = _leaves(body)
        uid = (body.get("metadata") or {}).get("uid")
        if current is None:
            if uid:
                raise kmocklib.KubernetesError(status=409, reason="Conflict", message=(
                    f"uid mismatch: the provided object specified uid {uid}, and no existing "
                    "object was found"))
            created = copy.deepcopy(body)
            created.setdefault("metadata", {}).update(
                name=request.name, uid=str(uuid.uuid4()), resourceVersion="1",
                creationTimestamp="2026-01-01T00:00:00Z",
                **({"namespace": request.namespace} if request.namespace else {}))
            self.managed[key] = {(manager, "Apply"): set(applied)}
            self.creating.add(request.id)
            self._store(key, created)
            await self._buses[request.resource].put({"type": "ADDED", "object": created})
            return
        if uid and uid != (current.get("metadata") or {}).get("uid"):
            raise kmocklib.KubernetesError(status=422, reason="Invalid",
                                           message=f'metadata.uid: Invalid value: "{uid}": field is immutable')
        owners = self.managed.setdefault(key, {})
        mine = (manager, "Apply")
        conflicts = [(other[0], field) for other, fields in owners.items() if other != mine
                     for field in sorted(fields) for path, value in applied.items()
                     if _overlap(field, path) and _at(current, path) != value]
        if conflicts and not force:
            raise kmocklib.KubernetesError(status=409, reason="Conflict", message=(
                f"Apply failed with {len(conflicts)} conflict{'s' if len(conflicts) > 1 else ''}: "
                + "; ".join(f'conflict with "{who}" using {body.get("apiVersion")}: {_dotted(field)}'
                            for who, field in conflicts)))
        for other, fields in owners.items():  # forced: taken over
            if other != mine:
                fields -= {f for f in fields if any(_overlap(f, p) for p in applied)}
        merged = copy.deepcopy(current)
        for path in owners.get(mine, set()) - set(applied):  # stated before, omitted now
            if not any(_overlap(path, f) for other, fs in owners.items() if other != mine
                       for f in fs):
                _remove(merged, path)
        for path, value in applied.items():
            _put(merged, path, value)
        owners[mine] = set(applied)
        self._store(key, merged)
        await self._buses[request.resource].put({"type": "MODIFIED", "object": merged})

    async def _replace(self, request: Any) -> None:
        """An update (PUT): the object becomes the body as sent, what it omits is gone."""
        key = (request.resource, request.namespace, request.name)
        current = self._current(key)
        if current is None:
            raise kmocklib.KubernetesError(status=404, reason="NotFound",
                                           message=f"{request.resource.plural} {request.name!r} not found")
        replaced = copy.deepcopy(request.data or {})
        replaced.setdefault("metadata", {}).update(
            {k: current["metadata"][k] for k in ("uid", "creationTimestamp")
             if k in current.get("metadata", {})})
        kept = set(_leaves(replaced))
        for fields in self.managed.setdefault(key, {}).values():
            fields &= kept
        self._updated(key, current, replaced, self._manager(request))
        self._store(key, replaced)
        await self._buses[request.resource].put({"type": "MODIFIED", "object": replaced})

    def _store(self, key: Any, raw: dict[str, Any]) -> None:
        if key in self._objects:
            self._objects[key].create(raw)
        else:
            self._objects[key] = raw


@pytest.fixture
def kmock_options(kmock_options: dict[str, Any]) -> dict[str, Any]:
    """Every test's kmock is `ServerSideApply` (gap 9)."""
    return {**kmock_options, "cls": ServerSideApply}


class Cluster:
    """The emulated API server and what tests do with it beyond the client's calls."""

    def __init__(self, kmock: Any) -> None:
        self.kmock = kmock
        self.namespace_labels: dict[str, dict[str, str]] = {}  # gap 6

    @property
    def url(self) -> str:
        return str(self.kmock.url).rstrip("/")

    def stored(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object as the emulator holds it now, None when absent or deleted."""
        key = (RESOURCES[resource], namespace, name)
        if key not in self.kmock.objects or self.kmock.objects[key].deleted:
            return None
        return self.kmock.objects[key].raw

    def managers(self, resource: str, namespace: str, name: str) -> dict[str, set[str]]:
        """The field managers of an object (gap 9): "MANAGER (Apply|Update)" -> its fields."""
        owners = self.kmock.managed.get((RESOURCES[resource], namespace, name), {})
        return {f"{manager} ({operation})": {_dotted(f) for f in fields}
                for (manager, operation), fields in owners.items() if fields}

    def posted(self) -> list[tuple[str, str]]:
        """(resource plural, object name) of every create the emulator saw, in order: a POST,
        or an apply that found no object (gap 9)."""
        out = []
        for request in self.kmock:
            if request.action == kmocklib.action.CREATE or request.id in self.kmock.creating:
                meta = (request.data or {}).get("metadata") or {}
                out.append((request.resource.plural, meta.get("name")))
        return out

    def requests(self) -> list[tuple[str, str | None, str | None]]:
        """(HTTP method, resource plural, subresource) of every API request, in order."""
        return [(str(r.method.value).upper(), r.resource.plural if r.resource else None,
                 r.subresource) for r in self.kmock]

    def rbac_requests(self, since: int = 0) -> set[tuple[str, str, str, str | None]]:
        """(API group, resource, RBAC verb, object name or None) of every API request from
        request number `since`: what the API server's authorizer sees of it."""
        out = set()
        for request in list(self.kmock)[since:]:
            method = str(request.method.value).upper()
            if method == "GET":
                verb = "get" if request.name else ("watch" if request.params.get("watch") else "list")
            else:
                verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
            out.add((request.resource.group, request.resource.plural, verb, request.name or None))
            if request.id in self.kmock.creating:  # an apply that creates is a create too (gap 9)
                out.add((request.resource.group, request.resource.plural, "create", None))
        return out

    def rbac_verbs(self, since: int = 0) -> set[tuple[str, str, str]]:
        """(API group, resource, RBAC verb) of every API request from request number `since`."""
        return {(group, resource, verb) for group, resource, verb, _ in self.rbac_requests(since)}


    def fail(self, method: str, resource: str, *, status: int, times: int = 1,
             message: str = "injected by the test") -> list[int]:
        """Makes the next `times` requests of `method` on `resource` answer `status`.

        Returns a one-item list counting the errors answered so far.
        """
        answered = [0]

        def react(request: Any) -> Any:
            if answered[0] >= times:
                return NotImplemented  # exhausted: the request goes on to the emulator
            answered[0] += 1
            raise kmocklib.KubernetesError(status=status, reason=REASONS.get(status, "Error"),
                                           message=message)

        self.kmock[method, RESOURCES[resource]] << react
        return answered

    def slow(self, method: str, resource: str, seconds: float, *, times: int | None = None,
             status: int | None = None) -> list[int]:
        """Makes the next `times` requests (all: None) of `method` on `resource` wait `seconds`,
        then the emulator answers them, or `status` does (an API server under load). Returns
        a one-item list counting the requests waiting now."""
        waiting, taken = [0], [0]

        async def react(request: Any) -> Any:
            if times is not None and taken[0] >= times:
                return NotImplemented
            taken[0] += 1
            waiting[0] += 1
            try:
                await asyncio.sleep(seconds)
            finally:
                waiting[0] -= 1
            if status is None:
                return NotImplemented  # the emulator answers it
            raise kmocklib.KubernetesError(status=status, reason=REASONS.get(status, "Error"),
                                           message="injected by the test")

        self.kmock[method, RESOURCES[resource]] << react
        return waiting

    def set_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Plays the Job controller (gap 4): writes the status a real one would."""
        self.kmock.objects[RESOURCES["jobs"], namespace, name].patch({"status": status})

    def hold_foreground_deletions(self, resource: str) -> None:
        """Foreground deletes of `resource` leave the object deleting until `collect_garbage`
        (gap 10): the test plays the kubelet and the garbage collector."""
        self.kmock.held_deletions.add(resource)

    def deleting(self, resource: str, namespace: str, name: str) -> bool:
        """Whether the object is marked for deletion (a deletionTimestamp), still stored."""
        stored = self.stored(resource, namespace, name)
        return bool(stored and stored["metadata"].get("deletionTimestamp"))

    def collect_garbage(self, resource: str, namespace: str, name: str) -> None:
        """The garbage collector's end of a foreground deletion (gap 10): the dependents are
        gone, so the finalizer goes and the object with it."""
        obj = self.kmock.objects[RESOURCES[resource], namespace, name]
        finalizers = [f for f in obj["metadata"].get("finalizers") or [] if f != FOREGROUND_FINALIZER]
        obj.patch({"metadata": {"finalizers": finalizers or None}})
        if not finalizers:
            obj.delete()

    def add_pod(self, spec: JobSpec, role: str, name: str, *, phase: str = "Running",
                annotations: dict[str, str] | None = None, ready: bool = False) -> None:
        """Plays the controllers that make pods (gap 4)."""
        self.kmock.objects[RESOURCES["pods"], spec.namespace, name] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": spec.namespace,
                         "labels": manifests.labels(spec, role),
                         "annotations": annotations or {},
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": role, "image": spec.image}]},
            "status": {"phase": phase,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        }

    @staticmethod
    async def wait_for(condition: Callable[[], Any], *, timeout: float = 20.0,
                       what: str = "condition") -> None:
        """Polls `condition` (sync or async) until it holds; fails naming `what` after `timeout` s."""
        await waiting.wait_for(condition, timeout=timeout, interval=0.01, message=what)


@pytest.fixture
async def k8s(kmock: Any) -> Cluster:
    """kmock with its gaps filled, and the helpers the tests share."""
    cluster = Cluster(kmock)
    _fill_kmock_gaps(kmock, cluster.namespace_labels)
    return cluster


@pytest.fixture
def api_client(k8s: Cluster) -> Any:
    from kubernetes import client

    config = client.Configuration()
    config.host = k8s.url
    api = client.ApiClient(config)
    yield api
    api.close()


@pytest.fixture
def kubeconfig(k8s: Cluster, tmp_path: Any) -> str:
    """A kubeconfig file pointing at the emulator, for the CLI's --kubeconfig."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: kmock\n  cluster:\n    server: {k8s.url}\n"
        "users:\n- name: tester\n  user:\n    token: test-token\n"
        "contexts:\n- name: kmock\n  context:\n    cluster: kmock\n    user: tester\n"
        "current-context: kmock\n"
    )
    return str(path)


# ---- custom resources: the PaddleJob and Kopf's peering ------------------------------------------
# 6. discovery: kmock serves only the resources it is told of (a real API server learns
#    them from the CRDs); Kopf discovers the PaddleJob and its peering object, so the
#    tests that run the operator declare them here (and the Namespaces, which kmock
#    0.8 cannot list: the operator runs with Kopf's scanning off).
PADDLEJOBS = kmocklib.resource("batch.paddlepaddle.org", "v1", "paddlejobs")
TRAININGJOBS = kmocklib.resource("paddlepaddle.org", "v1", "trainingjobs")
KOPFPEERINGS = kmocklib.resource("kopf.dev", "v1", "kopfpeerings")
NAMESPACES = kmocklib.resource("", "v1", "namespaces")
WORKLOADS = kmocklib.resource("kueue.x-k8s.io", "v1beta2", "workloads")  # Kueue's
RESOURCES.update({"paddlejobs": PADDLEJOBS, "trainingjobs": TRAININGJOBS, "kopfpeerings": KOPFPEERINGS,
                  "workloads": WORKLOADS,
                  "events": kmocklib.resource("", "v1", "events")})


@pytest.fixture
async def k8s_crds(k8s: Cluster) -> Cluster:
    """`k8s` with the PaddleJob and TrainingJob CRDs (and Kopf's KopfPeering, Kueue's Workload) installed."""
    verbs = {"get", "list", "watch", "create", "update", "patch", "delete"}
    k8s.kmock.resources[PADDLEJOBS] = kmocklib.ResourceInfo(
        kind="PaddleJob", singular="paddlejob", namespaced=True, verbs=verbs,
        shortnames={"pdj"}, subresources={"status"})
    k8s.kmock.resources[TRAININGJOBS] = kmocklib.ResourceInfo(
        kind="TrainingJob", singular="trainingjob", namespaced=True, verbs=verbs,
        shortnames={"tj"}, subresources={"status"})
    k8s.kmock.resources[KOPFPEERINGS] = kmocklib.ResourceInfo(
        kind="KopfPeering", singular="kopfpeering", namespaced=True, verbs=verbs)
    # the operator lists a job's master pods (to stop the master before its trainers)
    k8s.kmock.resources[RESOURCES["pods"]] = kmocklib.ResourceInfo(
        kind="Pod", singular="pod", namespaced=True, verbs=verbs)
    k8s.kmock.resources[WORKLOADS] = kmocklib.ResourceInfo(
        kind="Workload", singular="workload", namespaced=True, verbs=verbs,
        subresources={"status"})
    # 7. resourceVersion: Kopf's JSON patches test it; kmock sets none (nor bumps one). kmock
    #    announced the object to its watchers before any reaction runs: the versioned object is
    #    announced again (MODIFIED), as a watcher would see it, or Kopf keeps testing against
    #    the version-less body of an object created while it watches (a TrainingJob's PaddleJob)
    async def versioned(request: Any) -> Any:
        meta = (request.data or {}).get("metadata") or {}
        key = (request.resource, request.namespace or meta.get("namespace"), meta.get("name"))
        if key in k8s.kmock.objects and not (k8s.kmock.objects[key].get("metadata") or {}).get(
                "resourceVersion"):
            k8s.kmock.objects[key].patch({"metadata": {"resourceVersion": "1"}})
            await k8s.kmock._buses[request.resource].put(
                {"type": "MODIFIED", "object": k8s.kmock.objects[key].raw})
        return NotImplemented  # on to the create answer of gaps 1 and 2

    for resource in (PADDLEJOBS, TRAININGJOBS):  # each: one catch-all answered the first create only
        k8s.kmock[kmocklib.action.CREATE, resource] << versioned
    # Kopf lists the namespaces it serves before it watches anything in them
    k8s.kmock.resources[NAMESPACES] = kmocklib.ResourceInfo(
        kind="Namespace", singular="namespace", namespaced=False, verbs={"get", "list", "watch"})
    for name in ("default", "ml"):
        k8s.kmock.objects[NAMESPACES, None, name] = {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    return k8s


@pytest.fixture
def config(kubeconfig: str) -> Any:
    """The operator's configuration for the tests that run it: a fast status timer."""
    from pdj_operator.handlers import OperatorConfig

    return OperatorConfig(kubeconfig=kubeconfig, interval=0.2, clear_etcd=False)


@pytest.fixture
def api(api_client: Any) -> Any:
    """kubectl's part in the operator tests: PaddleJobs created and read as custom objects."""
    from kubernetes import client

    return client.CustomObjectsApi(api_client)


# ---- the autoscaler: nodes, and Leases that behave like an API server's ---------------------------
# 8. Leases: kmock sets no resourceVersion and does not check one; the elector's merge
#    patches name the version they read (a real API server answers 409 Conflict when it
#    moved on). Creates and patches of Leases get a fresh version here, and a patch naming
#    a stale one is taken back and answers 409.
LEASES = kmocklib.resource("coordination.k8s.io", "v1", "leases")
RESOURCES.update({"nodes": kmocklib.resource("", "v1", "nodes"), "leases": LEASES})


@pytest.fixture
async def k8s_leases(k8s: Cluster) -> Cluster:
    """`k8s` whose Leases carry a resourceVersion that a stale patch conflicts with (gap 8)."""
    versions = iter(range(1, 1_000_000))

    def versioned(request: Any) -> Any:
        meta = (request.data or {}).get("metadata") or {}
        key = (LEASES, request.namespace, request.name or meta.get("name"))
        stored = k8s.kmock.objects[key] if key in k8s.kmock.objects else None
        if request.action == kmocklib.action.CREATE:  # kmock answered 409 to a duplicate already
            stored.patch({"metadata": {"resourceVersion": str(next(versions))}})
            return NotImplemented  # on to the create answer of gaps 1 and 2
        # kmock applied the patch before any reaction runs: the version before it is the one
        # the patch is checked against, and a stale patch is taken back
        before = stored.history[-2] if len(stored.history) > 1 else None
        held = ((before.raw if before else {}).get("metadata") or {}).get("resourceVersion")
        if meta.get("resourceVersion") not in (None, held):
            stored.history.pop()
            raise kmocklib.KubernetesError(status=409, reason="Conflict",
                                           message="the object has been modified")
        stored.patch({"metadata": {"resourceVersion": str(next(versions))}})
        return stored.raw

    k8s.kmock[kmocklib.action.CREATE, LEASES] << versioned
    k8s.kmock[kmocklib.action.UPDATE, LEASES] << versioned
    return k8s


def role_grants(rules: list[dict[str, Any]], group: str, resource: str, verb: str,
                name: str | None) -> bool:
    """Whether a Role's `rules` allow a request, as the API server's RBAC authorizer decides:
    a rule with `resourceNames` matches only a request that names one of them (a create or
    a list names none); an empty `resourceNames` would match every name."""
    return any(group in rule["apiGroups"] and resource in rule["resources"]
               and verb in rule["verbs"]
               and ("resourceNames" not in rule or name in rule["resourceNames"])
               for rule in rules)
