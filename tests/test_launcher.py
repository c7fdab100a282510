"""`paddlecloud trainer -- CMD`: waits for the job, exports the PaddlePaddle env, forwards signals."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

from datasets import write_records
from masters import wait_serving

from paddlecloud import etcd
from paddlecloud.etcd_server import free_port
from paddlecloud.keys import JobKeys

DUMP_ENV = ("import json, os, sys; json.dump({k: v for k, v in os.environ.items() "
            "if k.startswith(('PADDLE', 'TRAINING', 'POD', 'GLOG'))}, open(sys.argv[1], 'w')); sys.exit(7)")


async def serving_master(tmp_path, start_master):
    """A master of a one-record job, serving."""
    write_records(tmp_path / "data", files=1, records_per_file=1)
    proc = start_master("--input", str(tmp_path / "data"))
    await wait_serving(proc.address, process=proc)
    return proc


def launch(args: list[str], env: dict[str, str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "paddlecloud", "trainer", *args],
                            env=dict(os.environ, **env), **kwargs)


async def test_exports_the_paddle_environment_and_exits_with_the_child_code(
        tmp_path, start_master, etcd_endpoint, job_name):
    await serving_master(tmp_path, start_master)
    client = await etcd.connect(etcd_endpoint)
    keys = JobKeys("local", job_name)
    try:
        for i, endpoint in enumerate(["127.0.0.1:7001", "127.0.0.1:7002"]):
            await client.put(keys.pserver(i), endpoint.encode())
    finally:
        await client.close()
    out = tmp_path / "env.json"
    child = launch(["--", sys.executable, "-c", DUMP_ENV, str(out)],
                   {"PADDLE_ETCD_ENDPOINTS": etcd_endpoint, "PADDLE_JOB_NAME": job_name,
                    "PADDLE_TRAINER_ID": "3", "PADDLE_TRAINERS_NUM": "4", "PADDLE_PSERVERS_NUM": "2",
                    "GLOG_minloglevel": "0"})
    assert await asyncio.to_thread(child.wait, 60) == 7
    env = json.loads(out.read_text())
    assert env["TRAINING_ROLE"] == "TRAINER" and env["PADDLE_TRAINER_ID"] == "3"
    assert env["PADDLE_TRAINERS_NUM"] == "4" and env["POD_IP"] == "127.0.0.1"
    assert env["PADDLE_PSERVERS_IP_PORT_LIST"] == "127.0.0.1:7001,127.0.0.1:7002"
    # Paddle's noise is off by default, but what the environment says wins.
    assert env["PADDLECLOUD_PADDLE_SIGNAL_HANDLER"] == "0" and env["GLOG_minloglevel"] == "0"


async def test_waits_for_every_pserver_before_starting(tmp_path, start_master, etcd_endpoint, job_name):
    proc = await serving_master(tmp_path, start_master)
    marker = tmp_path / "started"
    child = launch(["--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                   {"PADDLE_MASTER_ENDPOINT": proc.address, "PADDLE_TRAINER_ID": "0",
                    "PADDLE_PSERVERS_NUM": "1"})
    try:
        # No pserver registered yet: the launcher keeps waiting and starts nothing.
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            assert child.poll() is None and not marker.exists()
            await asyncio.sleep(0.1)
        client = await etcd.connect(etcd_endpoint)
        try:
            await client.put(JobKeys("local", job_name).pserver(0), b"127.0.0.1:7001")
        finally:
            await client.close()
        assert await asyncio.to_thread(child.wait, 60) == 0
        assert marker.exists()
    finally:
        child.kill()


async def test_without_a_command_it_waits_for_the_pservers_then_exits_0(
        tmp_path, start_master, etcd_endpoint, job_name):
    """A Kubernetes trainer pod's `wait-master` init container: its program runs beside it."""
    proc = await serving_master(tmp_path, start_master)
    child = launch([], {"PADDLE_MASTER_ENDPOINT": proc.address, "PADDLE_PSERVERS_NUM": "1"},
                   stderr=subprocess.PIPE, text=True)
    try:
        client = await etcd.connect(etcd_endpoint)
        try:  # no pserver yet: it waits (it has no trainer id to need, nor a program)
            await asyncio.sleep(0)
            assert child.poll() is None
            await client.put(JobKeys("local", job_name).pserver(0), b"127.0.0.1:7001")
        finally:
            await client.close()
        assert await asyncio.to_thread(child.wait, 60) == 0
        assert "the master serves and 1 pservers registered" in child.stderr.read()
    finally:
        child.kill()


