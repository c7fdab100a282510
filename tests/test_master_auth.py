"""Who may call what on a master with tokens: the authorization matrix, the forged finish, and
the cluster autoscaler's scaler token (GetStatus and ScaleTrainers, nothing else).

Real master processes over real gRPC, a real etcd; the tokens are the job's files.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Awaitable
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from cryptography import x509
from datasets import write_records
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from masters import pb, stub, wait_serving
from waiting import wait_for

from master.authorization import denial
from master.cli import credentials_command
from paddlecloud.api import pb_grpc
from paddlecloud.auth import (
    JOB_ROLES,
    JobTokens,
    Principal,
    Role,
    auth_metadata,
    scaler_token,
    scaler_token_namespace,
)
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
    """A master with tokens (and a scaler token file), its stub, and two registered trainers
    (victim and attacker)."""

    def __init__(self, master, tokens: JobTokens, other: JobTokens, channel: grpc.aio.Channel, *,
                 scaler: str) -> None:
        self.proc = master
        self.tokens = tokens
        self.other = other
        self.scaler = scaler
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
    # the cluster autoscaler's for this namespace, as the Secret paddlecloud-scaler holds it
    scaler = scaler_token(secrets.token_urlsafe(32), "local")
    (tmp_path / "scaler").write_text(scaler + "\n")
    proc = start_master("--input", str(tmp_path / "data"), "--epochs", "2",
                        "--tokens-dir", str(tmp_path / "tokens"), "--scaler-token-file", str(tmp_path / "scaler"),
                        "--trainers", "2", "--min-trainers", "1", "--max-trainers", "4")
    await wait_serving(proc.address, process=proc)
    async with grpc.aio.insecure_channel(proc.address) as channel:
        s = Secured(proc, tokens, other, channel, scaler=scaler)
        await s.register("victim")
        await s.register("attacker")
        yield s


async def code_of(call) -> grpc.StatusCode:
    try:
        await call
    except grpc.RpcError as error:  # grpc.aio's, or the sync stack's (a stream: `over_stream`)
        return error.code()
    return OK


@pytest.mark.unit
def test_token_files_are_private(tmp_path):
    directory = JobTokens.generate().write(tmp_path / "tokens")
    assert oct(directory.stat().st_mode & 0o777) == "0o700"
    for name in ("trainer", "operator", "viewer"):
        assert oct((directory / name).stat().st_mode & 0o777) == "0o600"
    assert JobTokens.load(directory).trainer == (directory / "trainer").read_text().strip()


@pytest.mark.unit
@pytest.mark.parametrize("host", ["bad host!", "", "a..b", "-edge.example", "x" * 300])
def test_credentials_refuse_a_tls_host_that_is_no_host_writing_nothing(tmp_path, host):
    result = CliRunner().invoke(credentials_command, [str(tmp_path / "creds"), "--tls-host", "127.0.0.1",
                                                      "--tls-host", host])
    assert result.exit_code == 2, result.output
    assert f"host {host[:64]!r} is neither an IP address nor a DNS name" in result.output
    assert not (tmp_path / "creds").exists()


@pytest.mark.unit
def test_credentials_in_a_place_that_cannot_be_written_say_where(tmp_path):
    (tmp_path / "file").write_text("not a directory\n")
    result = CliRunner().invoke(credentials_command, [str(tmp_path / "file" / "creds")])
    assert result.exit_code == 1, result.output  # a ClickException: no traceback
    assert f"cannot write the credentials into {tmp_path / 'file' / 'creds'}: Not a directory" in result.output


@pytest.mark.unit
@pytest.mark.parametrize("hosts", [("10.1.2.3", "::1"), ("master.ns.svc.cluster.local", "*.ns.svc", "localhost")])
def test_credentials_mint_a_certificate_naming_each_host(tmp_path, hosts):
    result = CliRunner().invoke(credentials_command, [str(tmp_path), *(a for h in hosts for a in ("--tls-host", h))])
    assert result.exit_code == 0, result.output
    cert = x509.load_pem_x509_certificates((tmp_path / "master.crt").read_bytes())[0]
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(str(n.value) for n in names) == sorted(hosts)


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
        "ScaleTrainers": lambda: s.stub.ScaleTrainers(pb.ScaleTrainersRequest(trainers=3), metadata=m),
        "EvictTrainer": lambda: s.stub.EvictTrainer(pb.EvictTrainerRequest(trainer_id="attacker"), metadata=m),
    }
    # who -> the token it presents; "own" is the victim's session token for session RPCs,
    # the job's trainer token for the others; "scaler" the cluster autoscaler's token
    who = {"none": None, "other job": s.other.operator, "other session": attacker_token,
           "operator": s.tokens.operator, "viewer": s.tokens.viewer, "scaler": s.scaler}
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
        ("ScaleTrainers", "other session"): DENIED,
        ("ScaleTrainers", "own"): DENIED,
        **{(rpc, "viewer"): DENIED for rpc in ("SetDataset", "RestartEpoch", "ScaleTrainers", "EvictTrainer")},
        ("EvictTrainer", "other session"): DENIED,
        ("EvictTrainer", "own"): DENIED,
        # the scaler: GetStatus and ScaleTrainers only (below), no listing, no session, no restart
        **{(rpc, "scaler"): DENIED for rpc in [*session_rpcs, *other_rpcs]
           if rpc not in ("GetStatus", "ScaleTrainers")},
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
    assert await code_of(other_rpcs["ScaleTrainers"]()) == OK
    m = auth_metadata(s.scaler)
    for rpc in ("GetStatus", "ScaleTrainers"):
        assert await code_of(other_rpcs[rpc]()) == OK, rpc
    m = auth_metadata(s.tokens.operator)
    assert await code_of(other_rpcs["EvictTrainer"]()) == OK  # the attacker's session ends
    attacker, _ = s.sessions["attacker"]
    assert await code_of(s.stub.KeepAlive(pb.KeepAliveRequest(session_id=attacker),
                                          metadata=auth_metadata(attacker_token))) == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.unit
def test_the_scaler_token_is_denied_every_master_rpc_but_getstatus_and_scaletrainers():
    """Over the Master service as it is (an RPC added later is the operator's, not the scaler's)."""
    rpcs = {method.name for method in pb.DESCRIPTOR.services_by_name["Master"].methods}
    allowed = {rpc for rpc in rpcs if denial(rpc, Principal(Role.SCALER)) is None}
    assert allowed == {"GetStatus", "ScaleTrainers"}
    assert "is not for the scaler token" in denial("ListTrainers", Principal(Role.SCALER))
    assert "operator" in denial("ScaleTrainers", Principal(Role.VIEWER))


@pytest.mark.unit
def test_a_session_token_has_one_spelling():
    """Leading zeros (or other digits than ASCII's) name the same session but are not its token."""
    from paddlecloud.auth import TokenRoles

    roles = TokenRoles(JobTokens.generate(), job="j")
    token = roles.session_token(42)
    assert roles.principal_of(token) == Principal(Role.TRAINER, session=42)
    prefix, mac = token.rsplit(".", 1)
    for spelling in ("042", "0042", "\u0664\u0662"):  # the last: Arabic-Indic 4 and 2
        assert roles.principal_of(f"s.{spelling}.{mac}") is None, spelling


@pytest.mark.unit
def test_a_scaler_token_is_not_one_of_a_jobs_tokens(tmp_path):
    tokens = JobTokens.generate()
    assert set(tokens.as_mapping()) == {"trainer", "operator", "viewer"} == {r.value for r in JOB_ROLES}
    directory = tokens.write(tmp_path / "tokens")
    assert sorted(p.name for p in directory.iterdir()) == ["operator", "trainer", "viewer"]
    assert JobTokens.load(directory) == tokens


async def test_the_scaler_token_scales_a_real_master_through_the_jobs_scale_path(
        secured, etcd_endpoint, job_name, monkeypatch):
    """`paddlecloud.backends.k8s.jobs.scale_trainers` (the autoscaler's call) with the scaler token: the
    size is written to etcd; the same call with another token changes nothing."""
    from paddlecloud.backends.k8s.jobs import fetch_master_status, scale_trainers

    for name in ("PADDLE_JOB_TOKEN_FILE", "PADDLE_MASTER_CA_FILE"):  # the token given is the one sent
        monkeypatch.delenv(name, raising=False)
    s = secured
    desired = JobKeys("local", job_name).trainers_desired
    reply = await asyncio.to_thread(scale_trainers, s.proc.address, 3, timeout=10, token=s.scaler)
    assert (reply.min_trainers, reply.max_trainers, reply.desired_trainers) == (1, 4, 3)
    assert (await job_keys(etcd_endpoint, job_name))[desired][1] == b"3"
    status = await asyncio.to_thread(fetch_master_status, s.proc.address, timeout=10, token=s.scaler)
    assert (status.min_trainers, status.max_trainers, status.desired_trainers) == (1, 4, 3)
    before = await job_keys(etcd_endpoint, job_name)
    for token, code in ((secrets.token_urlsafe(32), UNAUTH), (s.other.operator, UNAUTH),
                        (s.tokens.viewer, DENIED), (s.tokens.trainer, DENIED)):
        with pytest.raises(grpc.RpcError) as refused:
            await asyncio.to_thread(scale_trainers, s.proc.address, 2, timeout=10, token=token)
        assert refused.value.code() == code
    assert await job_keys(etcd_endpoint, job_name) == before


async def test_a_scaler_token_file_is_read_when_it_appears_and_when_it_changes(tmp_path, start_master):
    """On Kubernetes the Secret may be made after the job started, and rotated: the master
    re-reads the file when it changes, and says once (not per call) that it has none."""
    JobTokens.generate().write(tmp_path / "tokens")
    path = tmp_path / "scaler" / "token"  # the optional Secret's mount: empty until it exists
    proc = start_master("--tokens-dir", str(tmp_path / "tokens"), "--scaler-token-file", str(path),
                        "--trainers", "2", "--min-trainers", "1", "--max-trainers", "4")
    await wait_serving(proc.address, process=proc)
    first, second = (scaler_token(secrets.token_urlsafe(32), "local") for _ in range(2))

    def scale(token: str, trainers: int):
        return s.ScaleTrainers(pb.ScaleTrainersRequest(trainers=trainers), metadata=auth_metadata(token))

    async with grpc.aio.insecure_channel(proc.address) as channel:
        s = stub(channel)
        for _ in range(3):
            assert await code_of(scale(first, 3)) == UNAUTH
        assert proc.log().count(f"no scaler token in {path} (absent)") == 1
        path.parent.mkdir()
        path.write_text(first + "\n")
        assert (await scale(first, 3)).desired_trainers == 3
        await wait_for(lambda: f"scaler token read from {path}" in proc.log(), message="the read said")
        staged = path.with_name("..new")  # rotated as the kubelet does: a new file renamed over it
        staged.write_text(second)
        os.replace(staged, path)
        assert await code_of(scale(first, 2)) == UNAUTH
        assert (await scale(second, 2)).desired_trainers == 2
        path.write_text("")
        assert await code_of(scale(second, 1)) == UNAUTH
        await wait_for(lambda: f"no scaler token in {path} (empty)" in proc.log(), message="the empty file said")
    assert proc.log().count(f"no scaler token in {path} (absent)") == 1


async def test_a_scaler_token_of_another_namespace_is_refused(tmp_path, start_master):
    """One namespace's scaler token (readable by its tenants) moves no job of another: a master
    of team-b refuses team-a's token, even when its own Secret holds it by mistake."""
    JobTokens.generate().write(tmp_path / "tokens")
    key = secrets.token_urlsafe(32)
    token_a, token_b = scaler_token(key, "team-a"), scaler_token(key, "team-b")
    path = tmp_path / "scaler"
    path.write_text(token_a)  # copied from team-a's Secret
    proc = start_master("--namespace", "team-b", "--tokens-dir", str(tmp_path / "tokens"),
                        "--scaler-token-file", str(path), "--trainers", "2", "--min-trainers", "1",
                        "--max-trainers", "4")
    await wait_serving(proc.address, process=proc)

    def scale(token: str, trainers: int):
        return s.ScaleTrainers(pb.ScaleTrainersRequest(trainers=trainers), metadata=auth_metadata(token))

    async with grpc.aio.insecure_channel(proc.address) as channel:
        s = stub(channel)
        for token in (token_a, token_b):
            assert await code_of(scale(token, 3)) == UNAUTH
            assert await code_of(s.GetStatus(pb.GetStatusRequest(), metadata=auth_metadata(token))) == UNAUTH
        assert proc.log().count("its token is for namespace team-a, not team-b") == 1
        path.write_text(token_b)  # the admin puts team-b's own token in
        assert (await scale(token_b, 3)).desired_trainers == 3
        assert await code_of(scale(token_a, 2)) == UNAUTH
        path.write_text(secrets.token_urlsafe(32))  # a token of the old kind names no namespace
        assert await code_of(scale(token_b, 2)) == UNAUTH
        await wait_for(lambda: "its token names no namespace" in proc.log(), message="the bare token said")


@pytest.mark.unit
def test_a_scaler_token_names_its_namespace_and_depends_on_the_key():
    assert scaler_token_namespace(scaler_token("k", "team-a")) == "team-a"
    assert scaler_token("k", "team-a") != scaler_token("other-key", "team-a")
    assert scaler_token("k", "team-a") != scaler_token("k", "team-b")
    for bare in ("", "abc", "scaler.", "scaler.team-a", "scaler..mac"):
        assert scaler_token_namespace(bare) is None, bare


@pytest.mark.unit
def test_a_scaler_token_file_without_tokens_is_a_usage_error():
    from click.testing import CliRunner

    from paddlecloud.cli.main import main

    result = CliRunner().invoke(main, ["master", "--job", "j", "--etcd-endpoints", "http://127.0.0.1:1",
                                       "--scaler-token-file", "/run/scaler/token"])
    assert result.exit_code == 2
    assert "--scaler-token-file /run/scaler/token needs --tokens-dir" in result.output


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


async def test_open_master_says_so_and_names_its_event_loop_at_start(tmp_path, start_master):
    proc = start_master()
    await wait_serving(proc.address, process=proc)
    assert "INSECURE: no --tokens-dir" in proc.log()
    assert "event loop: uvloop)" in proc.log()  # the master's loop (paddlecloud.aio.run)


@pytest.mark.unit
def test_job_token_of_the_file_is_what_the_client_sends(tmp_path, monkeypatch):
    from paddlecloud.auth import ClientCredentials

    tokens = JobTokens.generate()
    tokens.write(tmp_path / "tokens")
    monkeypatch.setenv("PADDLE_JOB_TOKEN_FILE", str(Path(tmp_path / "tokens" / "trainer")))
    assert ClientCredentials.from_env().metadata() == (("authorization", f"Bearer {tokens.trainer}"),)


async def test_every_session_rpc_takes_the_token_of_its_own_session_only(secured, etcd_endpoint, job_name):
    """For each RPC that names a session (master.authorization.SESSION_RPCS): the job's shared
    trainer token and the token of another session of the job are PERMISSION_DENIED and
    change nothing; the session's own token is served."""
    from master.authorization import SESSION_RPCS

    s = secured
    victim, victim_token = s.sessions["victim"]
    _, attacker_token = s.sessions["attacker"]

    def over_stream(metadata) -> Awaitable[pb.GetTaskResponse]:
        # gRPC's sync stack, as trainer_agent streams: a master that refuses a token at once
        # ends the call while grpc.aio's client may still be writing its first request, and
        # that write then reports INTERNAL ("Internal error from Core") instead of the status.
        def first_reply() -> pb.GetTaskResponse:
            with grpc.insecure_channel(s.proc.address) as channel:
                replies = pb_grpc.MasterStub(channel).GetTaskStream(
                    iter([pb.GetTaskRequest(session_id=victim, epoch=0)]), metadata=metadata)
                return next(replies)
        return asyncio.to_thread(first_reply)

    def calls(metadata, task: pb.Task) -> dict:
        report = pb.TaskReport(session_id=victim, task_id=task.id, epoch=task.epoch, attempt=task.attempt,
                               reason="bad")
        return {
            "KeepAlive": lambda: s.stub.KeepAlive(pb.KeepAliveRequest(session_id=victim), metadata=metadata),
            "GetTask": lambda: s.stub.GetTask(pb.GetTaskRequest(session_id=victim, epoch=0), metadata=metadata),
            "GetTaskStream": lambda: over_stream(metadata),
            "RequestSaveModel": lambda: s.stub.RequestSaveModel(
                pb.RequestSaveModelRequest(session_id=victim, block=duration(1)), metadata=metadata),
            "ReturnTask": lambda: s.stub.ReturnTask(report, metadata=metadata),
            "TaskFailed": lambda: s.stub.TaskFailed(report, metadata=metadata),
            "TaskFinished": lambda: s.stub.TaskFinished(report, metadata=metadata),
            "LeaveTrainer": lambda: s.stub.LeaveTrainer(pb.LeaveTrainerRequest(session_id=victim),
                                                        metadata=metadata),
            "SplitTask": lambda: s.stub.SplitTask(pb.SplitTaskRequest(
                session_id=victim, task_id=task.id, epoch=task.epoch, attempt=task.attempt, position=0),
                metadata=metadata),
        }

    own = auth_metadata(victim_token)
    held = (await s.stub.GetTask(pb.GetTaskRequest(session_id=victim, epoch=0), metadata=own)).task
    assert set(calls(own, held)) == set(SESSION_RPCS)  # a session RPC added later is added here
    before = await job_keys(etcd_endpoint, job_name)
    for name, token in (("the shared trainer token", s.tokens.trainer), ("another session's token", attacker_token)):
        for rpc, call in calls(auth_metadata(token), held).items():
            assert await code_of(call()) == DENIED, (rpc, name)
    assert await job_keys(etcd_endpoint, job_name) == before

    # the own token, for each RPC, on a task the session holds where it names one
    served: dict[str, grpc.StatusCode] = {}
    task = held
    for rpc in ("KeepAlive", "RequestSaveModel", "SplitTask", "ReturnTask", "GetTask", "TaskFailed",
                "GetTaskStream", "TaskFinished", "LeaveTrainer"):
        call = calls(own, task)[rpc]
        if rpc in ("GetTask", "GetTaskStream"):
            reply = await call()
            assert reply.HasField("task"), reply
            task, served[rpc] = reply.task, OK
        else:
            served[rpc] = await code_of(call())
    assert served == {rpc: OK for rpc in SESSION_RPCS}
    status = await s.stub.GetStatus(pb.GetStatusRequest(), metadata=auth_metadata(s.tokens.viewer))
    assert status.counts.done == 1


async def test_a_task_stream_checks_every_request_not_only_the_first(secured, etcd_endpoint, job_name):
    """A stream opened with a session's own token serves that session; a later request on the
    same stream for another session is PERMISSION_DENIED, ends the stream and changes nothing."""
    s = secured
    victim, _ = s.sessions["victim"]
    attacker, attacker_token = s.sessions["attacker"]
    call = s.stub.GetTaskStream(metadata=auth_metadata(attacker_token))
    await call.write(pb.GetTaskRequest(session_id=attacker, epoch=0))
    assert (await call.read()).HasField("task")
    before = await job_keys(etcd_endpoint, job_name)
    await call.write(pb.GetTaskRequest(session_id=victim, epoch=0))
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await call.read()
    assert denied.value.code() == DENIED
    assert f"session '{victim}' is not the session of this token" in denied.value.details()
    assert await job_keys(etcd_endpoint, job_name) == before
