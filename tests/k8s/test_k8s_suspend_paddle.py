"""A suspend mid-epoch on "Kubernetes", with real PaddlePaddle trainers: nothing lost, nothing twice.

tests/k8s/test_k8s_resume.py pins the master's part of a suspend with no trainer running;
tests/test_preemption_paddle.py pins the trainers' drain on the local backend. Here they
meet as on a cluster: a real `paddlecloud master --deployer kubernetes` (its Deployment's
own command, with the host's paths) deploys a collective fit-a-line job into kmock, and
the pods of the trainer Job it creates run on podman (tests/k8s/pod_runner.py), real
Paddle in paddlecloud's image, the data, the checkpoints and the consumed log on one
claim the pods share with the host. Mid-epoch the suspend is asked on the master
Deployment as the operator asks it (docs/kubernetes.md, "spec.suspend"); the test plays
the kubelet (the Job's pods stopped with SIGTERM and their termination grace) and the
garbage collector (the foreground deletion finished once they are gone). A second master
resumes, and its group runs to the end. The records are then checked as the local test
checks them (`chaos.lineage`): each epoch's records in the model's lineage once each.
A drained suspend leaves the master's done marks equal to the checkpoint's tasks, so the
resume's RestartEpoch changes nothing there; the second test cuts the drain short (the
kubelet kills at once), where only that RestartEpoch keeps each record once.

What this does NOT cover: the operator itself (its part is the two annotations), pods in
the API (the master sees none, so it never takes them for lost members), the Job
controller's status beyond what the test writes, and anything pod_runner does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pod_runner
import pytest
from chaos.lineage import lineage, off_by_epoch
from masters import MasterProcess
from test_k8s_deployer import create_master, short
from test_run_rendered_pods import start_etcd, the_job_s_secret

from examples.fit_a_line.consumed import read_entries
from paddlecloud.backends.k8s import manifests
from paddlecloud.etcd_server import free_port
from paddlecloud.jobspec import JobSpec
from paddlecloud.jobspec.sections import DataVolume
from tests import containers

pytest.importorskip("paddle")
pytestmark = [pytest.mark.container, pytest.mark.paddle, pytest.mark.timeout(1500)]

STOPPED = 128 + signal.SIGTERM
KILLED = 128 + signal.SIGKILL
EPOCHS = 3
PROGRAM = "trainer"  # the trainer pod's container that runs fit-a-line
CLAIM = "shared"
STARTED = 600  # seconds for a group to start (Paddle's import, gloo) and run, on a busy machine


@pytest.fixture(scope="module")
def paddle_image() -> str:
    return containers.paddlecloud_image(with_paddle=True)


def steps_in_epoch(log: Path, epoch: int) -> int:
    if not log.exists():
        return 0
    return sum(1 for entry in read_entries(log) if entry.get("epoch") == epoch and "ids" in entry)


def fit_a_line_job(name: str, namespace: str, *, image: str, shared: Path, etcd: str) -> JobSpec:
    """Two collective trainers of fit-a-line, the data, checkpoints and consumed log on the
    claim; small chunks and a step delay, so the suspend lands well inside an epoch."""
    command = [manifests.PYTHON, "-m", "examples.fit_a_line.train", "--step-delay", "0.05"]
    worker = {"spec": {"containers": [{"name": PROGRAM, "image": image, "command": command}]}}
    return JobSpec(name=name, namespace=namespace, image=image, paddlecloud_image=image,
                   trainers=2, worker_template=worker, inputs=(f"{shared}/data/*.csv",),
                   output=str(shared / "out"), epochs=EPOCHS, chunk_bytes=64 * 1024,
                   data_volume=DataVolume(claim=CLAIM, mount_path=str(shared)),
                   env=(("FIT_A_LINE_CONSUMED_LOG", str(shared / "consumed.jsonl")),),
                   etcd_endpoints=etcd).validate()


def master_on_the_host(spec: JobSpec, spec_file: Path, tokens: Path, *, host: str) -> tuple[str, ...]:
    """The flags of `paddlecloud master` as its Deployment runs it (`manifests.master_command`),
    with the host's paths for the mounted files, listening where the master Service's name
    resolves in the pods (given last: they win)."""
    return (*manifests.master_command(spec)[2:],
            "--host", host, "--port", str(manifests.MASTER_PORT),
            "--advertise", f"{host}:{manifests.MASTER_PORT}",
            "--metrics-port", str(free_port()), "--tokens-dir", str(tokens),
            "--tls-cert", str(tokens / manifests.TLS_CERT_KEY),
            "--tls-key", str(tokens / manifests.TLS_KEY_KEY),
            "--scaler-token-file", str(tokens / "no-scaler-token"), "--job-spec", str(spec_file))


@contextlib.asynccontextmanager
async def a_node(workdir: Path) -> AsyncIterator[pod_runner.Node]:
    """pod_runner's node; its engine calls run in threads (kmock answers on this loop)."""
    node = await asyncio.to_thread(pod_runner.Node, workdir)
    try:
        yield node
    finally:
        await asyncio.to_thread(node.close)


