"""A whole job on one machine: etcd, master(s), and the `LocalDeployer`'s pservers and trainers.

`LocalJob.run()` is what `paddlecloud job submit` and the Kubernetes controllers are
for a cluster job: it starts a private etcd unless given one and the masters (two or
more campaign for leadership; a dead one is started again, as its Deployment would
be), then drives a `LocalDeployer` with the same supervisor as the Kubernetes
backend (`paddlecloud.supervision.supervise`): pservers first, trainers once every
pserver has registered, replacements of what dies, and the job's end decided by the
one phase decision from the master's data (polled with GetStatus) and the trainers.

Only the user's command (under the trainer and pserver launchers) runs with the
user's `--package-path` on its PYTHONPATH: a user's `master.py` there must not
shadow the service in the masters, nor in the launchers (which import it).

What this does NOT do: survive its own death — killing `paddlecloud local train`
stops the job.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from paddlecloud import checkpoints, etcd
from paddlecloud.aio import cancel_and_wait
from paddlecloud.api import pb
from paddlecloud.auth import ClientCredentials, JobTokens, Role
from paddlecloud.backends.local.children import Child
from paddlecloud.backends.local.container import ContainerSpec, remove_containers
from paddlecloud.backends.local.deployer import JobFailed, LocalDeployer, launcher_command
from paddlecloud.backends.local.handle import SECRETS_DIR, LocalJobHandle
from paddlecloud.etcd_server import EtcdServer, free_ports, server_version, version_warning
from paddlecloud.exits import signal_exit_code
from paddlecloud.gloo_store import GlooStore
from paddlecloud.keys import JobKeys, prefix_range_end
from paddlecloud.master_client import MasterConnection, MasterLocator, MasterUnavailable
from paddlecloud.master_flags import master_flags
from paddlecloud.phase import Phase
from paddlecloud.supervision import Graces, MasterState, supervise
from paddlecloud.tls import LocalCA

logger = logging.getLogger(__name__)

NAMESPACE = "local"
TRAINERS_EXITED_GRACE = 5.0  # seconds the master's phase may lag the trainers' exit
POLL_INTERVAL = 0.5          # seconds between two looks at the master and the children
POLL_DEADLINE = 2.0          # seconds a look at the master may take, retries included
OPERATOR_DEADLINE = 60.0     # seconds RestartEpoch and ScaleTrainers retry while no leader answers
PAGE_LINGER = 2.0            # seconds the masters serve their status page after the job's end

@dataclass(frozen=True)
class LocalJobSpec:
    job: str
    module: str | None                   # None only with `container`: the image's own entrypoint
    output: Path
    inputs: tuple[str, ...]
    trainers: int = 1                    # the group's size at start (the desired size)
    pservers: int = 0
    epochs: int = 1
    min_trainers: int | None = None      # the elastic range; None: `trainers`
    max_trainers: int | None = None
    resize_schedule: tuple[tuple[float, int], ...] = ()  # (seconds since start, size): ScaleTrainers
    masters: int = 1
    package_path: Path | None = None
    # the package folder's parent, where the folder is the module's top package (seed 002's
    # --package-path=./demo --module=demo.train); None: the folder itself is the import root
    package_import_root: Path | None = None
    env: tuple[tuple[str, str], ...] = ()
    module_args: tuple[str, ...] = ()
    pserver_module: str | None = None    # default: `module`, which switches on TRAINING_ROLE
    python: str = sys.executable         # runs the module (--python), e.g. a PS-capable Paddle's venv
    etcd_endpoints: str | None = None
    fresh: bool = False
    restart_limit: int = 3
    restart_mode: str = "group"          # "group" (collective) or "trainer" (PS / stub trainers)
    pserver_restart: str = "self"        # "self": the agent restarts its pserver; "group": the PS group
    start_epoch: int = 0
    master_args: tuple[str, ...] = ()    # extra master flags (e.g. --chunk-bytes)
    shuffle_seed: int = 0                # the deal order's seed (master --shuffle-seed)
    session_ttl: str = "10s"
    election_ttl: str = "10s"
    done_grace: float = 60.0             # seconds trainers get to exit once the job ended
    tls: bool = False                    # the masters serve TLS with a CA minted for this run
    container: ContainerSpec | None = None  # --image: pservers and trainers in containers


@dataclass
class Progress:
    """What the progress view shows; refreshed from the master's GetStatus."""

    phase: str = Phase.PENDING.value
    epoch: int = 0
    num_epochs: int = 0
    done: int = 0
    num_tasks: int = 0
    trainers_alive: int = 0
    min_trainers: int = 0
    max_trainers: int = 0
    desired_trainers: int = 0
    requeued: int = 0
    restarts: int = 0
    leader: str = ""
    page: str = ""          # the first master's status page
    trainer_seconds: dict[str, float] = field(default_factory=dict)  # goodput, by cause
    events: list[str] = field(default_factory=list)


