"""paddlecloud's gloo rendezvous store (paddlecloud/gloo_store.py) and the restart it serves.

The store speaks what Paddle's gloo HTTP store client sends (PUT/GET/DELETE /SCOPE/KEY, 404
until set), keeps a value after its rank's DELETE, forgets all on `reset`, and holds its port
so that Paddle's pserver 0 cannot start its own store there. A PS job's dead gloo trainer
restarts every trainer, with the store reset once the old group is gone, and no epoch restart.
Real sockets and processes; no Paddle (tests/test_ps_faults.py runs the real one).
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paddlecloud.backends.local.children import Child
from paddlecloud.backends.local.deployer import LocalDeployer
from paddlecloud.gloo_store import GlooStore


def _call(store: GlooStore, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    host, port = store.endpoint.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_the_store_answers_as_paddles_gloo_http_store_client_expects():
    with GlooStore() as store:
        assert store.endpoint.startswith("127.0.0.1:")
        assert _call(store, "GET", "/job_worker/0") == (404, b"")  # the client polls until set
        assert _call(store, "PUT", "/job_worker/0", b"\x00addr") == (200, b"")
        assert _call(store, "GET", "/job_worker/0") == (200, b"\x00addr")
        assert _call(store, "GET", "/other_worker/0")[0] == 404  # scopes are apart
        assert _call(store, "DELETE", "/job_worker/0") == (200, b"")
        # a rank's DELETE says it finished; a slower peer may still read its addresses
        assert _call(store, "GET", "/job_worker/0") == (200, b"\x00addr")
        assert store.finished("job_worker") == 1
        store.reset()
        assert _call(store, "GET", "/job_worker/0")[0] == 404
        assert store.finished("job_worker") == 0


def test_a_bad_path_or_length_is_refused_naming_it():
    with GlooStore() as store:
        status, body = _call(store, "GET", "/just-a-scope")
        assert status == 400 and b"/just-a-scope" in body
        host, port = store.endpoint.split(":")
        raw = socket.create_connection((host, int(port)), timeout=10)
        try:
            raw.sendall(b"PUT /s/k HTTP/1.0\r\nContent-Length: lots\r\n\r\n")
            answer = b""
            while chunk := raw.recv(4096):  # the store closes after its answer (HTTP/1.0)
                answer += chunk
        finally:
            raw.close()
        assert b" 400 " in answer.split(b"\r\n", 1)[0] and b"'lots'" in answer


def test_pserver_0_cannot_start_paddles_own_store_on_the_port():
    """Paddle's KVServer binds ('', port) with SO_REUSEADDR: it must fail while ours listens."""
    with GlooStore() as store:
        port = int(store.endpoint.split(":")[1])
        theirs = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            with pytest.raises(OSError):
                theirs.bind(("", port))
        finally:
            theirs.close()


# Trainer 1's first run dies; every run notes its start and waits to be stopped.
TRAINER = """
import os, pathlib, sys, time
rank, died = os.environ["PADDLE_TRAINER_ID"], pathlib.Path(sys.argv[1]) / "died"
with open(pathlib.Path(sys.argv[1]) / "starts", "a") as log:
    log.write(rank + "/" + os.environ["PADDLE_TRAINERS_NUM"] + "\\n")
if rank == "1" and not died.exists():
    died.touch()
    sys.exit(1)
time.sleep(600)
"""


def _starts(tmp: Path) -> list[str]:
    path = tmp / "starts"
    return path.read_text().split() if path.exists() else []


async def _until(predicate, what: str) -> None:
    deadline = time.monotonic() + 60
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


def _gloo_deployer(tmp: Path, *, resets: list, epochs: list, events: list) -> LocalDeployer:
    """A PS job's deployer with gloo trainers (stand-in programs; no master, no pservers run)."""
    def spawn(role: str, index: int, command: list[str], env: dict[str, str]) -> Child:
        return Child(role=role, index=index, command=command, env=env, log_dir=tmp / "logs",
                     on_line=lambda who, line: None)

    async def restart_epoch(epoch: int, done: tuple[int, ...]) -> None:
        epochs.append(epoch)

    deployer = LocalDeployer(
        trainers=2, pservers=2, output=tmp / "output", restart_limit=3, restart_mode="trainer",
        trainer_command=[sys.executable, "-c", TRAINER, str(tmp)], pserver_command=[],
        spawn=spawn, restart_epoch=restart_epoch, event=events.append, user_env=dict,
        rendezvous_reset=lambda: resets.append([t.running for t in deployer.trainers]))
    return deployer