def start_group(node: pod_runner.Node, k8s, spec: JobSpec, secret: dict[str, bytes],
                shared: Path) -> list[pod_runner.Pod]:
    """The pods of the trainer Job the master created (as the Job controller makes them),
    started on the node, with the DNS of the job's Services."""
    trainers = manifests.trainer_name(spec.name)
    docs = [copy.deepcopy(k8s.stored("jobs", spec.namespace, trainers)),
            copy.deepcopy(k8s.stored("services", spec.namespace, trainers)),
            manifests.master_service(spec, None)]
    pods = pod_runner.pods_of(docs)
    node.assign(pods)
    hosts = pod_runner.dns_names(docs, pods, host_ip=node.gateway)
    for pod in pods:
        node.start(pod, hosts=hosts, secrets={manifests.tokens_secret_name(spec.name): secret},
                   claims={CLAIM: shared})
    return pods


async def exits(node: pod_runner.Node, pods: list[pod_runner.Pod], *, timeout: float) -> list[int]:
    """The exit code of each pod's program, once it ended."""
    async def one(pod: pod_runner.Pod) -> int:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while PROGRAM not in [name.rsplit("-", 1)[-1] for name in pod.started]:  # not started yet
            if pod.error is not None:
                raise pod.error
            assert loop.time() < deadline, f"pod {pod.name} never started its program"
            await asyncio.sleep(0.5)
        return await asyncio.to_thread(node.wait_exit, pod, PROGRAM, timeout=timeout)
    return list(await asyncio.gather(*(one(pod) for pod in pods)))


