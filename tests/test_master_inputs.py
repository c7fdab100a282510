"""Bad input to the master: each a clear status, or a one-line error and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
import time

import grpc
import pytest
from datasets import write_records
from masters import pb, serving_stub, stub, wait_serving

from paddlecloud.etcd_server import free_port


def run_master(*args: str, etcd: str, job: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "paddlecloud", "master", "--job", job, "--etcd-endpoints", etcd,
         "--port", str(free_port()), "--host", "127.0.0.1", *args],
        capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture
async def master(tmp_path, start_master):
    async with serving_stub(start_master, tmp_path / "data", files=2, records_per_file=2) as master:
        yield master


async def expect_error(call, code: grpc.StatusCode, *fragments: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    assert error.value.code() == code, error.value.details()
    for fragment in fragments:
        assert fragment in error.value.details()
    return error.value.details()


async def test_unknown_session_is_not_found(master):
    await expect_error(master.GetTask(pb.GetTaskRequest(session_id=12345, epoch=0)),
                       grpc.StatusCode.NOT_FOUND, "12345", "register again")
    await expect_error(master.KeepAlive(pb.KeepAliveRequest(session_id=12345)),
                       grpc.StatusCode.NOT_FOUND, "12345")


async def test_unknown_session_reports_are_stale_not_errors(master):
    reply = await master.TaskFinished(pb.TaskReport(session_id=999, task_id=0, epoch=0, attempt=1))
    assert reply.result == pb.STALE


async def test_negative_epoch_is_invalid(master):
    session = (await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="t"))).session_id
    await expect_error(master.GetTask(pb.GetTaskRequest(session_id=session, epoch=-1)),
                       grpc.StatusCode.INVALID_ARGUMENT, "epoch -1")


async def test_empty_trainer_id_is_invalid(master):
    await expect_error(master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="")),
                       grpc.StatusCode.INVALID_ARGUMENT, "trainer id ''")


async def test_bad_list_tasks_arguments_name_the_value(master):
    await expect_error(master.ListTasks(pb.ListTasksRequest(epoch=7)),
                       grpc.StatusCode.INVALID_ARGUMENT, "epoch 7")
    await expect_error(master.ListTasks(pb.ListTasksRequest(page_token="zz")),
                       grpc.StatusCode.INVALID_ARGUMENT, "'zz'")


async def test_restart_epoch_outside_the_job_is_invalid(master):
    await expect_error(master.RestartEpoch(pb.RestartEpochRequest(epoch=5)),
                       grpc.StatusCode.INVALID_ARGUMENT, "epoch 5")


async def test_set_dataset_errors_name_the_bad_value(tmp_path, start_master):
    proc = start_master("--allow-set-dataset", str(tmp_path), "--allow-set-dataset", "hdfs://",
                        "--allow-set-dataset", "gs://")
    await wait_serving(proc.address, process=proc)
    async with grpc.aio.insecure_channel(proc.address) as channel:
        master = stub(channel)

        def spec(**fields):
            return pb.SetDatasetRequest(dataset=pb.DatasetSpec(**fields))
        await expect_error(master.SetDataset(spec(paths=[str(tmp_path / "nothing-*.csv")])),
                           grpc.StatusCode.INVALID_ARGUMENT, "nothing-*.csv", "matches no file")
        await expect_error(master.SetDataset(spec(paths=[str(tmp_path)], chunk_bytes=-5)),
                           grpc.StatusCode.INVALID_ARGUMENT, "chunk_bytes -5")
        await expect_error(master.SetDataset(spec(paths=[str(tmp_path)], format="parquet")),
                           grpc.StatusCode.INVALID_ARGUMENT, "'parquet'")
        await expect_error(master.SetDataset(spec(paths=["gs://bucket/data/*.csv"])),
                           grpc.StatusCode.INVALID_ARGUMENT, "gs://", "gcsfs")  # a driver not installed
        # pyarrow's HDFS driver installed (the hdfs extra), but no Hadoop here: still named
        await expect_error(master.SetDataset(spec(paths=["hdfs://namenode/data/*.csv"])),
                           grpc.StatusCode.INVALID_ARGUMENT, "hdfs://namenode")
        await expect_error(master.SetDataset(spec(paths=[])),
                           grpc.StatusCode.INVALID_ARGUMENT, "paths")
        empty = tmp_path / "empty.csv"
        empty.write_text("")
        await expect_error(master.SetDataset(spec(paths=[str(empty)])),
                           grpc.StatusCode.INVALID_ARGUMENT, "no data")
        # Nothing was frozen by the bad calls: a good one still goes through.
        write_records(tmp_path / "good", files=1, records_per_file=1)
        assert (await master.SetDataset(spec(paths=[str(tmp_path / "good")]))).num_tasks == 1


def test_glob_matching_nothing_exits_naming_the_glob(tmp_path, etcd_endpoint, job_name):
    glob = str(tmp_path / "missing-*.csv")
    result = run_master("--input", glob, etcd=etcd_endpoint, job=job_name)
    assert result.returncode == 2
    assert f"input glob {glob!r} matches no file" in result.stderr


@pytest.mark.parametrize("flag, value, fragment", [
    ("--chunk-bytes", "-5", "invalid size '-5'"),
    ("--session-ttl", "soon", "invalid duration 'soon'"),
    ("--failover-hold", "-1s", "invalid duration '-1s'"),
    ("--max-tasks-per-trainer", "0", "0"),
    ("--format", "parquet", "unknown format 'parquet'"),
])
def test_bad_flags_exit_2_naming_the_value(tmp_path, etcd_endpoint, job_name, flag, value, fragment):
    result = run_master("--input", str(tmp_path), flag, value, etcd=etcd_endpoint, job=job_name)
    assert result.returncode == 2
    assert fragment in result.stderr
    assert flag in result.stderr or "format" in result.stderr


def test_unreachable_etcd_exits_instead_of_hanging(job_name):
    endpoint = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = run_master("--etcd-timeout", "2s", etcd=endpoint, job=job_name, timeout=60)
    assert result.returncode == 1
    assert f"etcd unreachable at {endpoint}" in result.stderr
    assert time.monotonic() - started < 60


def test_malformed_etcd_endpoint_is_a_usage_error(job_name):
    result = run_master(etcd="ftp://secure:2379", job=job_name)
    assert result.returncode == 2
    assert "'ftp://secure:2379'" in result.stderr
