"""Each job's own etcd user (paddlecloud.etcd_users) on a real etcd with TLS and auth: it
reads and writes its job's prefix and nothing else, a master and a pserver agent run as it,
and forgetting the job removes it.
"""

from __future__ import annotations

import asyncio
import select
import socket
from pathlib import Path

import aetcd
import grpc
import pytest
from datasets import write_records
from masters import MasterProcess, pb, stub, wait_serving
from test_etcd_secured import _keys, _start_agent, secured  # noqa: F401 (a fixture)
from test_pserver_agent import ask
from waiting import wait_for

from paddlecloud.etcd import EtcdAuthError, EtcdCredentials, connect
from paddlecloud.etcd_users import forget_job, job_user_name, provision_job_user
from paddlecloud.keys import JobKeys

NAMESPACE = "local"  # the namespace of a master started without --namespace


def _admin(env: dict[str, str]) -> EtcdCredentials:
    return EtcdCredentials.from_env(env)


def _as_job_user(env: dict[str, str], user) -> EtcdCredentials:
    """The job user's credentials: its name and password beside the shared TLS files."""
    return EtcdCredentials(ca_file=env["PADDLE_ETCD_CA_FILE"], cert_file=env["PADDLE_ETCD_CERT_FILE"],
                           key_file=env["PADDLE_ETCD_KEY_FILE"], user=user.name, password=user.password)


def _job_user_env(env: dict[str, str], user, tmp_path: Path) -> dict[str, str]:
    """A process's environment as the job's pods get it: the user by name, the password a file."""
    (tmp_path / "job-password").write_text(user.password)
    return {**env, "PADDLE_ETCD_USER": user.name, "PADDLE_ETCD_PASSWORD_FILE": str(tmp_path / "job-password")}


async def test_a_jobs_user_reads_and_writes_its_prefix_and_is_refused_another_jobs(secured, job_name):  # noqa: F811
    etcd, env = secured
    mine, theirs = JobKeys(NAMESPACE, job_name), JobKeys(NAMESPACE, f"{job_name}-b")
    user = await provision_job_user(etcd.endpoint, namespace=NAMESPACE, job=job_name, timeout=10,
                                    credentials=_admin(env))
    other = await provision_job_user(etcd.endpoint, namespace=NAMESPACE, job=f"{job_name}-b",
                                     timeout=10, credentials=_admin(env))
    assert user.name == job_user_name(NAMESPACE, job_name) and user.password != other.password
    admin = await connect(etcd.endpoint, credentials=_admin(env))
    await admin.put(theirs.phase, b"Running")
    client = await connect(etcd.endpoint, credentials=_as_job_user(env, user), probe=mine.prefix)
    try:
        await client.put(mine.phase, b"Running")
        assert (await client.get(mine.phase)).value == b"Running"
        for refused in (lambda: client.get(theirs.phase), lambda: client.put(theirs.phase, b"Failed"),
                        lambda: client.get(b"/paddlecloud/"), lambda: client.delete_prefix(theirs.prefix)):
            with pytest.raises(aetcd.ClientError, match="permission denied"):
                await refused()
        assert (await admin.get(theirs.phase)).value == b"Running"
    finally:
        await client.close()
        await admin.close()
    with pytest.raises(EtcdAuthError, match="may read and write /paddlecloud/"):
        await connect(etcd.endpoint, credentials=_as_job_user(env, user), timeout=5)  # the root probe

    assert await forget_job(etcd.endpoint, namespace=NAMESPACE, job=job_name, timeout=10,
                            credentials=_admin(env)) == 1
    with pytest.raises(EtcdAuthError, match="refused our credentials"):  # the user is gone
        await connect(etcd.endpoint, credentials=_as_job_user(env, user), probe=mine.prefix, timeout=5)
    assert await _keys(env, theirs.prefix)  # the other job's keys stay
    await forget_job(etcd.endpoint, namespace=NAMESPACE, job=f"{job_name}-b", timeout=10,
                     credentials=_admin(env))


async def test_a_creator_without_an_etcd_user_makes_none(secured, job_name):  # noqa: F811
    etcd, env = secured
    certificate_only = EtcdCredentials(ca_file=env["PADDLE_ETCD_CA_FILE"])
    assert await provision_job_user(etcd.endpoint, namespace=NAMESPACE, job=job_name, timeout=5,
                                    credentials=certificate_only) is None


