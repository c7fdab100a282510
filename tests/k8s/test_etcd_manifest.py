"""What deploy/etcd.yaml's PodDisruptionBudget and NetworkPolicy mean, not only that they parse.

The PDB selects the etcd members and keeps a quorum through any voluntary disruption.
The NetworkPolicy, evaluated here as Kubernetes does for ingress (the pod selector picks the
pods it isolates; a connection is let in when one rule's `from` and `ports` both match),
lets in on etcd's client port exactly whom docs/kubernetes.md names — masters and pserver
agents (`paddlecloud.org/role: master|pserver`), the operator, the members — and on the
peer port only the members. The pods asked about are the ones paddlecloud really renders
(`job submit --dry-run` of every flag set and example, every file in deploy/).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import yaml
from rendered_objects import DEPLOY, pod_spec, rendered

from paddlecloud.backends.k8s import manifests
from paddlecloud.jobspec import JobSpec

pytestmark = pytest.mark.unit

ETCD = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all((DEPLOY / "etcd.yaml").read_text()) if d}
MEMBERS = ETCD[("StatefulSet", "paddlecloud-etcd")]
PDB = ETCD[("PodDisruptionBudget", "paddlecloud-etcd")]
POLICY = ETCD[("NetworkPolicy", "paddlecloud-etcd")]
CLIENT_PORT, PEER_PORT, METRICS_PORT = 2379, 2380, 2381
ETCD_CLIENT_SECRET = manifests.ETCD_TLS_SECRET  # the client certificate masters and pservers mount


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions) against a pod's labels;
    an empty selector selects everything."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": key not in labels or labels[key] not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def member_port_number(port: int | str) -> int:
    """A NetworkPolicy port (a number, or the name of a member's container port)."""
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for c in MEMBERS["spec"]["template"]["spec"]["containers"]
             for p in c.get("ports", [])}
    return named[port]


def _port_matches(entry: dict[str, Any], port: int) -> bool:
    if entry.get("protocol", "TCP") != "TCP":
        return False
    if "port" not in entry:
        return True  # every port
    first = member_port_number(entry["port"])
    return first <= port <= entry.get("endPort", first)


def lets_in(labels: dict[str, str], port: int) -> bool:
    """Whether POLICY admits a TCP connection to `port` of a member from a pod of the same
    namespace with `labels`. An `ipBlock` or `namespaceSelector` peer admits it (conservative:
    this cannot tell a pod's address or namespace labels)."""
    assert "Ingress" in POLICY["spec"]["policyTypes"]
    for rule in POLICY["spec"].get("ingress") or []:
        ports = rule.get("ports")
        if ports is not None and not any(_port_matches(p, port) for p in ports):
            continue
        peers = rule.get("from")
        if peers is None or not peers:
            return True
        for peer in peers:
            if "ipBlock" in peer or "namespaceSelector" in peer:
                return True
            if selects(peer.get("podSelector"), labels):
                return True
    return False


def _pods() -> list[tuple[str, dict[str, str], dict[str, Any]]]:
    """(where from, the pod's labels, its spec) for every pod template paddlecloud renders."""
    pods = []
    for source, docs in rendered().items():
        for doc in docs:
            spec = pod_spec(doc)
            if spec is None:
                continue
            template = doc if doc["kind"] == "Pod" else doc["spec"]["template"]
            labels = (template.get("metadata") or {}).get("labels") or {}
            pods.append((f"{source}: {doc['kind']}/{doc['metadata']['name']}", labels, spec))
    return pods


PODS = _pods()
MEMBER_LABELS = MEMBERS["spec"]["template"]["metadata"]["labels"]


def role(labels: dict[str, str]) -> str | None:
    return labels.get(manifests.ROLE_LABEL)


def is_operator(labels: dict[str, str]) -> bool:
    return labels.get("app.kubernetes.io/component") == "operator" and labels.get(
        manifests.APP_LABEL) == manifests.APP_NAME


def mounts_etcd_client_certificate(spec: dict[str, Any]) -> bool:
    return any((v.get("secret") or {}).get("secretName") == ETCD_CLIENT_SECRET for v in spec.get("volumes") or [])


