"""A whole job on one machine: etcd, master(s), pserver agents and trainer launchers.

`LocalJob.run()` is the local deployer and supervisor (what the master Deployment,
the pserver StatefulSet and the trainer Job are on Kubernetes). It starts a private
etcd unless given one, the masters (two or more campaign for leadership), the
pserver agents, then the trainers; it restarts what dies, as Kubernetes would, and
follows the master's progress until the job ends.

Restarts: a dead master or pserver agent is started again. A dead trainer is started
again with the same trainer id (it rejoins the master) — in `trainer` restart mode.
In `group` mode (collective training, where a group cannot lose a member), every
trainer is stopped, the master restarts the epoch the last checkpoint resumes at
(`RestartEpoch`), and the whole group starts again from that checkpoint.

What this does NOT do: isolate children (they run as this user, on this machine), or
survive its own death: killing `paddlecloud local train` stops the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from paddlecloud import etcd
from paddlecloud.api import pb, pb_grpc
from paddlecloud.etcd_server import EtcdServer, free_port
from paddlecloud.keys import JobKeys, prefix_range_end
from paddlecloud.local.children import Child

logger = logging.getLogger(__name__)

NAMESPACE = "local"
TERMINAL = ("Succeeded", "Failed")
TRAINERS_EXITED_GRACE = 5.0  # seconds the master's phase may lag the trainers' exit


@dataclass(frozen=True)
class LocalJobSpec:
    job: str
    module: str
    output: Path
    inputs: tuple[str, ...]
    trainers: int = 1
    pservers: int = 0
    epochs: int = 1
    masters: int = 1
    package_path: Path | None = None
    env: tuple[tuple[str, str], ...] = ()
    module_args: tuple[str, ...] = ()
    pserver_module: str | None = None    # default: `module`, which switches on TRAINING_ROLE
    etcd_endpoints: str | None = None
    fresh: bool = False
    restart_limit: int = 3
    restart_mode: str = "group"          # "group" (collective) or "trainer" (PS / stub trainers)
    start_epoch: int = 0
    master_args: tuple[str, ...] = ()    # extra master flags (e.g. --chunk-bytes)
    session_ttl: str = "10s"
    election_ttl: str = "10s"
    done_grace: float = 60.0             # seconds trainers get to exit once the job ended


@dataclass
class Progress:
    """What the progress view shows; refreshed from the master's GetStatus."""

    phase: str = "Pending"
    epoch: int = 0
    num_epochs: int = 0
    done: int = 0
    num_tasks: int = 0
    trainers_alive: int = 0
    requeued: int = 0
    restarts: int = 0
    leader: str = ""
    events: list[str] = field(default_factory=list)


