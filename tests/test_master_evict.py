"""An operator evicts a trainer's session (`EvictTrainer`, `paddlecloud job evict`): its tasks
return at once with no failure counted, as on a supersede, and its process is told to stop.
Also the cap on a GetTask's `finished` refs (issue 34, finding 4). Real master, real etcd."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import grpc
import pytest
from datasets import write_records
from masters import pb, stub, wait_serving

from paddlecloud.auth import JobTokens, auth_metadata
from paddlecloud.wire import Reason, error_info


def _evict(address: str, job: str, trainer: str, token_file) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "paddlecloud", "job", "evict", job, trainer, "--master", address],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PADDLE_JOB_TOKEN_FILE=str(token_file)))


@pytest.fixture
async def secured(tmp_path, start_master):
    write_records(tmp_path / "data", files=4, records_per_file=2)
    tokens = JobTokens.generate()
    tokens.write(tmp_path / "tokens")
    proc = start_master("--input", str(tmp_path / "data"), "--tokens-dir", str(tmp_path / "tokens"),
                        "--max-tasks-per-trainer", "2")
    await wait_serving(proc.address, process=proc)
    async with grpc.aio.insecure_channel(proc.address) as channel:
        yield proc, stub(channel), tokens, tmp_path / "tokens"


async def _register(m, tokens: JobTokens, trainer: str) -> tuple[int, list[tuple[str, str]]]:
    reply = await m.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id=trainer),
                                    metadata=auth_metadata(tokens.trainer))
    return reply.session_id, auth_metadata(reply.session_token)


async def test_job_evict_returns_the_tasks_at_once_and_stops_the_session(secured, job_name):
    proc, m, tokens, token_dir = secured
    rogue, rogue_auth = await _register(m, tokens, "rogue")
    held = (await m.GetTask(pb.GetTaskRequest(session_id=rogue, epoch=0, max_tasks=2), metadata=rogue_auth))
    assert held.outcome == pb.TASK and len(held.more_tasks) == 1
    operator = auth_metadata(tokens.operator)

    result = await asyncio.to_thread(_evict, proc.address, job_name, "rogue", token_dir / "operator")
    assert result.returncode == 0, result.stderr
    assert "trainer rogue evicted" in result.stdout and "2 task(s) back to todo" in result.stdout

    status = await m.GetStatus(pb.GetStatusRequest(), metadata=operator)
    assert (status.counts.todo, status.counts.pending, status.counts.failed) == (4, 0, 0)
    tasks = (await m.ListTasks(pb.ListTasksRequest(), metadata=operator)).tasks
    assert all(t.failures == 0 for t in tasks)  # no failure counted
    with pytest.raises(grpc.aio.AioRpcError) as stopped:
        await m.GetTask(pb.GetTaskRequest(session_id=rogue, epoch=0), metadata=rogue_auth)
    assert stopped.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "evicted by the operator" in stopped.value.details()
    assert error_info(stopped.value)[0] is Reason.SESSION_SUPERSEDED  # a trainer stops, as when superseded
    # the evicted tasks go to the next trainer at once
    other, other_auth = await _register(m, tokens, "honest")
    got = await m.GetTask(pb.GetTaskRequest(session_id=other, epoch=0), metadata=other_auth)
    assert got.outcome == pb.TASK

    unknown = await asyncio.to_thread(_evict, proc.address, job_name, "nobody", token_dir / "operator")
    assert unknown.returncode == 1 and "trainer 'nobody' has no session" in unknown.stderr, unknown.stderr
    denied = await asyncio.to_thread(_evict, proc.address, job_name, "honest", token_dir / "viewer")
    assert denied.returncode == 1 and "needs the job's operator token" in denied.stderr, denied.stderr


async def test_a_get_task_with_too_many_finished_refs_is_refused_before_any_work(secured):
    _, m, tokens, _ = secured
    session, auth = await _register(m, tokens, "t")
    task = (await m.GetTask(pb.GetTaskRequest(session_id=session, epoch=0), metadata=auth)).task
    ref = pb.TaskRef(task_id=task.id, epoch=task.epoch, attempt=task.attempt)
    flood = [ref] * 17  # the cap: 8 x --max-tasks-per-trainer 2
    for call in (lambda: m.GetTask(pb.GetTaskRequest(session_id=session, epoch=0, finished=flood), metadata=auth),
                 lambda: _over_stream(m, pb.GetTaskRequest(session_id=session, epoch=0, finished=flood), auth)):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call()
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "17 finished task refs in one GetTask: at most 16" in refused.value.details()
    # nothing of it was applied: the task is still pending, and 16 refs are accepted
    reply = await m.GetTask(pb.GetTaskRequest(session_id=session, epoch=0, finished=[ref] * 16), metadata=auth)
    assert list(reply.finished_results)[:1] == [pb.ACCEPTED]


async def _over_stream(m, request, auth):
    call = m.GetTaskStream(metadata=auth)
    await call.write(request)
    return await call.read()
