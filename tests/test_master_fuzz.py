"""A bounded fuzz of a master with tokens: a few hundred hypothesis-drawn requests over every
RPC of the Master service (the list comes from its descriptor, so an RPC added later is
fuzzed or this test fails), with and without valid tokens, the scaler token among them.
No INTERNAL or UNKNOWN ever; todo + pending + done + failed equals the task count after
every request; the master still serves at the end. Before the drawn requests, one explicit
example per RPC and token kind: every pair is tried in every run, whatever hypothesis draws.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from datasets import write_records
from google.protobuf.duration_pb2 import Duration
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from masters import MasterProcess, pb, wait_until

from paddlecloud.api import pb_grpc
from paddlecloud.auth import JobTokens, auth_metadata, scaler_token

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
SMALL = st.integers(-2, 12)
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["t0", "t1", "-1", "0", "1", "a" * 300, "\n\x00\x1b"]))
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
RPCS = tuple(method.name for method in pb.DESCRIPTOR.services_by_name["Master"].methods)
SCALER = scaler_token("the-autoscalers-key", "local")  # what --scaler-token-file holds
TOKEN_KINDS = 8  # the choices of Fuzzed.metadata


class Fuzzed:
    def __init__(self, stub: pb_grpc.MasterStub, tokens: JobTokens) -> None:
        self.stub = stub
        self.tokens = tokens
        self.sessions: list[tuple[int, str]] = []  # (id, token) of every registration seen
        self.num_tasks = 0

    def metadata(self, pick: int, session_token: str | None):
        choices = [None, self.tokens.trainer, self.tokens.operator, self.tokens.viewer, SCALER, "garbage",
                   session_token, "s.1.00"]
        assert len(choices) == TOKEN_KINDS
        return auth_metadata(choices[pick % len(choices)])

    def counts_add_up(self) -> None:
        status = self.stub.GetStatus(pb.GetStatusRequest(), metadata=auth_metadata(self.tokens.viewer),
                                     timeout=10)
        c = status.counts
        assert c.todo + c.pending + c.done + c.failed == status.num_tasks == self.num_tasks, status


def calls_of(s: pb_grpc.MasterStub, m, *, session: int, task: int, epoch: int, attempt: int, text: str,
             block: Duration, page_size: int) -> dict[str, Callable[[], object]]:
    """rpc name -> a call of it with these drawn values; one entry per RPC of the service."""
    report = pb.TaskReport(session_id=session, task_id=task, epoch=epoch, attempt=attempt, reason=text)
    return {
        "RegisterTrainer": lambda: s.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id=text), metadata=m),
        "KeepAlive": lambda: s.KeepAlive(pb.KeepAliveRequest(session_id=session), metadata=m),
        "LeaveTrainer": lambda: s.LeaveTrainer(pb.LeaveTrainerRequest(session_id=session), metadata=m),
        "GetTask": lambda: s.GetTask(pb.GetTaskRequest(
            session_id=session, epoch=epoch, finished=[pb.TaskRef(task_id=task, epoch=epoch, attempt=attempt)]),
            metadata=m),
        # the drawn request, then one of another session on the same stream
        "GetTaskStream": lambda: list(s.GetTaskStream(iter([
            pb.GetTaskRequest(session_id=session, epoch=epoch, max_tasks=abs(page_size),
                              finished=[pb.TaskRef(task_id=task, epoch=epoch, attempt=attempt)]),
            pb.GetTaskRequest(session_id=session + 1 if session < 2**63 - 1 else 0, epoch=epoch)]),
            metadata=m, timeout=30)),
        "TaskFinished": lambda: s.TaskFinished(report, metadata=m),
        "TaskFailed": lambda: s.TaskFailed(report, metadata=m),
        "ReturnTask": lambda: s.ReturnTask(report, metadata=m),
        "SetDataset": lambda: s.SetDataset(pb.SetDatasetRequest(dataset=pb.DatasetSpec(
            paths=[text], chunk_bytes=page_size)), metadata=m),
        "RestartEpoch": lambda: s.RestartEpoch(pb.RestartEpochRequest(epoch=epoch), metadata=m),
        "GetStatus": lambda: s.GetStatus(pb.GetStatusRequest(), metadata=m),
        "ListTasks": lambda: s.ListTasks(pb.ListTasksRequest(
            state=page_size % 6, page_size=page_size, page_token=text), metadata=m),
        "ListTrainers": lambda: s.ListTrainers(pb.ListTrainersRequest(page_size=page_size, page_token=text),
                                               metadata=m),
        "RequestSaveModel": lambda: s.RequestSaveModel(pb.RequestSaveModelRequest(
            session_id=session, block=block), metadata=m),
        # within the master's range, outside it, and any int32
        "ScaleTrainers": lambda: s.ScaleTrainers(pb.ScaleTrainersRequest(trainers=epoch), metadata=m),
        "EvictTrainer": lambda: s.EvictTrainer(pb.EvictTrainerRequest(trainer_id=text), metadata=m),
        "SplitTask": lambda: s.SplitTask(pb.SplitTaskRequest(
            session_id=session, task_id=task, epoch=epoch, attempt=attempt, position=page_size), metadata=m),
    }


def test_every_rpc_of_the_service_is_fuzzed():
    assert len(RPCS) >= 15 and {"ScaleTrainers", "GetTaskStream"} <= set(RPCS)
    drawn = dict(session=0, task=0, epoch=0, attempt=0, text="", block=Duration(), page_size=0)
    assert sorted(calls_of(None, (), **drawn)) == sorted(RPCS)


@dataclass(frozen=True)
class Request:
    """One drawn request: the RPC, whose token (`pick`), which session, and the fields' values."""

    rpc: str
    pick: int = 0
    known: int = 0
    raw_session: int = 0
    use_known: bool = True
    task: int = 0
    epoch: int = 2  # ScaleTrainers: within the range 1-4
    attempt: int = 0
    text: str = "t0"
    block: Duration = field(default_factory=lambda: Duration(seconds=1))
    page_size: int = 3

    def call(self, f: Fuzzed):
        session, token = (f.sessions[self.known % len(f.sessions)] if f.sessions and self.use_known
                          else (self.raw_session, None))
        calls = calls_of(f.stub, f.metadata(self.pick, token), session=session, task=self.task, epoch=self.epoch,
                         attempt=self.attempt, text=self.text, block=self.block, page_size=self.page_size)
        reply = calls[self.rpc]()
        if self.rpc == "RegisterTrainer" and reply.session_token:
            f.sessions.append((reply.session_id, reply.session_token))
        return reply


