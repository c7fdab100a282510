"""A bounded fuzz of a master with tokens: a few hundred hypothesis-drawn requests over every
RPC, with and without valid tokens. No INTERNAL or UNKNOWN ever; todo + pending + done +
failed equals the task count after every request; the master still serves at the end.
"""

from __future__ import annotations

import grpc
from datasets import write_records
from google.protobuf.duration_pb2 import Duration
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from masters import MasterProcess, pb, wait_until

from paddlecloud.api import pb_grpc
from paddlecloud.auth import JobTokens, auth_metadata

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
SMALL = st.integers(-2, 12)
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["t0", "t1", "-1", "0", "1", "a" * 300, "\n\x00\x1b"]))
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


class Fuzzed:
    def __init__(self, stub: pb_grpc.MasterStub, tokens: JobTokens) -> None:
        self.stub = stub
        self.tokens = tokens
        self.sessions: list[tuple[int, str]] = []  # (id, token) of every registration seen
        self.num_tasks = 0

    def metadata(self, pick: int, session_token: str | None):
        choices = [None, self.tokens.trainer, self.tokens.operator, self.tokens.viewer, "garbage",
                   session_token, "s.1.00"]
        return auth_metadata(choices[pick % len(choices)])

    def counts_add_up(self) -> None:
        status = self.stub.GetStatus(pb.GetStatusRequest(), metadata=auth_metadata(self.tokens.viewer),
                                     timeout=10)
        c = status.counts
        assert c.todo + c.pending + c.done + c.failed == status.num_tasks == self.num_tasks, status


@st.composite
def requests(draw):
    """(rpc name, a function of the fuzzed master that makes the request's call)."""
    rpc = draw(st.sampled_from(["RegisterTrainer", "KeepAlive", "LeaveTrainer", "GetTask", "TaskFinished",
                                "TaskFailed", "ReturnTask", "SetDataset", "RestartEpoch", "GetStatus",
                                "ListTasks", "ListTrainers", "RequestSaveModel"]))
    pick = draw(st.integers(0, 20))
    known = draw(st.integers(0, 50))
    raw_session = draw(st.one_of(INT64, st.just(0)))
    use_known = draw(st.booleans())
    task, epoch, attempt = draw(SMALL), draw(st.one_of(SMALL, INT32)), draw(st.one_of(SMALL, INT64))
    text = draw(TEXT)
    block = Duration(seconds=draw(st.integers(-10, 10**12)), nanos=draw(st.integers(0, 999_999_999)))
    page_size = draw(st.one_of(SMALL, INT32))

    def call(f: Fuzzed):
        session, token = (f.sessions[known % len(f.sessions)] if f.sessions and use_known
                          else (raw_session, None))
        m = f.metadata(pick, token)
        s = f.stub
        report = pb.TaskReport(session_id=session, task_id=task, epoch=epoch, attempt=attempt, reason=text)
        calls = {
            "RegisterTrainer": lambda: s.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id=text), metadata=m),
            "KeepAlive": lambda: s.KeepAlive(pb.KeepAliveRequest(session_id=session), metadata=m),
            "LeaveTrainer": lambda: s.LeaveTrainer(pb.LeaveTrainerRequest(session_id=session), metadata=m),
            "GetTask": lambda: s.GetTask(pb.GetTaskRequest(
                session_id=session, epoch=epoch, finished=[pb.TaskRef(task_id=task, epoch=epoch, attempt=attempt)]),
                metadata=m),
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
        }
        reply = calls[rpc]()
        if rpc == "RegisterTrainer" and reply.session_token:
            f.sessions.append((reply.session_id, reply.session_token))
        return reply

    return rpc, call


def test_fuzzed_requests_never_break_the_master(tmp_path, etcd_endpoint, job_name):
    write_records(tmp_path / "data", files=3, records_per_file=40)
    tokens = JobTokens.generate()
    tokens.write(tmp_path / "tokens")
    proc = MasterProcess(job=job_name, etcd=etcd_endpoint, tmp=tmp_path, args=(
        "--input", str(tmp_path / "data"), "--epochs", "3", "--chunk-bytes", "100",
        "--tokens-dir", str(tmp_path / "tokens"), "--max-task-failures", "1")).start()
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

            @settings(max_examples=300, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
            @given(requests())
            def one_request(request) -> None:
                rpc, call = request
                try:
                    call(fuzzed)
                except grpc.RpcError as error:
                    assert error.code() not in BAD, (rpc, error.code(), error.details())
                fuzzed.counts_add_up()

            one_request()
            assert serving(), proc.log()
            assert "Traceback" not in proc.log()
    finally:
        proc.stop()
