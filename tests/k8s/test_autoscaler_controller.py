"""The autoscaler's controller against kmock: a synthetic cluster (nodes and pods in the
emulator), jobs whose masters are small fake gRPC masters.

Why fake masters: the controller's whole contract with a job is GetStatus (the range and the
desired size) and ScaleTrainers (set the size), and the test must play what a real cluster
does next — the Job controller makes or removes the trainer pods, the scheduler binds them —
the moment a size changes. A fake master (a real grpc.aio server, answering only those two
RPCs) does both in its ScaleTrainers, in step. The real master's scale path (the Job's
parallelism, the range check) is pinned by test_k8s_elastic.py; the autoscaler driving real
masters end to end is tests/test_autoscaler_local.py.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import kmock
import pytest
import yaml
from click.testing import CliRunner
from kubernetes import client

from autoscaler.cli import DEFAULT_LEASE as LEASE
from autoscaler.controller import COMPONENT, EVENT_REASON, Controller, Settings
from autoscaler.lease import LeaseElector
from paddlecloud.api import pb, pb_grpc
from paddlecloud.auth import scaler_token, scaler_token_namespace
from paddlecloud.backends.k8s import manifests
from paddlecloud.cli.main import main

NS = "ml"
REPO = Path(__file__).resolve().parents[2]
GI = 1024**3
NODE_CPU, TRAINER_CPU = "4", "1"


class Sim:
    """Plays the Job controller and the scheduler on kmock: trainer pods follow each job's
    size (the highest indexes go first), pending pods bind to the first node with room."""

    def __init__(self, k8s: Any, api_client: Any) -> None:
        self.k8s, self.core = k8s, client.CoreV1Api(api_client)
        self.nodes: list[str] = []
        self.masters: dict[str, FakeMaster] = {}

    def add_node(self, name: str, *, cpu: str = NODE_CPU) -> None:
        self.k8s.kmock.objects[_res("nodes"), None, name] = {
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"allocatable": {"cpu": cpu, "memory": "64Gi", "pods": "110"}}}
        self.nodes.append(name)

    def pods(self) -> list[dict[str, Any]]:
        return [obj.raw for (resource, _, _), obj in self.k8s.kmock.objects.items()
                if resource == _res("pods") and not obj.deleted]

    def trainers(self, job: str) -> dict[int, dict[str, Any]]:
        return {int(p["metadata"]["labels"][manifests.COMPLETION_INDEX_LABEL]): p for p in self.pods()
                if p["metadata"]["labels"].get(manifests.JOB_LABEL) == job
                and p["metadata"]["labels"][manifests.ROLE_LABEL] == manifests.TRAINER}

    def running(self, job: str) -> int:
        return sum(1 for p in self.trainers(job).values() if p["spec"].get("nodeName"))

    async def follow(self, job: str, size: int) -> None:
        for index, pod in self.trainers(job).items():
            if index >= size:
                await asyncio.to_thread(self.core.delete_namespaced_pod, pod["metadata"]["name"], NS)
        have = self.trainers(job)
        for index in range(size):
            if index not in have:
                name = f"{job}-trainer-{index}"
                self.k8s.kmock.objects[_res("pods"), NS, name] = {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": NS, "labels": {
                        manifests.APP_LABEL: manifests.APP_NAME, manifests.JOB_LABEL: job,
                        manifests.ROLE_LABEL: manifests.TRAINER,
                        manifests.COMPLETION_INDEX_LABEL: str(index)}},
                    "spec": {"containers": [{"name": "trainer", "image": "x", "resources": {
                        "requests": {"cpu": TRAINER_CPU, "memory": "1Gi"}}}]},
                    "status": {"phase": "Pending"}}
        self.schedule()

    def schedule(self) -> None:
        """Binds pending pods, by name, to the first node with their CPUs free (whole CPUs here)."""
        def cpus(pod: dict[str, Any]) -> int:
            return sum(int(c["resources"]["requests"]["cpu"]) for c in pod["spec"]["containers"])

        used = {n: 0 for n in self.nodes}
        for pod in self.pods():
            if pod["spec"].get("nodeName") in used:
                used[pod["spec"]["nodeName"]] += cpus(pod)
        for pod in sorted(self.pods(), key=lambda p: p["metadata"]["name"]):
            if pod["spec"].get("nodeName"):
                continue
            free = next((n for n in self.nodes if used[n] + cpus(pod) <= int(NODE_CPU)), None)
            if free is None:
                continue
            used[free] += cpus(pod)
            key = (_res("pods"), NS, pod["metadata"]["name"])
            self.k8s.kmock.objects[key].patch({"spec": {"nodeName": free}, "status": {"phase": "Running"}})

    async def add_job(self, name: str, *, lo: int, hi: int, size: int) -> FakeMaster:
        self.add_deployment(name)
        master = FakeMaster(self, name, lo=lo, hi=hi, size=size)
        await master.start()
        self.masters[name] = master
        await self.follow(name, size)
        return master

    def add_deployment(self, name: str) -> None:
        """The job's master Deployment, as `job submit` creates it (what the autoscaler lists)."""
        labels = {manifests.APP_LABEL: manifests.APP_NAME, manifests.JOB_LABEL: name,
                  manifests.ROLE_LABEL: manifests.MASTER}
        self.k8s.kmock.objects[_res("deployments"), NS, manifests.master_name(name)] = {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": manifests.master_name(name), "namespace": NS, "uid": f"uid-{name}",
                         "labels": labels},
            "spec": {"selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "master", "image": "x"}]}}}}

    async def delete_job(self, name: str) -> None:
        apps = client.AppsV1Api(self.core.api_client)
        await asyncio.to_thread(apps.delete_namespaced_deployment, manifests.master_name(name), NS)
        await self.follow(name, 0)  # the garbage collector removes what the master owned
        await self.masters.pop(name).stop()

    def address(self, name: str, namespace: str) -> str:
        master = self.masters.get(name)
        return master.address if master else "127.0.0.1:1"  # a deleted job's master: gone

    def events(self, job: str) -> list[dict[str, Any]]:
        return [obj.raw for (resource, _, _), obj in self.k8s.kmock.objects.items()
                if resource == _res("events") and not obj.deleted
                and obj.raw["involvedObject"]["name"] == manifests.master_name(job)]

    def sizes(self) -> dict[str, int]:
        return {name: master.size for name, master in self.masters.items()}


def _res(plural: str) -> Any:
    group, version = {"deployments": ("apps", "v1")}.get(plural, ("", "v1"))
    return kmock.resource(group, version, plural)


class FakeMaster(pb_grpc.MasterServicer):
    """GetStatus and ScaleTrainers only; a scale makes the Sim follow at once."""

    def __init__(self, sim: Sim, name: str, *, lo: int, hi: int, size: int) -> None:
        self.sim, self.name, self.lo, self.hi, self.size = sim, name, lo, hi, size
        self.scaled_by: list[tuple[int, str]] = []  # (size, the caller's token)
        self.asked_by: set[str] = set()  # the tokens GetStatus came with
        self.asked = 0  # GetStatus calls answered or refused
        self.accepts: str | None = None  # a token: every other one is refused, as a real master does
        self.server = grpc.aio.server()
        pb_grpc.add_MasterServicer_to_server(self, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"

    async def start(self) -> None:
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop(None)

    async def GetStatus(self, request: Any, context: Any) -> Any:
        self.asked += 1
        self.asked_by.add(_token(context))
        await self.check_token(context)
        return pb.GetStatusResponse(job=self.name, namespace=NS, min_trainers=self.lo,
                                    max_trainers=self.hi, desired_trainers=self.size)

    async def check_token(self, context: Any) -> None:
        if self.accepts is not None and _token(context) != self.accepts:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "no valid token of this job")

    async def ScaleTrainers(self, request: Any, context: Any) -> Any:
        if not self.lo <= request.trainers <= self.hi:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{request.trainers} outside the range")
        await self.check_token(context)
        self.scaled_by.append((request.trainers, _token(context)))
        self.size = request.trainers
        await self.sim.follow(self.name, self.size)
        return pb.ScaleTrainersResponse(min_trainers=self.lo, max_trainers=self.hi,
                                        desired_trainers=self.size)


def _token(context: Any) -> str:
    return dict(context.invocation_metadata()).get("authorization", "").removeprefix("Bearer ")


@pytest.fixture
async def sim(k8s_leases: Any, api_client: Any) -> AsyncIterator[Sim]:
    simulation = Sim(k8s_leases, api_client)
    yield simulation
    for master in list(simulation.masters.values()):
        await master.stop()


SETTINGS = Settings(interval_s=0.05, max_load_desired=1.0, rpc_timeout_s=2.0, retry_wait_s=0.05)


class Replica:
    """One controller in its own thread, as `paddlecloud autoscaler` runs it, on its own API
    client (its user agent tells its requests from the Sim's)."""

    def __init__(self, sim: Sim, *, identity: str = "") -> None:
        config = client.Configuration()
        config.host = sim.k8s.url
        api_client = client.ApiClient(config)
        api_client.user_agent = COMPONENT
        settings = Settings(**{**SETTINGS.__dict__, "scaler_key": identity or None})
        self.controller = Controller(api_client, settings=settings, master_address=sim.address)
        self.elector = (LeaseElector(api_client, name=LEASE, namespace=NS, identity=identity,
                                     lease_duration_s=10) if identity else None)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.controller.run, args=(self.stop,),
                                       kwargs={"elector": self.elector}, daemon=True)

    async def __aenter__(self) -> Replica:
        self.thread.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stops the loop; the join waits off the event loop, which serves kmock and the masters."""
        self.stop.set()
        await asyncio.to_thread(self.thread.join, 10)
        assert not self.thread.is_alive()
        self.controller.api_client.close()


async def test_a_newcomer_in_a_full_cluster_makes_the_elastic_jobs_give_way_to_its_min(sim, api_client, caplog):
    caplog.set_level(logging.INFO, logger="autoscaler.controller")
    for name in ("n1", "n2", "n3"):
        sim.add_node(name)
    await sim.add_job("a", lo=1, hi=4, size=4)
    await sim.add_job("b", lo=1, hi=4, size=4)
    fixed = await sim.add_job("f", lo=2, hi=2, size=2)  # no range: load, never touched
    sim.k8s.kmock.objects[_res("pods"), NS, "a-ps-0"] = {  # a pserver: load, never scaled
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "a-ps-0", "namespace": NS, "labels": {
            manifests.JOB_LABEL: "a", manifests.ROLE_LABEL: manifests.PSERVER}},
        "spec": {"nodeName": "n3", "containers": [{"name": "ps", "image": "x", "resources": {
            "requests": {"cpu": "2", "memory": "1Gi"}}}]},
        "status": {"phase": "Running"}}
    assert sim.running("a") == sim.running("b") == 4 and sim.running("f") == 2  # with the pserver: full
    async with Replica(sim) as replica:
        await sim.k8s.wait_for(lambda: replica.controller.last_plan is not None, what="a first round")
        assert replica.controller.last_plan.changes == ()  # nobody can grow, nobody waits
        await sim.add_job("c", lo=2, hi=4, size=2)
        assert sim.running("c") == 0  # no room: wholly pending
        await sim.k8s.wait_for(lambda: sim.running("c") == 2, what="the newcomer running at its min")
    assert sim.sizes() == {"a": 3, "b": 3, "c": 2, "f": 2}  # the most fulfilled gave one each
    assert fixed.scaled_by == [] and sim.events("f") == []
    assert sim.k8s.stored("pods", NS, "a-ps-0") is not None
    for job in ("a", "b"):
        (event,) = sim.events(job)
        assert event["reason"] == EVENT_REASON and event["involvedObject"]["kind"] == "Deployment"
        assert event["involvedObject"]["name"] == f"{job}-master"
        assert event["involvedObject"]["uid"] == f"uid-{job}"
        assert event["message"] == "trainers 4 -> 3: gave way to job 'ml/c', placed below its min (2)"
        check_valid_event(event)
    assert sim.events("c") == []  # c was placed where their trainers left: its size never changed
    # every change is logged with its reason, once (the round that made it), and nothing else
    changes = [r.getMessage() for r in caplog.records
               if r.name == "autoscaler.controller" and " trainers (" in r.getMessage()]
    assert sorted(changes) == [f"job ml/{job}: 4 -> 3 trainers (gave way to job 'ml/c', placed below its "
                               "min (2))" for job in ("a", "b")]


async def test_a_node_added_lets_the_jobs_grow_and_a_deleted_job_frees_its_share(sim, api_client):
    sim.add_node("n1")
    await sim.add_job("a", lo=1, hi=4, size=2)
    await sim.add_job("b", lo=1, hi=4, size=2)
    sim.add_deployment("silent")  # a job whose master does not answer: not planned, no failure
    async with Replica(sim) as replica:
        await sim.k8s.wait_for(lambda: replica.controller.last_plan is not None, what="a first round")
        assert set(replica.controller.last_plan.sizes) == {"ml/a", "ml/b"}
        sim.add_node("n2")
        await sim.k8s.wait_for(lambda: sim.sizes() == {"a": 4, "b": 4}, what="both jobs at their max")
        assert sim.running("a") == sim.running("b") == 4
        assert "room on the nodes" in sim.events("a")[-1]["message"]
        await sim.add_job("c", lo=1, hi=8, size=1)
        await sim.k8s.wait_for(lambda: sim.running("c") == 1, what="c placed at its min")
        assert sim.sizes() == {"a": 4, "b": 3, "c": 1}  # b (tied, then by name, last) gave way
        await sim.delete_job("a")
        await sim.k8s.wait_for(lambda: sim.sizes() == {"b": 4, "c": 4}, what="a's share taken up")
    assert sim.running("b") == sim.running("c") == 4
    assert_autoscaler_rights(sim.k8s)


async def test_a_watch_event_starts_a_round_long_before_the_interval(sim, api_client):
    sim.add_node("n1")
    master = await sim.add_job("a", lo=1, hi=8, size=4)
    replica = Replica(sim)
    replica.controller.settings = Settings(**{**SETTINGS.__dict__, "interval_s": 600.0,
                                              "watch_window_s": 1})
    async with replica:
        replica.controller.start_watches(replica.stop)
        await sim.k8s.wait_for(lambda: replica.controller.last_plan is not None, what="the first round")
        assert master.size == 4  # the node is full
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"},
                "status": {"allocatable": {"cpu": NODE_CPU, "memory": "64Gi"}}}
        await asyncio.to_thread(client.CoreV1Api(api_client).create_node, node)
        sim.nodes.append("n2")
        await sim.k8s.wait_for(lambda: master.size == 8, timeout=20, what="a grown after the node event")
    assert ("", "nodes", "watch") in {(r.resource.group, r.resource.plural, "watch") for r in sim.k8s.kmock
                                      if r.resource and r.params.get("watch")}
    assert_autoscaler_rights(sim.k8s)


async def test_a_failed_round_is_logged_and_the_next_one_acts(sim, caplog):
    sim.add_node("n1")
    master = await sim.add_job("a", lo=1, hi=4, size=1)
    answered = sim.k8s.fail("get", "nodes", status=500, times=2)
    async with Replica(sim):
        await sim.k8s.wait_for(lambda: master.size == 4, what="a grown once the API answered")
    assert answered == [2]
    assert caplog.text.count("autoscaler round failed") == 2


def test_a_bad_flag_is_a_usage_error_naming_it():
    result = CliRunner().invoke(main, ["autoscaler", "--max-load-desired", "1.5", "--once"])
    assert result.exit_code == 2 and "1.5" in result.output and "--max-load-desired" in result.output


async def test_dry_run_prints_the_plan_and_changes_nothing(sim, api_client, kubeconfig):
    sim.add_node("n1")
    master = await sim.add_job("a", lo=1, hi=4, size=1)
    result = await asyncio.to_thread(
        CliRunner().invoke, main, ["autoscaler", "--dry-run", "--once", "--kubeconfig", kubeconfig,
                                   "--master-address", master.address, "--max-load-desired", "1"])
    assert result.exit_code == 0, result.output
    assert "dry run: job ml/a 1 -> 4 trainers (room on the nodes and under max_load_desired)" in result.output
    # what it saw, before what it would do: EDL's "Cluster.InquiryResource done" line
    assert re.search(r"^dry run: 1 node\(s\): cpu idle \d+m of \d+m, .*; 1 job\(s\): ml/a 1 trainers "
                     r"\(1 placed, range 1\.\.4, each cpu \d+m mem \d+Mi gpu 0\)$", result.output, re.M), result.output
    assert master.scaled_by == [] and master.size == 1 and sim.running("a") == 1
    assert sim.events("a") == []
    assert_autoscaler_rights(sim.k8s)


async def test_the_scaler_token_of_the_jobs_namespace_goes_with_every_call_to_its_master(
        sim, api_client, kubeconfig, tmp_path, monkeypatch):
    monkeypatch.delenv("PADDLE_JOB_TOKEN_FILE", raising=False)
    sim.add_node("n1")
    master = await sim.add_job("a", lo=1, hi=4, size=1)
    key_file = tmp_path / "scaler" / "key"  # as deploy/components/autoscaler/autoscaler.yaml mounts the Secret
    key_file.parent.mkdir()
    key_file.write_text("the-scaler-key\n")
    printed = await asyncio.to_thread(CliRunner().invoke, main, [
        "autoscaler", "--scaler-key-file", str(key_file), "--print-token", NS])
    assert printed.exit_code == 0, printed.output
    token = printed.output.strip()  # what the admin puts in the Secret paddlecloud-scaler of NS
    assert token == scaler_token("the-scaler-key", NS) and scaler_token_namespace(token) == NS
    args = ["autoscaler", "--once", "--kubeconfig", kubeconfig, "--master-address", master.address,
            "--max-load-desired", "1", "--scaler-key-file", str(key_file)]
    result = await asyncio.to_thread(CliRunner().invoke, main, args)
    assert result.exit_code == 0, result.output
    assert master.asked_by == {token}
    assert master.scaled_by == [(4, token)] and sim.running("a") == 4
    key_file.unlink()
    missing = await asyncio.to_thread(CliRunner().invoke, main, args)
    assert missing.exit_code == 2 and f"cannot read token file {key_file}" in missing.output
    assert master.scaled_by == [(4, token)]
    bad = await asyncio.to_thread(CliRunner().invoke, main, [
        "autoscaler", "--scaler-key-file", str(tmp_path / "none"), "--print-token", "Team A"])
    assert bad.exit_code == 2 and "--scaler-key-file" in bad.output
    (tmp_path / "k").write_text("k")
    bad = await asyncio.to_thread(CliRunner().invoke, main, [
        "autoscaler", "--scaler-key-file", str(tmp_path / "k"), "--print-token", "Team A"])
    assert bad.exit_code == 2 and "'Team A' is not a namespace name" in bad.output


async def test_a_master_refusing_the_token_is_not_planned_and_said_once_until_it_accepts(sim, caplog):
    sim.add_node("n1")
    master = await sim.add_job("a", lo=1, hi=4, size=1)
    master.accepts = scaler_token("another-autoscalers-key", NS)
    replica = Replica(sim)
    replica.controller.settings = Settings(**{**SETTINGS.__dict__, "scaler_key": "the-autoscalers-key"})
    async with replica:
        await sim.k8s.wait_for(lambda: master.asked >= 4, what="four rounds refused")
        assert master.size == 1 and master.scaled_by == []
        assert caplog.text.count("job ml/a: its master refused our scaler token (UNAUTHENTICATED)") == 1
        assert "paddlecloud-scaler of namespace ml" in caplog.text
        master.accepts = scaler_token("the-autoscalers-key", NS)  # the admin put the right token in
        await sim.k8s.wait_for(lambda: master.size == 4, what="a grown once its master accepts us")
    assert master.scaled_by == [(4, scaler_token("the-autoscalers-key", NS))]


async def test_of_two_replicas_only_the_lease_holder_acts_and_the_other_takes_over(sim, api_client):
    sim.add_node("n1")
    master = await sim.add_job("a", lo=1, hi=8, size=1)
    first = await Replica(sim, identity="replica-1").__aenter__()
    await sim.k8s.wait_for(lambda: first.elector.leading, what="replica-1 leading")
    async with Replica(sim, identity="replica-2") as second:
        await sim.k8s.wait_for(lambda: master.size == 4, what="a grown to the node")
        assert {who for _, who in master.scaled_by} == {scaler_token("replica-1", NS)}
        assert not second.elector.leading and second.controller.last_plan is None
        await first.close()  # releases the Lease on the way out
        await sim.k8s.wait_for(lambda: second.elector.leading, what="replica-2 taking over")
        sim.add_node("n2")
        await sim.k8s.wait_for(lambda: master.size == 8, what="a grown onto the new node")
    assert [who for _, who in master.scaled_by][-1] == scaler_token("replica-2", NS)
    assert {who for _, who in master.scaled_by} == {scaler_token(f"replica-{i}", NS) for i in (1, 2)}
    assert_autoscaler_rights(sim.k8s)


async def test_a_lease_held_by_another_is_taken_over_only_after_it_stopped_changing(api_client, k8s_leases):
    await asyncio.to_thread(_takeover, api_client)


def _takeover(api_client: Any) -> None:
    now = [0.0]
    one = LeaseElector(api_client, name="l", namespace=NS, identity="one", lease_duration_s=10)
    two = LeaseElector(api_client, name="l", namespace=NS, identity="two", lease_duration_s=10,
                       clock=lambda: now[0])
    assert one.try_acquire_or_renew() and not two.try_acquire_or_renew()
    now[0] = 9.0
    assert one.try_acquire_or_renew()  # renewed, while two did not look
    now[0] = 18.0
    assert not two.try_acquire_or_renew()  # a new record: two's count starts again, now
    now[0] = 27.0
    assert not two.try_acquire_or_renew()
    now[0] = 28.5  # one stopped renewing 10.5 s ago, as two sees it
    assert two.try_acquire_or_renew() and two.leading
    assert not one.try_acquire_or_renew() and not one.leading
    lease = client.CoordinationV1Api(api_client).read_namespaced_lease("l", NS)
    assert lease.spec.holder_identity == "two" and lease.spec.lease_transitions == 1


async def test_a_stale_write_to_the_lease_conflicts(api_client, k8s_leases):
    await asyncio.to_thread(_stale_write, api_client)


def _stale_write(api_client: Any) -> None:
    api = client.CoordinationV1Api(api_client)
    one = LeaseElector(api_client, name="l", namespace=NS, identity="one")
    assert one.try_acquire_or_renew()
    read = api.read_namespaced_lease("l", NS)
    assert one.try_acquire_or_renew()  # moves the version on
    with pytest.raises(client.ApiException) as conflict:
        api.patch_namespaced_lease("l", NS, {"metadata": {"resourceVersion": read.metadata.resource_version},
                                             "spec": {"holderIdentity": "thief"}},
                                   _content_type="application/merge-patch+json")
    assert conflict.value.status == 409
    assert api.read_namespaced_lease("l", NS).spec.holder_identity == "one"


def check_valid_event(event: dict[str, Any]) -> None:
    """The Event as sent (less what the emulator added) is strictly valid, 1.28 and newest."""
    import kubernetes_validate

    body = {**event, "metadata": {k: v for k, v in event["metadata"].items()
                                  if k not in ("uid", "creationTimestamp", "resourceVersion")}}
    for version in ("1.28", kubernetes_validate.latest_version()):
        kubernetes_validate.validate(body, version, strict=True)


def granted() -> tuple[set[tuple[str, str, str]], set[tuple[str, str, str]]]:
    """(API group, resource, verb) the ClusterRole and the Role of deploy/components/autoscaler/autoscaler.yaml grant."""
    docs = [d for d in yaml.safe_load_all((REPO / "deploy/components/autoscaler/autoscaler.yaml").read_text()) if d]

    def rules(kind: str) -> set[tuple[str, str, str]]:
        role = next(d for d in docs if d["kind"] == kind)
        return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
                for resource in rule["resources"] for verb in rule["verbs"]}

    return rules("ClusterRole"), rules("Role")


def assert_autoscaler_rights(k8s: Any) -> None:
    """Every request a controller made is granted by deploy/components/autoscaler/autoscaler.yaml: cluster-wide by
    its ClusterRole, the Lease (in its own namespace) by its Role."""
    cluster_wide, lease = granted()
    used = set()
    for request in list(k8s.kmock):
        if request.headers.get("User-Agent") != COMPONENT or request.resource is None:
            continue
        method = str(request.method.value).upper()
        if method == "GET":
            verb = "get" if request.name else ("watch" if request.params.get("watch") else "list")
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
        used.add((request.resource.group, request.resource.plural, verb))
    assert used, "the autoscaler made no request"
    assert used <= cluster_wide | lease, used - (cluster_wide | lease)
    assert {r for r in used if r[1] == "leases"} <= lease


def test_the_autoscaler_manifest_is_strictly_valid_hardened_and_least_privilege():
    import kubernetes_validate

    docs = [d for d in yaml.safe_load_all((REPO / "deploy/components/autoscaler/autoscaler.yaml").read_text()) if d]
    for doc in docs:
        for version in ("1.28", kubernetes_validate.latest_version()):
            kubernetes_validate.validate(doc, version, strict=True)
    cluster_wide, lease = granted()
    assert cluster_wide == {("", "nodes", "list"), ("", "nodes", "watch"), ("", "pods", "list"),
                            ("", "pods", "watch"), ("apps", "deployments", "list"),
                            ("", "events", "create")}
    assert lease == {("coordination.k8s.io", "leases", v) for v in ("create", "get", "patch")}
    role = next(d for d in docs if d["kind"] == "Role")
    assert role["metadata"]["namespace"] == next(
        d for d in docs if d["kind"] == "Deployment")["metadata"]["namespace"]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = pod["containers"][0]
    assert container["command"] == ["paddlecloud", "autoscaler"]
    assert f"--lease-name={LEASE}" in container["args"]
    hardened = container["securityContext"]
    assert hardened["allowPrivilegeEscalation"] is False and hardened["capabilities"] == {"drop": ["ALL"]}
    assert {e["name"] for e in container["env"]} >= {"POD_NAME", "POD_NAMESPACE"}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "scaler-key")
    assert f"--scaler-key-file={mount['mountPath']}/key" in container["args"]
    assert next(v for v in pod["volumes"] if v["name"] == "scaler-key")["secret"]["secretName"] == \
        manifests.SCALER_KEY_SECRET


async def test_a_volcano_ps_job_keeps_min_member_at_its_min_through_every_scale(k8s, api_client):
    """The job's master keeps the PodGroup (the autoscaler holds no right on it): its gang is
    the pservers plus the MIN trainers, whatever size the job is scaled to."""
    from test_k8s_deployer import FAST_RETRY, create_master, make_spec
    from test_k8s_deployer import NS as DEPLOYER_NS

    from paddlecloud.backends.k8s.deployer import KubernetesDeployer

    worker = {"spec": {"schedulerName": "volcano", "containers": [
        {"name": "paddle", "image": "img", "command": ["python", "-m", "ctr.train"]}]}}
    spec = make_spec("gang", scheduler_name="volcano", worker_template=worker, ps_template=worker,
                     trainers=3, min_trainers=2, max_trainers=6, pservers=2)
    await create_master(api_client, spec)
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    await deployer.create_pservers()
    await deployer.create_trainers()
    assert k8s.stored("podgroups", DEPLOYER_NS, "gang")["spec"]["minMember"] == 2 + 2
    for size in (6, 2, 5):
        await deployer.scale(size)
        assert k8s.stored("jobs", DEPLOYER_NS, "gang-trainer")["spec"]["parallelism"] == size
        assert k8s.stored("podgroups", DEPLOYER_NS, "gang")["spec"]["minMember"] == 2 + 2