async def test_sigterm_reaches_the_child_and_its_code_comes_back(tmp_path, start_master):
    proc = await serving_master(tmp_path, start_master)
    ready, got = tmp_path / "ready", tmp_path / "got-sigterm"
    script = ("import signal, sys, time, pathlib\n"
              f"def on_term(*_): pathlib.Path({str(got)!r}).write_text('yes'); sys.exit(5)\n"
              "signal.signal(signal.SIGTERM, on_term)\n"
              f"pathlib.Path({str(ready)!r}).write_text('ready')\n"
              "time.sleep(60)\n")
    child = launch(["--", sys.executable, "-c", script],
                   {"PADDLE_MASTER_ENDPOINT": proc.address, "PADDLE_TRAINER_ID": "0"})
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline, "the child never started"
        await asyncio.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(child.wait, 30) == 5
    assert got.read_text() == "yes"


async def test_a_child_that_exits_128_plus_the_forwarded_signal_is_told_stopped_by_it(tmp_path, start_master):
    proc = await serving_master(tmp_path, start_master)
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
              "print('ready', flush=True)\n"
              "time.sleep(60)\n")
    child = launch(["--", sys.executable, "-c", script],
                   {"PADDLE_MASTER_ENDPOINT": proc.address, "PADDLE_TRAINER_ID": "3"},
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert await asyncio.to_thread(child.stdout.readline) == "ready\n"
        child.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(child.wait, 30) == 143
        assert "trainer 3 stopped by SIGTERM" in child.stderr.read()
    finally:
        child.kill()


def test_unreachable_master_is_an_error_naming_it():
    address = f"127.0.0.1:{free_port()}"
    result = subprocess.run([sys.executable, "-m", "paddlecloud", "trainer", "--wait-timeout", "2", "--", "true"],
                            env=dict(os.environ, PADDLE_MASTER_ENDPOINT=address, PADDLE_TRAINER_ID="0"),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"master unreachable at {address}" in result.stderr


def test_missing_master_location_is_a_usage_error():
    env = {k: v for k, v in os.environ.items()
           if k not in ("PADDLE_MASTER_ENDPOINT", "PADDLE_ETCD_ENDPOINTS", "PADDLE_JOB_NAME")}
    result = subprocess.run([sys.executable, "-m", "paddlecloud", "trainer", "--", "true"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "PADDLE_MASTER_ENDPOINT" in result.stderr


async def test_a_child_killed_by_a_signal_is_reported_in_one_line(tmp_path, start_master):
    proc = await serving_master(tmp_path, start_master)
    child = launch(["--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                   {"PADDLE_MASTER_ENDPOINT": proc.address, "PADDLE_TRAINER_ID": "1"},
                   stderr=subprocess.PIPE, text=True)
    _, stderr = await asyncio.to_thread(child.communicate, timeout=60)
    assert child.returncode == 128 + signal.SIGKILL
    killed = [line for line in stderr.splitlines() if "killed" in line]
    assert len(killed) == 1 and killed[0].endswith("trainer 1 killed by SIGKILL"), stderr


async def test_a_start_gate_holds_the_command_until_its_file_exists(tmp_path, start_master):
    """The local backend's group restart: the launcher is up and has seen the master, but
    starts its command only once the gate opens; the command's environment lacks the gate."""
    proc = await serving_master(tmp_path, start_master)
    gate, out = tmp_path / "gate", tmp_path / "env.json"
    child = launch(["--", sys.executable, "-c", DUMP_ENV, str(out)],
                   {"PADDLE_MASTER_ENDPOINT": proc.address, "PADDLE_TRAINER_ID": "0",
                    "PADDLECLOUD_START_GATE": str(gate)})
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert child.poll() is None and not out.exists()
            await asyncio.sleep(0.1)
        gate.touch()
        assert await asyncio.to_thread(child.wait, 60) == 7
        env = json.loads(out.read_text())
        assert env["PADDLE_TRAINER_ID"] == "0" and "PADDLECLOUD_START_GATE" not in env
    finally:
        child.kill()


async def test_a_gate_that_never_opens_is_an_error_naming_it(tmp_path, start_master):
    proc = await serving_master(tmp_path, start_master)
    gate = tmp_path / "gate"
    child = launch(["--wait-timeout", "2", "--", "true"],
                   {"PADDLE_MASTER_ENDPOINT": proc.address, "PADDLE_TRAINER_ID": "0",
                    "PADDLECLOUD_START_GATE": str(gate)}, stderr=subprocess.PIPE, text=True)
    try:
        assert await asyncio.to_thread(child.wait, 60) == 1
        assert f"the start gate {gate} did not open within 2s" in child.stderr.read()
    finally:
        child.kill()
