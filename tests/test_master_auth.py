"""Who may call what on a master with tokens: the authorization matrix, and the forged finish.

Real master processes over real gRPC, a real etcd; the tokens are the job's files.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from datasets import write_records
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from masters import pb, stub, wait_serving

from paddlecloud.auth import JobTokens, auth_metadata
from paddlecloud.etcd import connect, read_range
from paddlecloud.keys import JobKeys, prefix_range_end
from paddlecloud.wire import duration

OK = grpc.StatusCode.OK
UNAUTH = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED


async def job_keys(endpoint: str, job: str) -> dict[bytes, tuple[int, bytes]]:
    """Every key of the job with its mod revision and value: what 'nothing written' compares."""
    client = await connect(endpoint)
    try:
        prefix = JobKeys("local", job).prefix
        kvs, _ = await read_range(client, prefix, prefix_range_end(prefix))
        return {kv.key: (kv.mod_revision, kv.value) for kv in kvs}
    finally:
        await client.close()


class Secured:
    """A master with tokens, its stub, and two registered trainers (victim and attacker)."""

    def __init__(self, master, tokens: JobTokens, other: JobTokens, channel: grpc.aio.Channel) -> None:
        self.proc = master
        self.tokens = tokens
        self.other = other
        self.stub = stub(channel)
        self.sessions: dict[str, tuple[int, str]] = {}

    async def register(self, trainer: str) -> tuple[int, str]:
        reply = await self.stub.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id=trainer),
                                                metadata=auth_metadata(self.tokens.trainer))
        assert reply.session_token.startswith("s.")
        self.sessions[trainer] = (reply.session_id, reply.session_token)
        return self.sessions[trainer]


@pytest.fixture
async def secured(tmp_path, start_master):
    write_records(tmp_path / "data", files=4, records_per_file=3)
    tokens = JobTokens.generate()
    tokens.write(tmp_path / "tokens")
    other = JobTokens.generate()  # another job's tokens
    proc = start_master("--input", str(tmp_path / "data"), "--epochs", "2",
                        "--tokens-dir", str(tmp_path / "tokens"))
    await wait_serving(proc.address, process=proc)
    async with grpc.aio.insecure_channel(proc.address) as channel:
        s = Secured(proc, tokens, other, channel)
        await s.register("victim")
        await s.register("attacker")
        yield s


async def code_of(call) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code()
    return OK


def test_token_files_are_private(tmp_path):
    directory = JobTokens.generate().write(tmp_path / "tokens")
    assert oct(directory.stat().st_mode & 0o777) == "0o700"
    for name in ("trainer", "operator", "viewer"):
        assert oct((directory / name).stat().st_mode & 0o777) == "0o600"
    assert JobTokens.load(directory).trainer == (directory / "trainer").read_text().strip()


async def test_authorization_matrix(secured, etcd_endpoint, job_name):
    s = secured
    victim, victim_token = s.sessions["victim"]
    _, attacker_token = s.sessions["attacker"]
    task = (await s.stub.GetTask(pb.GetTaskRequest(session_id=victim, epoch=0),
                                 metadata=auth_metadata(victim_token))).task
    report = pb.TaskReport(session_id=victim, task_id=task.id, epoch=task.epoch, attempt=task.attempt,
                           reason="bad")
    session_rpcs = {
        "KeepAlive": lambda: s.stub.KeepAlive(pb.KeepAliveRequest(session_id=victim), metadata=m),
        "GetTask": lambda: s.stub.GetTask(pb.GetTaskRequest(session_id=victim, epoch=0), metadata=m),
        "TaskFinished": lambda: s.stub.TaskFinished(report, metadata=m),
        "TaskFailed": lambda: s.stub.TaskFailed(report, metadata=m),
        "ReturnTask": lambda: s.stub.ReturnTask(report, metadata=m),
        "RequestSaveModel": lambda: s.stub.RequestSaveModel(
            pb.RequestSaveModelRequest(session_id=victim, block=duration(1)), metadata=m),
        "LeaveTrainer": lambda: s.stub.LeaveTrainer(pb.LeaveTrainerRequest(session_id=victim), metadata=m),
    }
    other_rpcs = {
        "RegisterTrainer": lambda: s.stub.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="newcomer"),
                                                          metadata=m),
        "GetStatus": lambda: s.stub.GetStatus(pb.GetStatusRequest(), metadata=m),
        "ListTasks": lambda: s.stub.ListTasks(pb.ListTasksRequest(), metadata=m),
        "ListTrainers": lambda: s.stub.ListTrainers(pb.ListTrainersRequest(), metadata=m),
        "SetDataset": lambda: s.stub.SetDataset(pb.SetDatasetRequest(
            dataset=pb.DatasetSpec(paths=["/etc/*.conf"])), metadata=m),
        "RestartEpoch": lambda: s.stub.RestartEpoch(pb.RestartEpochRequest(epoch=0), metadata=m),
    }
    # who -> the token it presents; "own" is the victim's session token for session RPCs,
    # the job's trainer token for the others
    who = {"none": None, "other job": s.other.operator, "other session": attacker_token,
           "operator": s.tokens.operator}
    expected_denied = {  # every refusal, which must change nothing
        **{(rpc, "none"): UNAUTH for rpc in [*session_rpcs, *other_rpcs]},
        **{(rpc, "other job"): UNAUTH for rpc in [*session_rpcs, *other_rpcs]},
        **{(rpc, "other session"): DENIED for rpc in session_rpcs},
        **{(rpc, "operator"): DENIED for rpc in session_rpcs},
        ("RegisterTrainer", "other session"): DENIED,
        ("SetDataset", "other session"): DENIED,
        ("RestartEpoch", "other session"): DENIED,
        ("SetDataset", "own"): DENIED,
        ("RestartEpoch", "own"): DENIED,
    }
    before = await job_keys(etcd_endpoint, job_name)
    for (rpc, caller), code in expected_denied.items():
        token = s.tokens.trainer if caller == "own" else who[caller]
        m = auth_metadata(token)
        call = session_rpcs.get(rpc) or other_rpcs[rpc]
        assert await code_of(call()) == code, (rpc, caller)
    assert await job_keys(etcd_endpoint, job_name) == before  # no refusal wrote anything

    # what may be done: reads by every token of the job, the victim's own calls, the operator's
    for token in (attacker_token, s.tokens.trainer, s.tokens.viewer, s.tokens.operator):
        m = auth_metadata(token)
        for rpc in ("GetStatus", "ListTasks", "ListTrainers"):
            assert await code_of(other_rpcs[rpc]()) == OK, rpc
    m = auth_metadata(s.tokens.operator)
    assert await code_of(other_rpcs["RegisterTrainer"]()) == OK
    assert await code_of(other_rpcs["SetDataset"]()) == grpc.StatusCode.FAILED_PRECONDITION  # off: see below
    m = auth_metadata(victim_token)
    for rpc in ("KeepAlive", "RequestSaveModel", "TaskFinished", "LeaveTrainer"):
        assert await code_of(session_rpcs[rpc]()) == OK, rpc
    m = auth_metadata(s.tokens.operator)
    assert await code_of(other_rpcs["RestartEpoch"]()) == OK


async def test_forged_finish_is_denied_and_changes_nothing(secured, etcd_endpoint, job_name):
    s = secured
    victim, victim_token = s.sessions["victim"]
    attacker, attacker_token = s.sessions["attacker"]
    task = (await s.stub.GetTask(pb.GetTaskRequest(session_id=victim, epoch=0),
                                 metadata=auth_metadata(victim_token))).task
    # The attacker reads the victim's session and attempt where the operator could...
    listed = await s.stub.ListTasks(pb.ListTasksRequest(state=pb.PENDING),
                                    metadata=auth_metadata(s.tokens.operator))
    assert [(t.id, t.session_id, t.attempt) for t in listed.tasks] == [(task.id, victim, task.attempt)]
    # ... but a trainer or viewer is shown neither
    for token in (attacker_token, s.tokens.viewer, s.tokens.trainer):
        seen = await s.stub.ListTasks(pb.ListTasksRequest(state=pb.PENDING), metadata=auth_metadata(token))
        assert [(t.id, t.holder, t.session_id, t.attempt) for t in seen.tasks] == [(task.id, "victim", 0, 0)]
        trainers = await s.stub.ListTrainers(pb.ListTrainersRequest(), metadata=auth_metadata(token))
        assert {t.session_id for t in trainers.trainers} == {0}
    forged = pb.TaskReport(session_id=victim, task_id=task.id, epoch=task.epoch, attempt=task.attempt)
    before = await job_keys(etcd_endpoint, job_name)
    for token in (attacker_token, s.tokens.trainer, s.tokens.viewer):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await s.stub.TaskFinished(forged, metadata=auth_metadata(token))
        assert error.value.code() == DENIED
    # a session token made up for the victim's session is no token at all
    guessed = f"s.{victim}.{'0' * 64}"
    assert await code_of(s.stub.TaskFinished(forged, metadata=auth_metadata(guessed))) == UNAUTH
    assert await job_keys(etcd_endpoint, job_name) == before
    done = JobKeys("local", job_name).done(0, task.id)
    assert done not in before
    status = await s.stub.GetStatus(pb.GetStatusRequest(), metadata=auth_metadata(s.tokens.viewer))
    assert (status.counts.done, status.counts.pending) == (0, 1)
    # the victim's own finish counts
    reply = await s.stub.TaskFinished(forged, metadata=auth_metadata(victim_token))
    assert reply.result == pb.ACCEPTED
    assert done in await job_keys(etcd_endpoint, job_name)


async def test_health_and_reflection_stay_open(secured):
    async with grpc.aio.insecure_channel(secured.proc.address) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo()
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        reply = await call.read()
        await call.done_writing()
        names = {s.name for s in reply.list_services_response.service}
        assert "paddlecloud.master.v1.Master" in names


async def test_master_off_loopback_without_tokens_refuses_to_start(tmp_path, etcd_endpoint, job_name):
    from masters import MasterProcess

    proc = MasterProcess(job=job_name, etcd=etcd_endpoint, tmp=tmp_path)
    command = [a if a != "127.0.0.1" else "0.0.0.0" for a in proc.command()]
    process = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    assert "--host 0.0.0.0 without --tokens-dir" in err.decode() and "--insecure" in err.decode()


async def test_open_master_says_so_at_start(tmp_path, start_master):
    proc = start_master()
    await wait_serving(proc.address, process=proc)
    assert "INSECURE: no --tokens-dir" in proc.log()


def test_job_token_of_the_file_is_what_the_client_sends(tmp_path, monkeypatch):
    from paddlecloud.auth import ClientCredentials

    tokens = JobTokens.generate()
    tokens.write(tmp_path / "tokens")
    monkeypatch.setenv("PADDLE_JOB_TOKEN_FILE", str(Path(tmp_path / "tokens" / "trainer")))
    assert ClientCredentials.from_env().metadata() == (("authorization", f"Bearer {tokens.trainer}"),)