class LocalJob:
    def __init__(self, spec: LocalJobSpec, *, on_line: Callable[[str, str], None],
                 on_progress: Callable[[Progress], None] = lambda p: None) -> None:
        self.spec = spec
        self.on_line = on_line
        self.on_progress = on_progress
        self.keys = JobKeys(NAMESPACE, spec.job)
        self.log_dir = spec.output / "logs"
        self.progress = Progress(num_epochs=spec.epochs)
        self.etcd_server: EtcdServer | None = None
        self.etcd_endpoint = spec.etcd_endpoints or ""
        self.masters: list[Child] = []
        self.pservers: list[Child] = []
        self.trainers: list[Child] = []
        self.stopping = asyncio.Event()
        self.stop_signal: int | None = None
        self._etcd_dir: str | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}

    # ---- life cycle -------------------------------------------------------------

    async def run(self) -> int:
        """Runs the job to its end; returns the exit code (0 succeeded, 1 failed, 128+N signal N)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            await self._start_etcd()
            if self.spec.fresh:
                await self._clear_job_state()
            await self._start_masters()
            await self._start_pservers()
            await self._start_trainers()
            return await self._supervise()
        finally:
            await self._stop_all()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        self.stop_signal = sig
        self.stopping.set()

    async def _start_etcd(self) -> None:
        if self.spec.etcd_endpoints:
            return
        self._etcd_dir = tempfile.mkdtemp(prefix=f"paddlecloud-{self.spec.job}-etcd-")
        self.etcd_server = EtcdServer(self._etcd_dir, log_path=str(self.log_dir / "etcd.log"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self.etcd_server.start)
        self.etcd_endpoint = self.etcd_server.endpoint
        self._event(f"etcd started at {self.etcd_endpoint} (data in {self._etcd_dir})")

    async def _clear_job_state(self) -> None:
        client = await etcd.connect(self.etcd_endpoint)
        try:
            await client.delete_range(self.keys.prefix, prefix_range_end(self.keys.prefix))
        finally:
            await client.close()
        self._event(f"cleared the earlier state of job {self.spec.job}")

    def _base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            PADDLE_JOB_NAME=self.spec.job, PADDLE_NAMESPACE=NAMESPACE,
            PADDLE_ETCD_ENDPOINTS=self.etcd_endpoint, POD_IP="127.0.0.1",
            PADDLE_TRAINERS_NUM=str(self.spec.trainers), PADDLE_PSERVERS_NUM=str(self.spec.pservers),
            PADDLECLOUD_OUTPUT=str(self.spec.output), PYTHONUNBUFFERED="1",
        )
        if self.spec.package_path is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(self.spec.package_path), env.get("PYTHONPATH", "")) if p)
        env.pop("PADDLE_MASTER_ENDPOINT", None)  # local jobs find the leader through etcd
        env.update(dict(self.spec.env))
        return env

    def _child(self, role: str, index: int, command: list[str], env: dict[str, str]) -> Child:
        return Child(role=role, index=index, command=command, env=env, log_dir=self.log_dir,
                     on_line=self.on_line)

    async def _start_masters(self) -> None:
        s = self.spec
        for index in range(s.masters):
            port = free_port()
            command = [
                sys.executable, "-m", "paddlecloud", "master", "--job", s.job, "--namespace", NAMESPACE,
                "--etcd-endpoints", self.etcd_endpoint, "--host", "127.0.0.1", "--port", str(port),
                "--advertise", f"127.0.0.1:{port}", "--epochs", str(s.epochs),
                "--start-epoch", str(s.start_epoch), "--session-ttl", s.session_ttl,
                "--election-ttl", s.election_ttl,
                *[arg for path in s.inputs for arg in ("--input", path)], *s.master_args,
            ]
            child = self._child("master", index, command, self._base_env())
            await child.start()
            self.masters.append(child)

    def _user_command(self) -> list[str]:
        return [sys.executable, "-m", self.spec.module, *self.spec.module_args]

    async def _start_pservers(self) -> None:
        s = self.spec
        user = ([sys.executable, "-m", s.pserver_module] if s.pserver_module else self._user_command())
        for index in range(s.pservers):
            command = [sys.executable, "-m", "paddlecloud", "pserver", "--", *user]
            child = self._child("pserver", index, command, self._base_env())
            await child.start()
            self.pservers.append(child)

    def _trainer_env(self, index: int, ports: list[int]) -> dict[str, str]:
        env = self._base_env()
        env["PADDLE_TRAINER_ID"] = str(index)
        if self.spec.pservers == 0:  # collective training: the group's endpoints
            endpoints = [f"127.0.0.1:{p}" for p in ports]
            env.update(PADDLE_TRAINER_ENDPOINTS=",".join(endpoints), PADDLE_CURRENT_ENDPOINT=endpoints[index],
                       PADDLE_PORT=str(ports[index]))
        return env

    async def _start_trainers(self) -> None:
        ports = [free_port() for _ in range(self.spec.trainers)]
        self.trainers = []
        for index in range(self.spec.trainers):
            command = [sys.executable, "-m", "paddlecloud", "trainer", "--", *self._user_command()]
            child = self._child("trainer", index, command, self._trainer_env(index, ports))
            await child.start()
            self.trainers.append(child)

    # ---- supervision ------------------------------------------------------------

    async def _supervise(self) -> int:
        ended_at: float | None = None
        exited_at: float | None = None
        while not self.stopping.is_set():
            await self._poll_status()
            await self._restart_dead()
            phase = self.progress.phase
            if phase in TERMINAL:
                ended_at = ended_at or time.monotonic()
                trainers_done = not any(t.running for t in self.trainers)
                if trainers_done or time.monotonic() - ended_at > self.spec.done_grace:
                    failed = [t.name for t in self.trainers if t.returncode not in (0, None)]
                    if phase == "Succeeded" and failed:
                        self._event(f"the data is done but {', '.join(failed)} exited with an error")
                    return 0 if phase == "Succeeded" and not failed else 1
            elif self.trainers and all(t.returncode == 0 for t in self.trainers):
                # The status polled above may predate the trainers' JOB_DONE: look again.
                exited_at = exited_at or time.monotonic()
                if time.monotonic() - exited_at > TRAINERS_EXITED_GRACE:
                    self._event("every trainer exited before the master's job was done")
                    return 1
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), 0.5)
        self._event(f"stopping on {signal.Signals(self.stop_signal).name}" if self.stop_signal else "stopping")
        return 128 + (self.stop_signal or signal.SIGTERM)

    async def _poll_status(self) -> None:
        for master in self.masters:
            if not master.running:
                continue
            try:
                status = await self._master(master_address(master)).GetStatus(pb.GetStatusRequest(), timeout=2)
            except grpc.aio.AioRpcError:
                continue
            p = self.progress
            p.phase, p.epoch, p.num_epochs = status.phase, status.current_epoch, status.num_epochs or p.num_epochs
            p.done, p.num_tasks = status.counts.done, status.num_tasks
            p.trainers_alive, p.requeued, p.leader = status.trainers_alive, status.requeued, status.leader
            break
        self.on_progress(self.progress)

    async def _restart_dead(self) -> None:
        for child in [*self.masters, *self.pservers]:
            if child.process is not None and not child.running and not child.expected_exit:
                if self.progress.phase in TERMINAL and child.returncode == 0:
                    continue  # a pserver agent stops by itself when the job ends
                await self._restart(child, why=f"exited with {child.returncode}")
        dead = [t for t in self.trainers if not t.running and t.returncode not in (0, None)
                and not t.expected_exit]
        if not dead or self.progress.phase in TERMINAL:
            return
        if self.spec.restart_mode == "trainer":
            for trainer in dead:
                await self._restart(trainer, why=f"exited with {trainer.returncode}")
        else:
            await self._restart_group(dead)

    async def _restart(self, child: Child, *, why: str) -> None:
        if child.role == "master" and child.returncode == 2:  # bad flags or state: no retry helps
            raise JobFailed(f"{child.name} {why}: {self._last_line(child)} (see {child.log_path})")
        if child.restarts >= self.spec.restart_limit:
            raise JobFailed(f"{child.name} {why}; it was restarted {child.restarts} times "
                            f"(--restart-limit {self.spec.restart_limit})")
        child.restarts += 1
        self.progress.restarts += 1
        self._event(f"{child.name} {why}: restarting it (restart {child.restarts})")
        await child.wait()
        await child.start()

    async def _restart_group(self, dead: list[Child]) -> None:
        """Collective training: stop the group, restart the checkpoint's epoch, start all again."""
        restarts = max(t.restarts for t in self.trainers)
        if restarts >= self.spec.restart_limit:
            raise JobFailed(f"{dead[0].name} exited with {dead[0].returncode}; the trainer group was "
                            f"restarted {restarts} times (--restart-limit {self.spec.restart_limit})")
        self._event(f"{', '.join(t.name for t in dead)} died: restarting the trainer group")
        await asyncio.gather(*(t.stop(grace=5) for t in self.trainers))
        epoch = resume_epoch(self.spec.output)
        await self._restart_epoch(epoch)
        await self._start_trainers()
        for trainer in self.trainers:
            trainer.restarts = restarts + 1
        self.progress.restarts += 1

    async def _restart_epoch(self, epoch: int) -> None:
        address = self.progress.leader
        deadline = time.monotonic() + 60
        while True:
            try:
                await self._master(address).RestartEpoch(pb.RestartEpochRequest(epoch=epoch), timeout=10)
                self._event(f"the master restarted epoch {epoch}")
                return
            except grpc.aio.AioRpcError as error:
                if time.monotonic() > deadline:
                    raise JobFailed(f"could not restart epoch {epoch}: {error.details()}") from None
                await asyncio.sleep(0.5)
                await self._poll_status()
                address = self.progress.leader

    @staticmethod
    def _last_line(child: Child) -> str:
        try:
            lines = child.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return lines[-1] if lines else "no output"

    def _event(self, text: str) -> None:
        self.progress.events.append(text)
        self.on_line("local", text)

    def _master(self, address: str) -> pb_grpc.MasterStub:
        """A stub on one long-lived channel per master address (polled every half second)."""
        if address not in self._channels:
            self._channels[address] = grpc.aio.insecure_channel(address)
        return pb_grpc.MasterStub(self._channels[address])

    async def _stop_all(self) -> None:
        children = [*self.trainers, *self.pservers, *self.masters]
        await asyncio.gather(*(c.stop(grace=10) for c in children), return_exceptions=True)
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        if self.etcd_server is not None:
            await asyncio.to_thread(self.etcd_server.stop)
        if self._etcd_dir is not None:
            shutil.rmtree(self._etcd_dir, ignore_errors=True)


def master_address(master: Child) -> str:
    """The HOST:PORT a master child advertises (its `--advertise` flag)."""
    return master.command[master.command.index("--advertise") + 1]


class JobFailed(RuntimeError):
    """The job cannot go on (restart limits reached); the message says why."""


def resume_epoch(output: Path) -> int:
    """The epoch a job resumes at: the last checkpoint's `TrainStatus.next()`, else 0."""
    from trainer_agent.checkpoint import latest_train_status

    status = latest_train_status(str(output / "checkpoints"))
    return status.next() if status is not None else 0