async def test_a_dead_gloo_ps_trainer_restarts_every_trainer_with_the_store_reset(tmp_path: Path):
    resets: list[list[bool]] = []
    epochs: list[int] = []
    events: list[str] = []
    deployer = _gloo_deployer(tmp_path, resets=resets, epochs=epochs, events=events)
    try:
        await deployer.create_trainers()
        await _until(lambda: deployer.trainers[1].returncode == 1, "trainer 1 never died")
        await deployer.reconcile()
        assert resets == [[False, False]]  # the store emptied once the old group was gone
        assert epochs == []  # the pservers keep the model: the master's epoch goes on
        assert "trainer 1 died: restarting the trainer group" in events[-1]
        await _until(lambda: len(_starts(tmp_path)) == 4, "the group was not started again")
        assert sorted(_starts(tmp_path)) == ["0/2", "0/2", "1/2", "1/2"]
        assert all(t.running and t.restarts == 1 for t in deployer.trainers)
        assert deployer.restarts == 1
    finally:
        await deployer.cleanup(succeeded=False)


async def test_a_gloo_ps_job_resized_starts_a_new_group_of_the_new_size(tmp_path: Path):
    (tmp_path / "died").touch()  # no trainer dies here
    resets: list[list[bool]] = []
    epochs: list[int] = []
    deployer = _gloo_deployer(tmp_path, resets=resets, epochs=epochs, events=[])
    try:
        await deployer.create_trainers()
        await _until(lambda: len(_starts(tmp_path)) == 2, "the trainers did not start")
        await deployer.scale(3)
        assert resets == [[False, False]] and epochs == []
        await _until(lambda: len(_starts(tmp_path)) == 5, "the new group did not start")
        assert sorted(_starts(tmp_path)[2:]) == ["0/3", "1/3", "2/3"]
        assert [t.restarts for t in deployer.trainers] == [0, 0, 0]  # a resize is no restart
    finally:
        await deployer.cleanup(succeeded=False)


# A trainer's rendezvous as Paddle's fleet.init makes it (role_maker.Gloo, HTTP store), then
# a barrier and an all_gather over the world it made.
GLOO_RANK = """
import sys
from paddle.distributed.fleet.base.role_maker import Gloo, Role
rank, host, port = int(sys.argv[1]), sys.argv[2], sys.argv[3]
gloo = Gloo()
gloo._init_timeout_seconds = 60
gloo.init(rendezvous=Gloo.RENDEZVOUS.HTTP, role=Role.WORKER, role_id=rank, worker_num=2,
          server_num=2, kwargs={"http.host": host, "http.port": port, "store.prefix": "job",
                                "start_http_server": False, "http_server_d": None})
gloo.barrier("worker")
print("gathered", gloo.all_gather(rank * 10, "worker"), flush=True)
"""


@pytest.mark.paddle_ps
@pytest.mark.timeout(300)
def test_paddles_gloo_rendezvous_completes_through_the_store_for_each_new_group():
    """Paddle 2.6.2's own gloo client: a group rendezvouses, and after `reset` a new group of
    the same ranks does too (what a trainer-group restart needs of the store)."""
    from paddle_ps import paddle_ps_python

    python = str(paddle_ps_python())
    with GlooStore() as store:
        host, port = store.endpoint.split(":")
        for group in range(2):
            ranks = [subprocess.Popen([python, "-c", GLOO_RANK, str(rank), host, port],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                     for rank in range(2)]
            try:
                outs = [rank.communicate(timeout=120)[0] for rank in ranks]
            finally:
                for rank in ranks:
                    rank.kill()
                    rank.wait()
            assert [rank.returncode for rank in ranks] == [0, 0], (group, outs)
            assert all("gathered [0, 10]" in out for out in outs), (group, outs)
            assert store.finished("job_worker") == 2  # each rank said it finished
            store.reset()
