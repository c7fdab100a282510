"""Egress of a job's pods (manifests.network_policies): each role reaches what it needs and
nothing else, read by a small evaluator of the policies' egress rules as the API documents
them (policies that select a pod add up; a rule without `ports` is every port, without `to`
every destination; a peer without a namespaceSelector is of the policy's namespace; an
address outside the cluster matches only a rule without `to` or an ipBlock peer).
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from paddlecloud.backends.k8s import manifests
from paddlecloud.jobspec import JobSpec

pytestmark = pytest.mark.unit

NS = "ml"
OUTSIDE = None  # an address that is no pod's (the API server, a store, the internet)


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # all paddlecloud renders
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _peer_admits(peer: dict[str, Any], policy_ns: str, to: tuple[str, dict[str, str]] | None) -> bool:
    if to is OUTSIDE:
        return "ipBlock" in peer
    namespace, labels = to
    if "namespaceSelector" in peer:
        in_namespace = _matches(peer["namespaceSelector"], {manifests.NAMESPACE_NAME_LABEL: namespace})
    else:
        in_namespace = namespace == policy_ns
    return in_namespace and "ipBlock" not in peer and _matches(peer.get("podSelector", {}), labels)


def may_connect(policies: list[dict[str, Any]], source: dict[str, str], *, port: int,
                to: tuple[str, dict[str, str]] | None, protocol: str = "TCP") -> bool:
    """Whether a pod of the job's namespace labelled `source` may open `protocol`/`port` to
    `to` ((namespace, pod labels), or OUTSIDE) under these policies' egress rules."""
    selecting = [p for p in policies if "Egress" in p["spec"]["policyTypes"]
                 and _matches(p["spec"]["podSelector"], source)]
    assert selecting, f"no egress policy selects {source}: it could reach anything"
    for policy in selecting:
        for rule in policy["spec"].get("egress") or []:
            if "ports" in rule and not any(p["port"] == port and p.get("protocol", "TCP") == protocol
                                           for p in rule["ports"]):
                continue
            if "to" not in rule or any(_peer_admits(peer, policy["metadata"]["namespace"], to)
                                       for peer in rule["to"]):
                return True
    return False


def _spec(**given: Any) -> JobSpec:
    options = {"name": "ctr", "namespace": NS, "module": "m", "trainers": 2, "pservers": 2,
               "etcd_endpoints": "https://paddlecloud-etcd:2379", **given}
    return JobSpec(**options).validate()


def _pod(spec: JobSpec, role: str) -> tuple[str, dict[str, str]]:
    return NS, manifests.labels(spec, role)


ETCD_POD = (NS, {"app.kubernetes.io/name": "paddlecloud-etcd"})
KUBE_DNS = ("kube-system", {"k8s-app": "kube-dns"})


def test_every_policy_is_strictly_valid():
    spec = _spec(inputs=("s3://bucket/data/*.csv",), output="hdfs://nn:9000/out")
    for policy in manifests.network_policies(spec, manifests.owner_reference("ctr", "uid-1")):
        for version in ("1.28", kubernetes_validate.latest_version()):
            kubernetes_validate.validate(policy, version, strict=True)


@pytest.mark.parametrize("role", [manifests.TRAINER, manifests.PSERVER, manifests.MASTER])
def test_every_role_reaches_the_jobs_pods_and_dns(role):
    spec = _spec()
    policies = manifests.network_policies(spec, None)
    me = manifests.labels(spec, role)
    assert may_connect(policies, me, port=manifests.MASTER_PORT, to=_pod(spec, manifests.MASTER))
    for peer in (manifests.PSERVER, manifests.TRAINER):
        assert may_connect(policies, me, port=manifests.PADDLE_PORT, to=_pod(spec, peer))
        assert may_connect(policies, me, port=41234, to=_pod(spec, peer))  # NCCL, gloo: any port
    for protocol in ("UDP", "TCP"):
        assert may_connect(policies, me, port=53, to=KUBE_DNS, protocol=protocol)


def test_trainers_reach_no_etcd_no_api_server_no_other_job_and_nothing_outside():
    spec = _spec()
    policies = manifests.network_policies(spec, None)
    trainer = manifests.labels(spec, manifests.TRAINER)
    other_job = manifests.labels(_spec(name="other"), manifests.MASTER)
    assert not may_connect(policies, trainer, port=2379, to=ETCD_POD)
    for port in (443, 6443, 80, 2379):
        assert not may_connect(policies, trainer, port=port, to=OUTSIDE)
    assert not may_connect(policies, trainer, port=manifests.MASTER_PORT, to=(NS, other_job))
    assert not may_connect(policies, trainer, port=manifests.MASTER_PORT, to=("team-b", trainer))


def test_the_master_reaches_etcd_and_the_api_server_and_pservers_etcd_only():
    spec = _spec(etcd_endpoints="https://etcd-a:2379,https://etcd-b:12379")
    policies = manifests.network_policies(spec, None)
    master, pserver = manifests.labels(spec, manifests.MASTER), manifests.labels(spec, manifests.PSERVER)
    for port in (2379, 12379):
        assert may_connect(policies, master, port=port, to=ETCD_POD)
        assert may_connect(policies, pserver, port=port, to=OUTSIDE)  # etcd may run outside
    for port in manifests.API_SERVER_PORTS:
        assert may_connect(policies, master, port=port, to=OUTSIDE)
        assert not may_connect(policies, pserver, port=port, to=OUTSIDE)
    assert not may_connect(policies, master, port=22, to=OUTSIDE)
    assert not may_connect(policies, pserver, port=80, to=OUTSIDE)


def test_a_job_without_pservers_has_no_pserver_policy():
    names = [p["metadata"]["name"] for p in manifests.network_policies(_spec(pservers=0), None)]
    assert names == ["ctr-internal", "ctr-master", "ctr-job-egress", "ctr-master-egress"]


@pytest.mark.parametrize("inputs, output, ports", [
    (("/data/*.csv",), None, []),
    (("file:///data/a.csv",), "/out", []),
    (("s3://bucket/a/*.csv",), None, [443]),
    (("http://files.example/a.csv",), None, [80]),
    (("https://files.example:8443/a.csv",), "hdfs://nn/out", [8020, 8443, 9866]),
])
def test_remote_storage_the_job_names_is_reachable_from_its_pods(inputs, output, ports):
    spec = _spec(inputs=inputs, output=output)
    assert manifests.storage_ports(spec) == ports
    policies = manifests.network_policies(spec, None)
    for role in (manifests.MASTER, manifests.TRAINER, manifests.PSERVER):
        me = manifests.labels(spec, role)
        for port in ports:
            assert may_connect(policies, me, port=port, to=OUTSIDE)
        assert not may_connect(policies, me, port=25, to=OUTSIDE)
