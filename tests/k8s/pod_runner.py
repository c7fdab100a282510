"""Runs the pods paddlecloud renders on podman, as a Kubernetes node would run them.

No API server and no kubelet: this takes the workloads of a rendered job (StatefulSets,
Indexed Jobs), makes the pods their controllers would make (names, hostnames, the
pod-index and completion-index labels and annotation, JOB_COMPLETION_INDEX), and runs
each pod as a podman pod on one bridge network of its own, with a fixed address:

- init containers one after another, each to exit 0; a native sidecar (an init
  container with `restartPolicy: Always`) started and left running; then the
  containers;
- env as the kubelet builds it: values with `$(VAR)` expanded from the entries before
  them, `fieldRef` (metadata.name/namespace, labels, annotations, status.podIP),
  `secretKeyRef` (an `optional` one of a missing Secret left out); command and args
  expanded the same way; command replaces the image's ENTRYPOINT (and its CMD), args
  its CMD;
- volumes as host directories: Secrets and ConfigMaps written out (items, defaultMode),
  emptyDir a directory (`medium: Memory` a tmpfs), a claim a directory the test gives
  (shared by the pods that mount it, its modes the test's, as a volume's own);
- securityContext as the kubelet applies it: runAsUser/runAsGroup as `--user`, fsGroup
  as a supplementary group owning the volumes, capabilities dropped and added,
  allowPrivilegeEscalation false as no-new-privileges, and runAsNonRoot refused, as
  the kubelet refuses it, when the container would run as root;
- cluster DNS from the rendered Services: a headless Service's pods as
  `HOSTNAME.SERVICE.NS.svc` (with the pod's subdomain or the StatefulSet's serviceName)
  and a per-pod Service as `SERVICE.NS.svc`, given to every pod with `--add-host`; the
  job's master Service names the host, where the test runs the master and etcd;
- a deleted pod stopped as the kubelet stops it (`Node.stop`): SIGTERM to its containers,
  SIGKILL once the pod's terminationGracePeriodSeconds (default 30) have passed, then its
  sandbox (the pod's network).

What this does NOT cover: scheduling (schedulerName, PodGroups, nodeSelector, resources
and GPUs are ignored), probes, restarts (a failed container fails the run), Services'
ClusterIPs and ports (names resolve to pods), NetworkPolicies, and the API server's
own admission (Pod Security admission included).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import containers

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
POD_INDEX = "apps.kubernetes.io/pod-index"
STS_POD_NAME = "statefulset.kubernetes.io/pod-name"
RUN_TIMEOUT = 300
DEFAULT_GRACE = 30  # a pod's terminationGracePeriodSeconds when its spec gives none


class PodFailed(AssertionError):
    """A container of a pod did not do what a node needs of it; the message holds its log."""


@dataclass
class Pod:
    """One pod a workload controller would create, with the address the test gives it."""

    name: str
    hostname: str
    subdomain: str
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]
    spec: dict[str, Any]
    ip: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)  # the podman containers, in start order
    error: BaseException | None = None

    def container_name(self, container: str) -> str:
        return f"{self.name}-{container}"


def pods_of(docs: list[dict[str, Any]]) -> list[Pod]:
    """The pods of the StatefulSets and Indexed Jobs among `docs`, as their controllers name them."""
    out = []
    for doc in docs:
        if doc["kind"] not in ("StatefulSet", "Job"):
            continue
        name, namespace = doc["metadata"]["name"], doc["metadata"]["namespace"]
        template = doc["spec"]["template"]
        meta = template.get("metadata") or {}
        for i in range(doc["spec"]["replicas" if doc["kind"] == "StatefulSet" else "completions"]):
            labels, annotations = dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})
            if doc["kind"] == "StatefulSet":
                pod_name = hostname = f"{name}-{i}"
                labels.update({POD_INDEX: str(i), STS_POD_NAME: pod_name})
                subdomain, extra = doc["spec"]["serviceName"], {}
            else:  # an Indexed Job: NAME-INDEX-<random>, hostname NAME-INDEX
                assert doc["spec"].get("completionMode") == "Indexed", name
                hostname, pod_name = f"{name}-{i}", f"{name}-{i}-{uuid.uuid4().hex[:5]}"
                labels[COMPLETION_INDEX] = annotations[COMPLETION_INDEX] = str(i)
                subdomain, extra = template["spec"].get("subdomain") or "", {"JOB_COMPLETION_INDEX": str(i)}
            out.append(Pod(name=pod_name, hostname=hostname, subdomain=subdomain, namespace=namespace,
                           labels=labels, annotations=annotations, spec=template["spec"], extra_env=extra))
    return out


def dns_names(docs: list[dict[str, Any]], pods: list[Pod], *, host_ip: str) -> dict[str, str]:
    """name -> address, as cluster DNS answers for the rendered Services."""
    names: dict[str, str] = {}
    for doc in docs:
        if doc["kind"] != "Service":
            continue
        service, namespace = doc["metadata"]["name"], doc["metadata"]["namespace"]
        selector = doc["spec"].get("selector") or {}
        chosen = [p for p in pods if all(p.labels.get(k) == v for k, v in selector.items())]
        if doc["spec"].get("clusterIP") != "None":  # the master's: the test runs it on the host
            names[f"{service}.{namespace}.svc"] = host_ip
            continue
        if len(chosen) == 1:  # a Service of one pod
            names[f"{service}.{namespace}.svc"] = chosen[0].ip
        for pod in chosen:
            if pod.subdomain == service:
                names[f"{pod.hostname}.{service}.{namespace}.svc"] = pod.ip
    return {**names, **{f"{k}.cluster.local": v for k, v in names.items()}}


# ---- env, as the kubelet builds it ---------------------------------------------------------------
def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)`: replaced when VAR is defined, kept as written otherwise; `$$` is `$`."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def _field(pod: Pod, path: str) -> str:
    simple = {"metadata.name": pod.name, "metadata.namespace": pod.namespace, "status.podIP": pod.ip}
    if path in simple:
        return simple[path]
    found = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if not found:
        raise PodFailed(f"pod {pod.name}: fieldRef {path!r} is not one this harness knows")
    values = pod.labels if found.group(1) == "labels" else pod.annotations
    if found.group(2) not in values:
        raise PodFailed(f"pod {pod.name}: fieldRef {path!r} names nothing the pod has")
    return values[found.group(2)]


def env_of(pod: Pod, container: Mapping[str, Any], secrets: Mapping[str, Mapping[str, bytes]]) -> dict[str, str]:
    env = dict(pod.extra_env)
    for entry in container.get("env") or []:
        name = entry["name"]
        if "value" in entry:
            env[name] = expand(str(entry["value"]), env)
            continue
        source = entry.get("valueFrom") or {}
        if "fieldRef" in source:
            env[name] = _field(pod, source["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = (secrets.get(ref["name"]) or {}).get(ref["key"])
            if value is None and not ref.get("optional"):
                raise PodFailed(f"pod {pod.name}: Secret {ref['name']} key {ref['key']} is missing")
            if value is not None:
                env[name] = value.decode()
        else:
            raise PodFailed(f"pod {pod.name}: env {name} from {sorted(source)} is not one this harness knows")
    return env


# ---- a node ----------------------------------------------------------------------------------------
class Node:
    """A bridge network of the test's own, and the pods run on it; `close` removes them all."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.network = f"pc-test-{uuid.uuid4().hex[:10]}"
        containers.run_engine("network", "create", self.network, timeout=60)
        info = json.loads(containers.run_engine("network", "inspect", self.network, timeout=60).stdout)[0]
        subnet = info["subnets"][0]
        self.gateway = subnet["gateway"]
        self._addresses = (str(a) for a in ipaddress.ip_network(subnet["subnet"]).hosts()
                           if str(a) != self.gateway and int(str(a).rsplit(".", 1)[1]) >= 10)
        self.pods: list[str] = []
        # A pod that only holds the network up: the bridge (and the gateway address the master
        # and etcd listen on) exists only while something is attached to it.
        self.anchor = self._pod_create(f"{self.network}-anchor", ip=next(self._addresses), hosts={})
        containers.run_engine("pod", "start", self.anchor, timeout=120)

    def _pod_create(self, name: str, *, ip: str, hosts: Mapping[str, str], hostname: str = "") -> str:
        args = ["pod", "create", "--name", name, "--network", self.network, "--ip", ip]
        if hostname:
            args += ["--hostname", hostname]
        for host, address in sorted(hosts.items()):
            args += ["--add-host", f"{host}:{address}"]
        containers.run_engine(*args, timeout=120)
        self.pods.append(name)
        return name

    def assign(self, pods: list[Pod]) -> None:
        for pod in pods:
            pod.ip = next(self._addresses)

    def close(self) -> None:
        for pod in reversed(self.pods):
            containers.run_engine("pod", "rm", "-f", "-t", "2", pod, timeout=120, check=False)
        containers.run_engine("network", "rm", "-f", self.network, timeout=120, check=False)

    # ---- one pod ---------------------------------------------------------------------------------
    def start(self, pod: Pod, *, hosts: Mapping[str, str], secrets: Mapping[str, Mapping[str, bytes]],
              claims: Mapping[str, Path]) -> threading.Thread:
        """Runs the pod in a thread of its own (its init containers wait on other pods)."""
        def run() -> None:
            try:
                self._run(pod, hosts=hosts, secrets=secrets, claims=claims)
            except BaseException as error:  # reported by the test through `pod.error`
                pod.error = error

        thread = threading.Thread(target=run, name=pod.name, daemon=True)
        thread.start()
        return thread

    def _run(self, pod: Pod, *, hosts: Mapping[str, str], secrets: Mapping[str, Mapping[str, bytes]],
             claims: Mapping[str, Path]) -> None:
        self._pod_create(pod.name, ip=pod.ip, hosts=hosts, hostname=pod.hostname)
        volumes = self._volumes(pod, secrets=secrets, claims=claims)
        # init containers in order, each to its end (a native sidecar only started), then the rest
        steps = [(c, c.get("restartPolicy") == "Always") for c in pod.spec.get("initContainers") or []]
        steps += [(c, True) for c in pod.spec["containers"]]
        for container, detached in steps:
            result = containers.run_engine(*self._run_args(pod, container, volumes, secrets, detached=detached),
                                           timeout=RUN_TIMEOUT, check=False)
            pod.started.append(pod.container_name(container["name"]))
            if result.returncode != 0:
                raise PodFailed(f"pod {pod.name}: container {container['name']} "
                                f"{'did not start' if detached else 'exited'} ({result.returncode}):\n"
                                f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}")

    def _volumes(self, pod: Pod, *, secrets: Mapping[str, Mapping[str, bytes]],
                 claims: Mapping[str, Path]) -> dict[str, tuple[str, str]]:
        """volume name -> ("bind", host dir) or ("tmpfs", "")."""
        out: dict[str, tuple[str, str]] = {}
        group = (pod.spec.get("securityContext") or {}).get("fsGroup")
        for volume in pod.spec.get("volumes") or []:
            name = volume["name"]
            if "emptyDir" in volume and (volume["emptyDir"] or {}).get("medium") == "Memory":
                out[name] = ("tmpfs", "")
                continue
            path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.workdir))
            if "secret" in volume:
                source = volume["secret"]
                data = secrets.get(source["secretName"])
                if data is None:
                    if source.get("optional"):
                        out[name] = ("bind", str(path))
                        continue
                    raise PodFailed(f"pod {pod.name}: Secret {source['secretName']} does not exist")
                items = source.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    (path / item["path"]).write_bytes(data[item["key"]])
                    (path / item["path"]).chmod(item.get("mode", source.get("defaultMode", 0o644)))
            elif "persistentVolumeClaim" in volume:
                path = claims[volume["persistentVolumeClaim"]["claimName"]]
            elif "emptyDir" not in volume:
                raise PodFailed(f"pod {pod.name}: volume {name} of kind {sorted(volume)} is not one "
                                "this harness mounts")
            if "persistentVolumeClaim" not in volume:  # a volume's own modes are kept
                path.chmod(0o777 if "emptyDir" in volume else 0o755)
            if group is not None:  # the kubelet gives the volumes to the fsGroup
                subprocess.run(["chgrp", "-R", str(group), str(path)], check=True)
            out[name] = ("bind", str(path))
        return out

    def _run_args(self, pod: Pod, container: Mapping[str, Any], volumes: Mapping[str, tuple[str, str]],
                  secrets: Mapping[str, Mapping[str, bytes]], *, detached: bool) -> list[str]:
        env = env_of(pod, container, secrets)
        args = ["run", "--pod", pod.name, "--name", pod.container_name(container["name"]),
                "--pull", "never"]
        args += ["--detach"] if detached else []
        args += self._security_args(pod, container)
        if container.get("workingDir"):
            args += ["--workdir", container["workingDir"]]
        for mount in container.get("volumeMounts") or []:
            kind, host = volumes[mount["name"]]
            if kind == "tmpfs":
                args += ["--mount", f"type=tmpfs,destination={mount['mountPath']}"]
            else:
                args += ["--volume", f"{host}:{mount['mountPath']}:{'ro' if mount.get('readOnly') else 'rw'}"]
        for key, value in env.items():
            args += ["--env", f"{key}={value}"]
        if container.get("command"):
            args += ["--entrypoint", json.dumps([expand(str(a), env) for a in container["command"]])]
        return [*args, container["image"], *(expand(str(a), env) for a in container.get("args") or [])]

    def _security_args(self, pod: Pod, container: Mapping[str, Any]) -> list[str]:
        pod_context = pod.spec.get("securityContext") or {}
        context = {**pod_context, **(container.get("securityContext") or {})}
        args = []
        uid, gid = context.get("runAsUser"), context.get("runAsGroup")
        if uid is not None:
            args += ["--user", f"{uid}:{gid}" if gid is not None else str(uid)]
        if context.get("runAsNonRoot") and (uid == 0 or (uid is None and image_runs_as_root(container["image"]))):
            # what the kubelet says (CreateContainerConfigError), before anything runs
            raise PodFailed(f"pod {pod.name}: container {container['name']} has runAsNonRoot and "
                            "image will run as root")
        if pod_context.get("fsGroup") is not None:
            args += ["--group-add", str(pod_context["fsGroup"])]
        capabilities = context.get("capabilities") or {}
        args += [a for cap in capabilities.get("drop") or [] for a in ("--cap-drop", cap)]
        args += [a for cap in capabilities.get("add") or [] for a in ("--cap-add", cap)]
        if context.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        if context.get("privileged"):
            args += ["--privileged"]
        return args

    def stop(self, pod: Pod, *, grace: int | None = None) -> None:
        """The kubelet's part of a pod's deletion: SIGTERM to its containers, SIGKILL after the
        pod's termination grace (or `grace`: 0 kills at once, as a forced delete), and only
        then the pod's sandbox (its network); returns once they are stopped."""
        if grace is None:
            grace = int(pod.spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE))
        if pod.started:
            containers.run_engine("stop", "--time", str(grace), *pod.started, timeout=grace + 120)
        containers.run_engine("pod", "stop", "--time", "0", pod.name, timeout=120)

    # ---- what ran --------------------------------------------------------------------------------
    def failed(self, pods: list[Pod]) -> str:
        """The log of the first container of `pods` that exited non-zero and would not be restarted
        to succeed here (a program's, or a sidecar's), "" when none did."""
        for pod in pods:
            for name in list(pod.started):
                state = containers.run_engine("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                                              name, timeout=60, check=False).stdout.split()
                if len(state) == 2 and state[0] == "exited" and state[1] != "0":
                    log = containers.run_engine("logs", name, timeout=60, check=False)
                    return f"{name} exited {state[1]}:\n{log.stdout[-2000:]}{log.stderr[-3000:]}"
        return ""

    def wait_exit(self, pod: Pod, container: str, *, timeout: float) -> int:
        name = pod.container_name(container)
        result = containers.run_engine("wait", name, timeout=timeout, check=False)
        if result.returncode != 0:
            raise PodFailed(f"podman wait {name}: {result.stderr[-2000:]}")
        return int(result.stdout.strip().splitlines()[-1])

    def logs(self, pod: Pod, container: str) -> str:
        result = containers.run_engine("logs", pod.container_name(container), timeout=60, check=False)
        return result.stdout + result.stderr

    def copy_out(self, pod: Pod, container: str, path: str) -> Path:
        """`path` of the container's filesystem (a stopped container's too), copied to the host."""
        target = Path(tempfile.mkdtemp(prefix="copied-", dir=self.workdir))
        containers.run_engine("cp", f"{pod.container_name(container)}:{path}", str(target), timeout=60)
        return target / Path(path).name


_ROOT_IMAGES: dict[str, bool] = {}


def image_runs_as_root(image: str) -> bool:
    if image not in _ROOT_IMAGES:
        user = containers.run_engine("image", "inspect", "--format", "{{.Config.User}}", image,
                                     timeout=60).stdout.strip()
        _ROOT_IMAGES[image] = user.split(":")[0] in ("", "0", "root")
    return _ROOT_IMAGES[image]


@contextlib.contextmanager
def node(workdir: Path) -> Iterator[Node]:
    made = Node(workdir)
    try:
        yield made
    finally:
        made.close()