async def until_running(condition, node: pod_runner.Node, pods: list[pod_runner.Pod],
                        master: MasterProcess, *, timeout: float, what: str) -> None:
    """Polls `condition` (every second: the group shares two cores) while the pods run; a pod
    that failed, or the deadline, fails the test with what the pods and the master said."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        failed = await asyncio.to_thread(node.failed, pods)
        errors = [repr(pod.error) for pod in pods if pod.error is not None]
        if failed or errors or loop.time() > deadline:
            raise AssertionError(f"{what}: {failed or errors or f'not after {timeout:g}s'}\n"
                                 f"the master's log ends:\n{master.log()[-3000:]}")
        await asyncio.sleep(1)


async def trainers_log(node: pod_runner.Node, pods: list[pod_runner.Pod]) -> str:
    return "".join([await asyncio.to_thread(node.logs, pod, PROGRAM) for pod in pods])


@dataclass
class SuspendedAndResumed:
    """What a run of `suspend_and_resume` saw."""

    log: Path             # the consumed log
    data: Path
    stopped_codes: list[int]
    stopped_log: str      # the first group's programs' output
    suspended_early: bool  # the master said suspended while its Job's pods still ran
    stopped_at: int       # the last step the first group took
    first_master: str
    second_master: str
    resumed_log: str      # the second group's programs' output


async def suspend_and_resume(tmp_path: Path, k8s, api_client, *, name: str, image: str,
                             grace: int | None) -> SuspendedAndResumed:
    """The job run, suspended well inside epoch 1 (the kubelet stops each pod with `grace`,
    None: the pod's own), resumed and run to its end."""
    from kubernetes import client

    ns, trainers = "team-s", manifests.trainer_name(name)
    k8s.hold_foreground_deletions("jobs")  # the test is the kubelet and the garbage collector
    shared = tmp_path / CLAIM
    shared.mkdir()
    shared.chmod(0o777)  # the pods' user (the image's) writes checkpoints and the log here
    await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "examples.fit_a_line.data",
                                             str(shared / "data")], check=True, capture_output=True,
                            timeout=120)
    log = shared / "consumed.jsonl"
    apps = client.AppsV1Api(api_client)

    def master_says(key: str) -> str | None:
        return k8s.stored("deployments", ns, manifests.master_name(name))["metadata"][
            "annotations"].get(key)

    async with a_node(tmp_path) as node:
        etcd = await asyncio.to_thread(start_etcd, node.gateway, tmp_path)
        masters: list[MasterProcess] = []
        try:
            spec = fit_a_line_job(name, ns, image=image, shared=shared,
                                  etcd=etcd.endpoint.replace("127.0.0.1", node.gateway))
            await create_master(api_client, spec)
            spec_file = tmp_path / "job.yaml"
            spec_file.write_text(spec.to_yaml())
            secret = the_job_s_secret(spec)
            tokens = tmp_path / "master-tokens"
            tokens.mkdir(mode=0o700)
            for key, value in secret.items():
                (tokens / key).write_bytes(value)

            def start_master(label: str) -> MasterProcess:
                flags = master_on_the_host(spec, spec_file, tokens, host=node.gateway)
                masters.append(MasterProcess(job=name, etcd=spec.etcd_endpoints, tmp=tmp_path,
                                             args=flags, name=label).start())
                return masters[-1]

            first = start_master("master-1")
            await k8s.wait_for(lambda: k8s.stored("jobs", ns, trainers), timeout=120,
                               what="the trainer Job")
            pods = await asyncio.to_thread(start_group, node, k8s, spec, secret, shared)
            await until_running(lambda: steps_in_epoch(log, 1) >= 20, node, pods, first,
                                timeout=STARTED, what="the group well into epoch 1")

            # the suspend, as the operator asks it; the master deletes its group (foreground)
            await asyncio.to_thread(apps.patch_namespaced_deployment, manifests.master_name(name), ns,
                                    {"metadata": {"annotations": {
                                        manifests.SUSPEND_ANNOTATION: "true",
                                        manifests.RESUME_ANNOTATION: manifests.RESUME_PENDING}}})
            await k8s.wait_for(lambda: k8s.deleting("jobs", ns, trainers), timeout=60,
                               what="the trainer Job deleted")
            # the kubelet: every pod of the Job stopped; then the garbage collector
            await asyncio.gather(*(asyncio.to_thread(node.stop, pod, grace=grace) for pod in pods))
            codes = await exits(node, pods, timeout=60)
            suspended_early = master_says(manifests.SUSPENDED_ANNOTATION) == "true"
            k8s.collect_garbage("jobs", ns, trainers)
            await k8s.wait_for(lambda: master_says(manifests.SUSPENDED_ANNOTATION) == "true",
                               timeout=60, what="the master suspended")
            stopped_log = await trainers_log(node, pods)
            stopped_at = max(e["step"] for e in read_entries(log) if "ids" in e)
            await asyncio.to_thread(first.stop)  # kmock answers its last calls meanwhile
            await asyncio.to_thread(apps.patch_namespaced_deployment, manifests.master_name(name), ns,
                                    {"metadata": {"annotations": {manifests.SUSPEND_ANNOTATION: "false"}}})

            # the resume: a master again, which restarts the epoch at the checkpoint first
            second = start_master("master-2")
            await k8s.wait_for(lambda: k8s.stored("jobs", ns, trainers), timeout=120,
                               what="the trainer Job again")
            pods = await asyncio.to_thread(start_group, node, k8s, spec, secret, shared)
            resumed_codes = await exits(node, pods, timeout=STARTED)
            resumed_log = await trainers_log(node, pods)
            assert resumed_codes == [0, 0], resumed_log[-4000:]
            assert master_says(manifests.RESUME_ANNOTATION) == manifests.RESUME_DONE
            assert master_says(manifests.SUSPENDED_ANNOTATION) == ""
        finally:
            for master in masters:
                await asyncio.to_thread(master.stop)
            await asyncio.to_thread(etcd.stop)
    return SuspendedAndResumed(log=log, data=shared / "data", stopped_codes=codes,
                               stopped_log=stopped_log, suspended_early=suspended_early,
                               stopped_at=stopped_at, first_master=first.log(),
                               second_master=second.log(), resumed_log=resumed_log)


