"""The scaler token on Kubernetes: the master mounts the optional Secret `paddlecloud-scaler`
of its namespace, the autoscaler mounts its own, and the job's NetworkPolicies let the
autoscaler's pods (and only those, besides the job's own and the master clients) reach the
master's gRPC port.

The NetworkPolicies are read by a small evaluator of their rules as the API documents them
(a peer without a namespaceSelector is of the policy's namespace; selectors are ANDed; a
pod is reachable when any policy that selects it admits the peer on that port).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from paddlecloud.backends.k8s import manifests
from paddlecloud.jobspec import JobSpec

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def _path(name: str) -> Path:
    """A file of deploy/ by its name (the optional parts are under deploy/components/)."""
    return next((REPO / "deploy").rglob(name))


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(_path(name).read_text()) if d]


def _deployment(name: str) -> dict[str, Any]:
    return next(d for d in _docs(name) if d["kind"] == "Deployment")


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # all paddlecloud renders
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def reachable(policies: list[dict[str, Any]], *, target: dict[str, str], port: int,
              source_namespace: str, source: dict[str, str],
              namespace_labels: dict[str, str] | None = None) -> bool:
    """Whether a pod labelled `source` in `source_namespace` (its other labels:
    `namespace_labels`) may connect to `port` of a pod labelled `target` (in the policies'
    namespace) under these NetworkPolicies."""
    selecting = [p for p in policies if "Ingress" in p["spec"]["policyTypes"]
                 and _matches(p["spec"]["podSelector"], target)]
    assert selecting, f"no policy selects {target}: everything could reach it"
    namespace_labels = {**(namespace_labels or {}), manifests.NAMESPACE_NAME_LABEL: source_namespace}
    for policy in selecting:
        for rule in policy["spec"]["ingress"]:
            if "ports" in rule and not any(p["port"] == port for p in rule["ports"]):
                continue
            for peer in rule["from"]:
                if "namespaceSelector" in peer:
                    in_namespace = _matches(peer["namespaceSelector"], namespace_labels)
                else:
                    in_namespace = source_namespace == policy["metadata"]["namespace"]
                if in_namespace and _matches(peer.get("podSelector", {}), source):
                    return True
    return False


def _pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def test_the_master_mounts_the_namespaces_scaler_secret_as_optional_and_reads_it():
    spec = JobSpec(name="ctr", namespace="team-a", module="m", trainers=2, min_trainers=1, max_trainers=4)
    master = manifests.master_deployment(spec)
    for version in ("1.28", kubernetes_validate.latest_version()):
        kubernetes_validate.validate(master, version, strict=True)
    pod = master["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "scaler-token")
    assert volume["secret"] == {"secretName": "paddlecloud-scaler", "optional": True, "defaultMode": 0o400,
                                "items": [{"key": "token", "path": "token"}]}
    container = pod["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "scaler-token")
    assert mount == {"name": "scaler-token", "mountPath": "/var/run/paddlecloud/scaler", "readOnly": True}
    command = container["command"]
    assert command[command.index("--scaler-token-file") + 1] == "/var/run/paddlecloud/scaler/token"
    assert "--tokens-dir" in command  # the master accepts the scaler only beside the job's tokens
    assert pod["securityContext"]["fsGroup"] == manifests.RUN_AS_USER  # the 0400 file readable by it
    # trainers and pservers never see it
    for workload in (manifests.trainer_job(spec, None), manifests.pserver_statefulset(
            JobSpec(name="ctr", namespace="team-a", module="m", pservers=1), None)):
        names = {v.get("secret", {}).get("secretName") for v in workload["spec"]["template"]["spec"]["volumes"]}
        assert "paddlecloud-scaler" not in names


def test_the_autoscaler_mounts_its_key_and_each_namespace_gets_its_own_token():
    deployment = _deployment("autoscaler.yaml")
    assert deployment["metadata"]["namespace"] == manifests.AUTOSCALER_NAMESPACE
    assert _pod_labels(deployment).items() >= manifests.AUTOSCALER_LABELS.items()
    pod = deployment["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "scaler-key")
    # not optional: an autoscaler without the key could scale nothing
    assert volume["secret"]["secretName"] == manifests.SCALER_KEY_SECRET and "optional" not in volume["secret"]
    assert volume["secret"]["items"] == [{"key": "key", "path": "key"}]
    assert not any((v.get("secret") or {}).get("secretName") == manifests.SCALER_SECRET for v in pod["volumes"])
    container = pod["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "scaler-key")
    assert f"--scaler-key-file={mount['mountPath']}/key" in container["args"]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]
    assert not any("TOKEN" in e["name"] or "KEY" in e["name"] for e in container["env"])  # files only
    header = _path("autoscaler.yaml").read_text().split("\n---", 1)[0]
    assert "--print-token $ns" in header
    assert "kubectl -n $ns create secret generic paddlecloud-scaler --from-file=token=" in header


@pytest.fixture
def policies() -> list[dict[str, Any]]:
    spec = JobSpec(name="ctr", namespace="default", module="m", trainers=2, pservers=1)
    found = manifests.network_policies(spec, manifests.owner_reference("ctr", "uid-1"))
    for policy in found:
        for version in ("1.28", kubernetes_validate.latest_version()):
            kubernetes_validate.validate(policy, version, strict=True)
    return found


def test_the_autoscaler_reaches_the_masters_grpc_port_and_nothing_else(policies):
    spec = JobSpec(name="ctr", namespace="default", module="m")
    master = manifests.labels(spec, manifests.MASTER)
    autoscaler = _pod_labels(_deployment("autoscaler.yaml"))
    home = manifests.AUTOSCALER_NAMESPACE

    def can(target: dict[str, str], port: int, namespace: str, source: dict[str, str]) -> bool:
        return reachable(policies, target=target, port=port, source_namespace=namespace, source=source)

    assert can(master, manifests.MASTER_PORT, home, autoscaler)
    assert not can(master, manifests.METRICS_PORT, home, autoscaler)
    for role in (manifests.TRAINER, manifests.PSERVER):
        assert not can(manifests.labels(spec, role), manifests.MASTER_PORT, home, autoscaler)
    # its labels elsewhere, or its namespace without its labels, are not the autoscaler
    assert not can(master, manifests.MASTER_PORT, "team-b", autoscaler)
    assert not can(master, manifests.MASTER_PORT, home, {manifests.APP_LABEL: manifests.APP_NAME})


def test_the_job_server_and_the_jobs_pods_still_reach_the_master_and_the_operator_does_not(policies):
    spec = JobSpec(name="ctr", namespace="default", module="m")
    master = manifests.labels(spec, manifests.MASTER)
    server = _deployment("job-server.yaml")
    assert reachable(policies, target=master, port=manifests.MASTER_PORT,
                     source_namespace=server["metadata"]["namespace"], source=_pod_labels(server))
    # the operator reads the epoch from the master's Deployment: it needs no route to masters
    operator = _deployment("operator.yaml")
    assert not reachable(policies, target=master, port=manifests.MASTER_PORT,
                         source_namespace=operator["metadata"]["namespace"],
                         source=_pod_labels(operator))
    for role in (manifests.TRAINER, manifests.PSERVER):
        assert reachable(policies, target=master, port=manifests.MASTER_PORT, source_namespace="default",
                         source=manifests.labels(spec, role)), role
    assert not reachable(policies, target=master, port=manifests.MASTER_PORT, source_namespace="default",
                         source={"app": "someone-else"})


def test_a_job_server_of_a_marked_namespace_reaches_the_masters_of_other_namespaces():
    spec = JobSpec(name="ctr", namespace="team-a", module="m", trainers=2, pservers=1)
    policies = manifests.network_policies(spec, manifests.owner_reference("ctr", "uid-1"))
    for policy in policies:
        kubernetes_validate.validate(policy, kubernetes_validate.latest_version(), strict=True)
    master = manifests.labels(spec, manifests.MASTER)
    server = _deployment("job-server.yaml")
    home, labels = server["metadata"]["namespace"], _pod_labels(server)
    marked = {manifests.MASTER_CLIENTS_NAMESPACE_LABEL: "true"}

    def can(target: dict[str, str], port: int, source: dict[str, str], namespace_labels=None) -> bool:
        return reachable(policies, target=target, port=port, source_namespace=home, source=source,
                         namespace_labels=namespace_labels)

    for port in (manifests.MASTER_PORT, manifests.METRICS_PORT):  # status, and the proxied page
        assert can(master, port, labels, marked), port
        assert not can(master, port, labels), port  # a namespace no admin marked
        assert not can(master, port, {"app": "someone-else"}, marked), port  # not a master client
    for role in (manifests.TRAINER, manifests.PSERVER):  # the master only
        assert not can(manifests.labels(spec, role), manifests.MASTER_PORT, labels, marked), role
    header = _path("job-server.yaml").read_text().split("\n---", 1)[0]
    assert f"kubectl label namespace {home} {manifests.MASTER_CLIENTS_NAMESPACE_LABEL}=true" in header