@st.composite
def requests(draw) -> Request:
    return Request(
        rpc=draw(st.sampled_from(RPCS)), pick=draw(st.integers(0, 20)), known=draw(st.integers(0, 50)),
        raw_session=draw(st.one_of(INT64, st.just(0))), use_known=draw(st.booleans()),
        task=draw(SMALL), epoch=draw(st.one_of(SMALL, INT32)), attempt=draw(st.one_of(SMALL, INT64)),
        text=draw(TEXT),
        block=Duration(seconds=draw(st.integers(-10, 10**12)), nanos=draw(st.integers(0, 999_999_999))),
        page_size=draw(st.one_of(SMALL, INT32)))


def every_rpc_with_every_token(test):
    """One explicit example per (RPC, token kind), run before the drawn ones."""
    for rpc in reversed(RPCS):
        for pick in reversed(range(TOKEN_KINDS)):
            test = example(Request(rpc, pick=pick))(test)
    return test


def test_fuzzed_requests_never_break_the_master(tmp_path, etcd_endpoint, job_name):
    write_records(tmp_path / "data", files=3, records_per_file=40)
    tokens = JobTokens.generate()
    tokens.write(tmp_path / "tokens")
    (tmp_path / "scaler").write_text(SCALER + "\n")
    proc = MasterProcess(job=job_name, etcd=etcd_endpoint, tmp=tmp_path, args=(
        "--input", str(tmp_path / "data"), "--epochs", "3", "--chunk-bytes", "100",
        "--tokens-dir", str(tmp_path / "tokens"), "--max-task-failures", "1",
        "--scaler-token-file", str(tmp_path / "scaler"),
        "--trainers", "2", "--min-trainers", "1", "--max-trainers", "4")).start()
    try:
        with grpc.insecure_channel(proc.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)

            def serving() -> bool:
                try:
                    return health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1
                except grpc.RpcError:
                    return False
            wait_until(serving, timeout=60, details=proc.log)
            fuzzed = Fuzzed(pb_grpc.MasterStub(channel), tokens)
            fuzzed.num_tasks = fuzzed.stub.GetStatus(pb.GetStatusRequest(),
                                                     metadata=auth_metadata(tokens.viewer)).num_tasks
            assert fuzzed.num_tasks > 3

            # 200 drawn + 120 explicit (15 RPCs x 8 token kinds): about the 300 calls of before
            @settings(max_examples=200, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
            @every_rpc_with_every_token
            @given(requests())
            def one_request(request: Request) -> None:
                tried.add((request.rpc, request.pick % TOKEN_KINDS))
                try:
                    request.call(fuzzed)
                except grpc.RpcError as error:
                    assert error.code() not in BAD, (request, error.code(), error.details())
                fuzzed.counts_add_up()

            tried: set[tuple[str, int]] = set()
            one_request()
            assert {(rpc, pick) for rpc in RPCS for pick in range(TOKEN_KINDS)} <= tried
            assert serving(), proc.log()
            # the scaler token still works after the fuzz, and still resizes within the range only
            scaled = fuzzed.stub.ScaleTrainers(pb.ScaleTrainersRequest(trainers=3), metadata=auth_metadata(SCALER),
                                               timeout=10)
            assert (scaled.min_trainers, scaled.max_trainers, scaled.desired_trainers) == (1, 4, 3)
            try:
                fuzzed.stub.ScaleTrainers(pb.ScaleTrainersRequest(trainers=5), metadata=auth_metadata(SCALER),
                                          timeout=10)
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
            else:
                raise AssertionError("a size outside the range was accepted")
            assert "Traceback" not in proc.log()
    finally:
        proc.stop()