async def test_a_master_and_a_pserver_agent_run_as_the_jobs_own_user(secured, tmp_path, job_name,  # noqa: F811
                                                                     monkeypatch):
    """Everything a master (its election, its lease process, its writes) and a pserver agent
    (its slot, its registration) touch in etcd is under the job's prefix."""
    etcd, env = secured
    user = await provision_job_user(etcd.endpoint, namespace=NAMESPACE, job=job_name, timeout=10,
                                    credentials=_admin(env))
    job_env = _job_user_env(env, user, tmp_path)
    for key, value in job_env.items():
        monkeypatch.setenv(key, value)
    write_records(tmp_path / "data", files=2, records_per_file=3)
    proc = MasterProcess(job=job_name, etcd=etcd.endpoint, tmp=tmp_path,
                         args=("--input", str(tmp_path / "data"))).start()
    agent = _start_agent(job_env, tmp_path, job_name)
    keys = JobKeys(NAMESPACE, job_name)
    try:
        await wait_serving(proc.address, process=proc)
        async with grpc.aio.insecure_channel(proc.address) as channel:
            m = stub(channel)
            session = (await m.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="t"))).session_id
            await m.KeepAlive(pb.KeepAliveRequest(session_id=session), timeout=30)  # the lease process
            task = (await m.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))).task
            reply = await m.TaskFinished(pb.TaskReport(session_id=session, task_id=task.id, epoch=0,
                                                       attempt=task.attempt))
            assert reply.result == pb.ACCEPTED, proc.log()

        async def registered() -> bool:
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()
            return bool(await _keys(env, keys.kind_prefix("pservers")))
        await wait_for(registered, timeout=60, details=lambda: (tmp_path / "agent.log").read_text())
        endpoint = next(iter((await _keys(env, keys.kind_prefix("pservers"))).values())).decode()

        async def pserver_env() -> dict | None:  # what the program the agent started was given
            try:
                return await asyncio.to_thread(ask, endpoint)
            except OSError:
                return None
        seen = (await wait_for(pserver_env, timeout=60))["env"]
        assert not {"PADDLE_ETCD_USER", "PADDLE_ETCD_PASSWORD_FILE", "PADDLE_ETCD_PASSWORD",
                    "PADDLE_ETCD_KEY_FILE"} & set(seen)
        assert user.password not in str(seen)
    finally:
        proc.stop()
        agent.terminate()
        await asyncio.to_thread(agent.wait, 30)
    assert keys.done(0, task.id) in await _keys(env, keys.prefix)
    await forget_job(etcd.endpoint, namespace=NAMESPACE, job=job_name, timeout=10,
                     credentials=_admin(env))


async def test_roots_credentials_never_go_to_a_plain_http_endpoint():
    """A job's endpoints may come from its submitter: root's password is sent over TLS only."""
    with socket.socket() as listener:  # whoever listens there would read the password
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
        root = EtcdCredentials(user="root", password="s3cret")
        for call in (lambda: provision_job_user(endpoint, namespace=NAMESPACE, job="j", timeout=2,
                                                credentials=root),
                     lambda: forget_job(endpoint, namespace=NAMESPACE, job="j", timeout=2,
                                        credentials=root)):
            with pytest.raises(EtcdAuthError, match="root.s password never goes in plaintext") as refused:
                await call()
            assert "s3cret" not in str(refused.value)
        assert select.select([listener], [], [], 0)[0] == []  # nobody ever connected


def test_a_job_without_an_etcd_user_starts_though_its_password_file_is_absent(tmp_path):
    """The job's Secret is optional (etcd without auth): its pods then have the password file's
    path but no file and no user, which is no credential at all; a user without the file is
    one clear error naming it."""
    absent = str(tmp_path / "etcd-user" / "password")
    assert EtcdCredentials.from_env({"PADDLE_ETCD_PASSWORD_FILE": absent}) == EtcdCredentials()
    with pytest.raises(ValueError, match=f"cannot read the etcd password file {absent}"):
        EtcdCredentials.from_env({"PADDLE_ETCD_PASSWORD_FILE": absent, "PADDLE_ETCD_USER": "u"})