def assert_each_record_once(run: SuspendedAndResumed) -> None:
    """What the model trained on (`chaos.lineage`: the steps a resume undid dropped): each
    epoch's records once each."""
    assert sorted(lineage(run.log)) == list(range(EPOCHS))
    assert off_by_epoch(run.log, run.data) == {}


async def test_a_suspend_mid_epoch_drains_saves_and_the_resume_trains_each_record_once(
        tmp_path, k8s, api_client, kubeconfig, job_name, monkeypatch, paddle_image):
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    run = await suspend_and_resume(tmp_path, k8s, api_client, name=short(job_name),
                                   image=paddle_image, grace=None)
    assert run.stopped_codes == [STOPPED, STOPPED], run.stopped_log[-4000:]
    assert not run.suspended_early  # the master said so once its pods were gone, not before
    assert run.stopped_log.count("stopped at step") == 2, run.stopped_log[-4000:]  # one boundary
    saves = [e for e in read_entries(run.log) if "saved" in e and e["saved"] <= run.stopped_at]
    # the stop's checkpoint holds every step taken, inside the epoch: nothing to train again
    assert saves and saves[-1]["saved"] == run.stopped_at, (saves, run.stopped_at)
    stopped_in, tasks_done = saves[-1]["epoch"], saves[-1]["tasks_done"]
    assert tasks_done, saves[-1]
    # no failure counted: the master drained its group, it lost none
    assert "restarting the trainer group" not in run.first_master, run.first_master[-4000:]
    assert f"restarted epoch {stopped_in} with the checkpoint's {tasks_done} tasks done" \
        in run.second_master, run.second_master[-4000:]
    assert (f"resumed from the checkpoint inside epoch {stopped_in} (step {run.stopped_at})"
            in run.resumed_log), run.resumed_log[-4000:]
    assert_each_record_once(run)


async def test_a_suspend_whose_drain_is_cut_short_resumes_at_the_last_checkpoint_exactly(
        tmp_path, k8s, api_client, kubeconfig, job_name, monkeypatch, paddle_image):
    """The kubelet kills the pods at once (a forced delete, a node going down): no drain,
    the epoch-end checkpoint stands, and the resume restarts epoch 1 from scratch, so the
    tasks the master counted done in it, which the model never kept, are read again."""
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    run = await suspend_and_resume(tmp_path, k8s, api_client, name=short(job_name),
                                   image=paddle_image, grace=0)
    assert run.stopped_codes == [KILLED, KILLED], run.stopped_log[-4000:]
    assert "stopped at step" not in run.stopped_log
    assert re.search(r"the master restarted epoch 1$", run.second_master, re.MULTILINE), \
        run.second_master[-4000:]  # the whole epoch: the checkpoint holds none of it
    assert "resumed from the checkpoint of epoch 0" in run.resumed_log, run.resumed_log[-4000:]
    assert_each_record_once(run)