class LocalJob:
    def __init__(self, spec: LocalJobSpec, *, on_line: Callable[[str, str], None],
                 on_progress: Callable[[Progress], None] = lambda p: None) -> None:
        self.spec = spec
        self.on_line = on_line
        self.on_progress = on_progress
        self.keys = JobKeys(NAMESPACE, spec.job)
        self.log_dir = spec.output / "logs"
        self.secrets_dir = spec.output / SECRETS_DIR  # this run's tokens (and certificates), its handle
        self.credentials = ClientCredentials()
        self.progress = Progress(num_epochs=spec.epochs)
        self.etcd_server: EtcdServer | None = None
        self.etcd_endpoint = spec.etcd_endpoints or ""
        self.masters: list[Child] = []
        # a PS job's trainers in a gloo world: paddlecloud serves its rendezvous store
        self.gloo_store = GlooStore() if gloo_trainers(spec) else None
        self.deployer = LocalDeployer(
            trainers=spec.trainers, pservers=spec.pservers, output=spec.output,
            trainer_command=launcher_command("trainer", self._role_command("trainer")),
            # a PS group restart is the deployer's: the agent exits with its pserver
            pserver_command=launcher_command("pserver", self._role_command("pserver"),
                                             *(("--restart-limit", "0") if spec.pserver_restart == "group" else ())),
            restart_limit=spec.restart_limit, restart_mode=spec.restart_mode, spawn=self._child,
            user_env=self._env, restart_epoch=self._restart_epoch,
            event=self._event, pserver_restart=spec.pserver_restart,
            rendezvous_reset=self.gloo_store.reset if self.gloo_store is not None else None,
        )
        self.stopping = asyncio.Event()
        self.exited = asyncio.Event()  # a child ended: the supervisor looks at once
        self.stop_signal: int | None = None
        self._status: pb.GetStatusResponse | None = None
        self._master_restarts = 0
        self._etcd_dir: str | None = None
        # The leader's clients (paddlecloud.master_client), found as the trainers find it
        # (etcd): one for the polls (a poll gives up in POLL_DEADLINE), one for the operator's
        # calls (RestartEpoch, ScaleTrainers: retried while no leader answers, 60 s).
        self._masters: dict[float, MasterConnection] = {}
        self.page_urls: list[str] = []   # each master's status page (its --metrics-port)

    @property
    def trainers(self) -> list[Child]:
        return self.deployer.trainers

    @property
    def pservers(self) -> list[Child]:
        return self.deployer.pservers

    # ---- life cycle -------------------------------------------------------------

    async def run(self) -> int:
        """Runs the job to its end; returns the exit code (0 succeeded, 1 failed, 128+N signal N)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            self._write_secrets()
            if self.gloo_store is not None:  # before pserver 0, whose own store must not get the port
                self.gloo_store.start()
                self._event(f"serving the trainers' gloo rendezvous store at {self.gloo_store.endpoint}")
            await self._start_etcd()
            if self.spec.fresh:
                await self._clear_job_state()
            await self._start_masters()
            return await self._supervise()
        finally:
            await self._stop_all()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        self.stop_signal = sig
        self.stopping.set()

    async def _start_etcd(self) -> None:
        """Starts the job's private etcd unless given endpoints; either way its first lines
        name the etcd and its version, and warn about a release known to lose data."""
        if self.spec.etcd_endpoints:
            first = self.spec.etcd_endpoints.split(",")[0].strip()
            version = await asyncio.to_thread(server_version, first)
            self._event(f"using etcd {version or '(version unknown)'} at {self.spec.etcd_endpoints}")
        else:
            self._etcd_dir = tempfile.mkdtemp(prefix=f"paddlecloud-{self.spec.job}-etcd-")
            self.etcd_server = EtcdServer(self._etcd_dir, log_path=str(self.log_dir / "etcd.log"))
            self.log_dir.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(self.etcd_server.start)
            self.etcd_endpoint = self.etcd_server.endpoint
            version = await asyncio.to_thread(self.etcd_server.version)
            self._event(f"etcd {version or '(version unknown)'} ({self.etcd_server.binary}) started at "
                        f"{self.etcd_endpoint} (data in {self._etcd_dir})")
        if warning := version_warning(version):
            self._event(f"WARNING: {warning}")

    async def _clear_job_state(self) -> None:
        client = await etcd.connect(self.etcd_endpoint)
        try:
            await client.delete_range(self.keys.prefix, prefix_range_end(self.keys.prefix))
        finally:
            await client.close()
        self._event(f"cleared the earlier state of job {self.spec.job}")

    def _env(self, *, master: bool = False) -> dict[str, str]:
        """The children's environment (the user's package path is on the user's command only)."""
        env = dict(os.environ)
        env.update(
            PADDLE_JOB_NAME=self.spec.job, PADDLE_NAMESPACE=NAMESPACE,
            PADDLE_ETCD_ENDPOINTS=self.etcd_endpoint, POD_IP="127.0.0.1",
            PADDLE_TRAINERS_NUM=str(self.spec.trainers), PADDLE_PSERVERS_NUM=str(self.spec.pservers),
            PADDLECLOUD_OUTPUT=str(self.spec.output), PYTHONUNBUFFERED="1",
            PADDLE_JOB_TOKEN_FILE=str(self.secrets_dir / "tokens" / Role.TRAINER.value),
            PADDLECLOUD_INPUT=",".join(self.spec.inputs),
        )
        if self.spec.package_path is not None:
            env["PADDLECLOUD_PACKAGE"] = str(self.spec.package_path)
        if self.spec.tls:
            env["PADDLE_MASTER_CA_FILE"] = str(self.secrets_dir / "ca.crt")
        if master:  # nor the current directory first on its path (Python >= 3.11)
            env["PYTHONSAFEPATH"] = "1"
        if self.gloo_store is not None:  # the store Paddle's HTTP rendezvous (3) reads
            env.update(PADDLE_GLOO_RENDEZVOUS="3", PADDLE_GLOO_HTTP_ENDPOINT=self.gloo_store.endpoint)
        env.pop("PADDLE_MASTER_ENDPOINT", None)  # local jobs find the leader through etcd
        env.update(dict(self.spec.env))
        return env

    def _child(self, role: str, index: int, command: list[str], env: dict[str, str]) -> Child:
        return Child(role=role, index=index, command=command, env=env, log_dir=self.log_dir,
                     on_line=self.on_line, on_exit=lambda child: self.exited.set())

    async def _start_masters(self) -> None:
        s = self.spec
        for index in range(s.masters):
            port, page_port = free_ports(2)
            command = [sys.executable, "-m", "paddlecloud", "master", *master_flags(
                job=s.job, namespace=NAMESPACE, etcd_endpoints=self.etcd_endpoint, host="127.0.0.1",
                port=port, advertise=f"127.0.0.1:{port}", session_ttl=s.session_ttl,
                election_ttl=s.election_ttl, start_epoch=s.start_epoch, inputs=s.inputs,
                epochs=s.epochs, shuffle_seed=s.shuffle_seed, metrics_port=page_port,
                extra=s.master_args, trainers=s.trainers, min_trainers=s.min_trainers or s.trainers,
                max_trainers=s.max_trainers or s.trainers,
                tokens_dir=str(self.secrets_dir / "tokens"),
                tls_cert=str(self.secrets_dir / "master.crt") if s.tls else None,
                tls_key=str(self.secrets_dir / "master.key") if s.tls else None,
                deployer="local")]  # this supervisor restarts the group: it may reopen the job
            child = self._child("master", index, command, self._env(master=True))
            await child.start()
            self.masters.append(child)
            # the viewer's token rides in the URL once: the page keeps it in sessionStorage
            # and takes it out of the address bar (a loopback page of a local run)
            self.page_urls.append(f"http://127.0.0.1:{page_port}/?token={self._page_token}")
            self.progress.page = self.progress.page or self.page_urls[-1]
            self._event(f"status page of {child.name}: {self.page_urls[-1]}"
                        + (" (the leader's shows the job)" if s.masters > 1 else ""))
        self._write_handle()

    def _write_handle(self) -> None:
        """OUTPUT/.paddlecloud/job.json: how `paddlecloud job scale --output` finds the leader."""
        LocalJobHandle(self.spec.job, tuple(master_address(m) for m in self.masters),
                       self.progress.leader).write(self.spec.output)

    def _role_command(self, role: str) -> list[str]:
        """What a role's launcher runs: the user's module here, or (--image) a container of it."""
        module, args = self.spec.module, self.spec.module_args
        if role == "pserver" and self.spec.pserver_module:
            module, args = self.spec.pserver_module, ()
        if self.spec.container is not None:
            return self.spec.container.for_role(role, module=module, args=args).wrapper_command()
        return self._user_command(module, args)

    def _user_command(self, module: str | None = None, args: tuple[str, ...] | None = None) -> list[str]:
        """`python -m MODULE ARGS`, with the user's package path first on its PYTHONPATH.

        Only the user's code gets the package path: our own processes (the master, the
        launchers and agents, which import `master`) must not see a user's `master.py`.
        """
        command = [self.spec.python, "-m", module or self.spec.module,
                   *(self.spec.module_args if args is None else args)]
        if self.spec.package_path is None:
            return command
        roots = (self.spec.package_import_root, self.spec.package_path)
        path = os.pathsep.join(p for p in (*(str(r) for r in roots if r is not None),
                                           self._env().get("PYTHONPATH", "")) if p)
        return ["env", f"PYTHONPATH={path}", *command]

    # ---- supervision ------------------------------------------------------------

    async def _supervise(self) -> int:
        """The shared supervisor drives the deployer; masters are kept alive beside it."""
        job = asyncio.create_task(supervise(
            self.deployer, num_pservers=self.spec.pservers,
            registered_pservers=self._registered_pservers, master_state=self._master_state,
            poll_interval=POLL_INTERVAL,
            graces=Graces(done=self.spec.done_grace, exited=TRAINERS_EXITED_GRACE),
            desired_trainers=self._desired_trainers, wake=self.exited,
        ), name="supervise")
        keeper = asyncio.create_task(self._keep_masters(), name="keep-masters")
        stop = asyncio.create_task(self.stopping.wait(), name="stopping")
        schedule = asyncio.create_task(self._follow_schedule(), name="resize-schedule")
        try:
            done, _ = await asyncio.wait({job, keeper, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(job, keeper, stop, schedule)
        if job in done:
            # The masters outlive the end by a page refresh, so an open status page shows it.
            await asyncio.sleep(PAGE_LINGER)
            return 0 if job.result().phase == Phase.SUCCEEDED else 1
        if keeper in done:
            keeper.result()  # raises why the masters cannot go on
        self._event(f"stopping on {signal.Signals(self.stop_signal).name}" if self.stop_signal else "stopping")
        return signal_exit_code(self.stop_signal or signal.SIGTERM)

    async def _keep_masters(self) -> None:
        """Polls the masters' status and starts a dead master again; runs until cancelled."""
        while True:
            await self._poll_status()
            for master in self.masters:
                if master.process is not None and not master.running and not master.expected_exit:
                    await self._restart_master(master)
            await asyncio.sleep(POLL_INTERVAL)

    async def _registered_pservers(self) -> int:
        return len(self._status.pserver_endpoints) if self._status is not None else 0

    async def _master_state(self) -> MasterState:
        phase = self._status.phase if self._status is not None else ""
        return MasterState(has_dataset=True, done=phase == Phase.SUCCEEDED.value,
                           failed=phase == Phase.FAILED.value,
                           tasks_assigned=self._status is None or self._status.tasks_assigned)

    async def _desired_trainers(self) -> int | None:
        """The size the master holds in etcd (ScaleTrainers changes it), None before it answered."""
        return (self._status.desired_trainers or None) if self._status is not None else None

    async def _poll_status(self) -> None:
        try:
            status = await self._leader(POLL_DEADLINE).get_status()
        except grpc.RpcError as error:  # MasterUnavailable too: no leader answered in time
            logger.debug("no status from the master: %s", error)
        else:
            self._status = status
            self._take_status(status)
        self.progress.restarts = self._master_restarts + self.deployer.restarts
        self.on_progress(self.progress)

    def _take_status(self, status: pb.GetStatusResponse) -> None:
        p = self.progress
        p.phase, p.epoch, p.num_epochs = status.phase, status.current_epoch, status.num_epochs or p.num_epochs
        p.done, p.num_tasks = status.counts.done, status.num_tasks
        if status.leader != p.leader:
            p.leader = status.leader
            self._write_handle()
        # the master counts a session alive until its lease lapses (seconds after a SIGKILL):
        # no more trainers are alive than trainer processes run here
        p.trainers_alive = min(status.trainers_alive, sum(t.running for t in self.trainers))
        p.requeued = status.requeued
        p.min_trainers, p.max_trainers = status.min_trainers, status.max_trainers
        p.desired_trainers = status.desired_trainers
        p.trainer_seconds = {e.cause: e.seconds for e in status.trainer_seconds}

    async def _restart_master(self, master: Child) -> None:
        why = f"exited with {master.returncode}"
        if master.returncode == 2:  # bad flags or state: no retry helps
            raise JobFailed(f"{master.name} {why}: {self._last_line(master)} (see {master.log_path})")
        if master.restarts >= self.spec.restart_limit:
            raise JobFailed(f"{master.name} {why}; it was restarted {master.restarts} times "
                            f"(--restart-limit {self.spec.restart_limit})")
        self._master_restarts += 1
        self._event(f"{master.name} {why}: restarting it (restart {master.restarts + 1})")
        await master.restart()

    async def _restart_epoch(self, epoch: int, done: tuple[int, ...] = ()) -> None:
        """RestartEpoch for a group restart, retried while no leader answers (60 s).

        `reopen`: the stopped group may have acknowledged the job's last task, so a job
        whose data is all consumed is read again from the checkpoint. An answer no retry
        changes (a failed job, a bad checkpoint position) fails the job at once. A checkpoint
        saved at the end of the last epoch holds the whole job: nothing is restarted (the
        group reads that checkpoint, is told the job is done, and saves the model from it)."""
        if epoch >= self.progress.num_epochs:
            self._event("the checkpoint holds the whole job: no epoch to restart")
            return
        try:
            await self._leader(OPERATOR_DEADLINE).restart_epoch(epoch, done_tasks=list(done), reopen=True)
        except grpc.RpcError as error:  # a refusal, or no leader in OPERATOR_DEADLINE
            raise JobFailed(f"could not restart epoch {epoch}: {error.details()}") from None
        self._event(f"the master restarted epoch {epoch}"
                    + (f" with the checkpoint's {len(done)} tasks done" if done else ""))
        await self._poll_status()  # the phase the supervisor reads next is the reopened one

    async def scale(self, trainers: int) -> pb.ScaleTrainersResponse | None:
        """`ScaleTrainers` on the leader (None while no status poll named one yet); raises the
        master's refusal or MasterUnavailable (both grpc.RpcError)."""
        if not self.progress.leader:
            return None
        return await self._leader(OPERATOR_DEADLINE).scale_trainers(trainers)

    async def _follow_schedule(self) -> None:
        """`--resize-schedule`: ScaleTrainers at each step's time since the job started, on the
        leader (the deployer converges as for `paddlecloud job scale`); ends after the last step."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        for at, size in self.spec.resize_schedule:
            await asyncio.sleep(max(0.0, started + at - loop.time()))
            while True:
                try:
                    if await self.scale(size) is not None:
                        self._event(f"resize schedule: {size} trainers at {at:g}s")
                        break
                    await asyncio.sleep(POLL_INTERVAL)  # no leader known yet
                except MasterUnavailable:
                    await asyncio.sleep(POLL_INTERVAL)  # no leader serving yet
                except grpc.RpcError as error:
                    if error.code() == grpc.StatusCode.INVALID_ARGUMENT:  # e.g. etcd's range differs
                        self._event(f"resize schedule: {size} trainers at {at:g}s refused: "
                                    f"{error.details()}")
                        break
                    await asyncio.sleep(POLL_INTERVAL)  # no leader serving yet, or it changed

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

    def _leader(self, deadline: float) -> MasterConnection:
        """The client of the leader whose calls give up after `deadline` seconds (made on first use)."""
        if deadline not in self._masters:
            self._masters[deadline] = MasterConnection(MasterLocator.from_env(self._env()), deadline=deadline,
                                                       credentials=self.credentials)
        return self._masters[deadline]

    def _write_secrets(self) -> None:
        """This run's tokens and (with `tls`) a CA and the masters' certificate, under
        OUTPUT/.paddlecloud (mode 0700; files 0600); the supervisor acts as the operator."""
        self.secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        tokens = JobTokens.generate()
        tokens.write(self.secrets_dir / "tokens")
        ca = None
        if self.spec.tls:
            ca = LocalCA.create(f"paddlecloud {self.spec.job} CA")
            ca.write_cert(self.secrets_dir / "ca.crt")
            ca.issue(self.secrets_dir, "master", hosts=("127.0.0.1", "localhost"))
        self.credentials = ClientCredentials(token=tokens.operator, ca=ca.pem if ca else None)
        self._page_token = tokens.viewer

    async def _stop_all(self) -> None:
        LocalJobHandle.remove(self.spec.output)
        await self.deployer.cleanup(succeeded=False)
        if self.spec.container is not None:  # a wrapper killed before it removed its container
            left = await asyncio.to_thread(remove_containers, self.spec.container.engine,
                                           self.spec.container.run)
            if left:
                self._event(f"removed the containers left running: {', '.join(left)}")
        await asyncio.gather(*(c.stop(grace=10) for c in self.masters), return_exceptions=True)
        for connection in self._masters.values():
            await connection.close()
        self._masters.clear()
        if self.gloo_store is not None:
            await asyncio.to_thread(self.gloo_store.close)
        if self.etcd_server is not None:
            await asyncio.to_thread(self.etcd_server.stop)
        if self._etcd_dir is not None:
            shutil.rmtree(self._etcd_dir, ignore_errors=True)


def gloo_trainers(spec: LocalJobSpec) -> bool:
    """Whether the job is a PS job whose trainers Paddle joins in one gloo world: its
    environment (the user's `-e`, else this one) says `PADDLE_WITH_GLOO` 1 or 2."""
    env = {**os.environ, **dict(spec.env)}
    return spec.pservers > 0 and env.get("PADDLE_WITH_GLOO", "0").strip() in ("1", "2")


def master_address(master: Child) -> str:
    """The HOST:PORT a master child advertises (its `--advertise` flag)."""
    return master.command[master.command.index("--advertise") + 1]


def resume_epoch(output: Path) -> int:
    """The epoch a local job resumes at: its last checkpoint's `TrainStatus.next()`, else 0."""
    return checkpoints.resume_epoch(checkpoints.checkpoints_dir(str(output)))