def is_job_server(labels: dict[str, str]) -> bool:
    return labels.get(manifests.APP_LABEL) == "paddlecloud-job-server"


def test_the_rendered_pods_cover_every_kind_the_docs_name():
    """Guards the tests below against an empty or one-sided sample."""
    roles = {role(labels) for _, labels, _ in PODS}
    assert {manifests.MASTER, manifests.PSERVER, manifests.TRAINER, manifests.HETER} <= roles
    assert any(is_operator(labels) for _, labels, _ in PODS)
    assert any(is_job_server(labels) for _, labels, _ in PODS)
    assert any(labels == MEMBER_LABELS for _, labels, _ in PODS)
    assert any(mounts_etcd_client_certificate(spec) for _, _, spec in PODS)


def test_the_disruption_budget_selects_the_members_and_keeps_a_quorum():
    assert PDB["metadata"]["namespace"] == MEMBERS["metadata"]["namespace"]
    assert PDB["spec"]["selector"] == MEMBERS["spec"]["selector"]
    assert selects(PDB["spec"]["selector"], MEMBER_LABELS)
    others = [where for where, labels, _ in PODS if labels != MEMBER_LABELS and selects(PDB["spec"]["selector"], labels)]
    assert others == []  # no other pod counts towards (or is held by) etcd's budget
    replicas = MEMBERS["spec"]["replicas"]
    quorum = replicas // 2 + 1

    def count(value: int | str) -> int:  # a PDB rounds percentages up
        return math.ceil(replicas * int(value[:-1]) / 100) if isinstance(value, str) else value

    spec = PDB["spec"]
    assert ("minAvailable" in spec) != ("maxUnavailable" in spec)
    if "minAvailable" in spec:
        assert count(spec["minAvailable"]) >= quorum
    else:
        assert 1 <= count(spec["maxUnavailable"]) <= replicas - quorum  # 1: a drain can still proceed


def test_the_network_policy_isolates_the_members():
    assert POLICY["metadata"]["namespace"] == MEMBERS["metadata"]["namespace"]
    assert selects(POLICY["spec"]["podSelector"], MEMBER_LABELS)
    isolated = [where for where, labels, _ in PODS
                if labels != MEMBER_LABELS and selects(POLICY["spec"]["podSelector"], labels)]
    assert isolated == []


@pytest.mark.parametrize("where,labels,spec", PODS, ids=[p[0] for p in PODS])
def test_who_reaches_the_client_port_is_whom_the_docs_name(where, labels, spec):
    """docs/kubernetes.md: 'only pods labelled paddlecloud.org/role: master|pserver (masters and
    pserver agents), the operator, the Job Server and the members reach the client port.'"""
    named = (role(labels) in (manifests.MASTER, manifests.PSERVER) or is_operator(labels)
             or is_job_server(labels) or labels == MEMBER_LABELS)
    assert lets_in(labels, CLIENT_PORT) == named, where
    if mounts_etcd_client_certificate(spec):  # whoever is given etcd's client certificate can use it
        assert lets_in(labels, CLIENT_PORT), where


@pytest.mark.parametrize("where,labels,spec", PODS, ids=[p[0] for p in PODS])
def test_only_members_reach_the_peer_port(where, labels, spec):
    assert lets_in(labels, PEER_PORT) == (labels == MEMBER_LABELS), where


def test_a_pod_the_docs_do_not_name_is_refused_everywhere_but_the_health_port():
    trainer = manifests.labels(JobSpec(name="j", module="m"), manifests.TRAINER)
    for labels in (trainer, {}, {manifests.ROLE_LABEL: "master-ish"},
                   {manifests.APP_LABEL: manifests.APP_NAME, "app.kubernetes.io/component": "job-server"}):
        assert not lets_in(labels, CLIENT_PORT) and not lets_in(labels, PEER_PORT), labels
        assert not lets_in(labels, 2382), labels
        assert lets_in(labels, METRICS_PORT), labels  # the kubelet's probes: /health and /metrics, no keys
