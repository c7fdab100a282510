"""`LocalDeployer`: the `Deployer` of `paddlecloud local train` — pservers and trainers as child processes.

What a StatefulSet and an Indexed Job are on Kubernetes, child processes are here:
`create_pservers` starts the pserver agents (told to have their pservers restore the
checkpoint when the output holds one: a job resumed), `create_trainers` the trainer launchers
(ids 0..N-1; for collective jobs with the group's endpoints), and `reconcile`
plays the controllers: a dead pserver is started again, and a dead trainer too — in
`trainer` restart mode alone, with the same id (it rejoins the master); in `group`
mode (collective training, where a group cannot lose a member) by
`restart_trainers`: every trainer stopped, the master told to restart the epoch the
last checkpoint resumes at, the whole group started again. The new group's launchers
start at once, beside the old group's stop, and wait at a start gate
(`paddlecloud.deployer.START_GATE_ENV`) that opens when the old group is gone and the
epoch restarted: the launchers' own start overlaps the stop, while no new trainer reads a
checkpoint the old group may still be writing, nor takes a task before the restart. A
collective group's rank 0 is let through first (`PEER_HEAD_START`), so its gloo store
listens before its peers ask. Past `--restart-limit`
the deployer gives up on the trainers as a Job past its backoffLimit does: every
trainer is stopped and `trainer_status()` reports the reason. A pserver past the
limit raises `JobFailed`. Once the data is done (`finishing`) nothing is resized or
replaced, but a group that loses a member is still restarted: the master reopens the
job at the checkpoint.

A PS job whose trainers Paddle joins in one gloo world (`PADDLE_WITH_GLOO`; the deployer is
given `rendezvous_reset`, which empties the job's store, `paddlecloud.gloo_store`) restarts
its trainer group in `trainer` mode too: Paddle makes that world once, at `fleet.init`, so a
trainer cannot rejoin it alone (its rendezvous waits for peers that never rendezvous again, and
a survivor's next barrier fails on the dead pair). Every trainer is stopped (each launcher
gives its task back), the store emptied, and every trainer started again with its id; the
pservers and their model stay (async PS: the model is theirs), so the master's epoch is not
restarted, and the new trainer 0 pulls the model instead of pushing fresh parameters
(`paddlecloud.fleet_ps`, told by its launcher).

`scale(n)` resizes the group: in `trainer` mode (PS) by starting launchers with
the next ids (under gloo by a new group of the new size, as above), or stopping the highest ids with SIGTERM (a trainer that handles it
leaves the master: its tasks return at once, no failure counted; one that does not
is killed after the grace and its lease lapses); in `group` mode by a group
restart at the new size (PADDLE_TRAINERS_NUM, the endpoints and ids 0..N-1
recomputed), which does not count against the restart limit.

What this does NOT do: isolate children (they run as this user, on this machine),
nor keep any process after `cleanup` — a local job's processes cannot outlive it,
whatever the clean-pod policy.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import shutil
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from paddlecloud import checkpoints
from paddlecloud.backends.local.children import Child
from paddlecloud.deployer import PSERVER_RESTORE_ENV, START_GATE_ENV, Deployer, RoleStatus
from paddlecloud.etcd_server import free_ports
from paddlecloud.exits import STOP_GRACE_ENV, signal_exit_code
from paddlecloud.paddle_launcher import launcher_env
from paddlecloud.phase import Phase

logger = logging.getLogger(__name__)

RESTART_MODES = ("group", "trainer")
PSERVER_RESTART_MODES = ("self", "group")
# A group that lost a member cannot drain (its collectives wait for the dead one): its
# survivors get just the time to leave the master (trainer_agent.termination.LEAVE_TIMEOUT)
# before the SIGKILL. A planned stop (a resize, a scale-down, the job stopped) lets trainers
# that drain to a checkpoint on SIGTERM do so within DRAIN_GRACE, which they are told
# ($PADDLECLOUD_STOP_GRACE), before the SIGKILL.
GROUP_STOP_GRACE = 2.5
DRAIN_GRACE = 20.0
STOP_GRACE = DRAIN_GRACE + 5.0
# When a restarted collective group's gate opens, rank 0 starts this many seconds before its
# peers: Paddle's TCPStore client that finds rank 0's store not yet listening tries again only
# 3 s later (paddle/phi/core/distributed/store/tcp_utils.cc), and ranks that start at once
# finish importing Paddle together, the peers' connect a moment before rank 0's listen.
PEER_HEAD_START = 0.5


class JobFailed(RuntimeError):
    """The job cannot go on (restart limits reached); the message says why."""


class LocalDeployer(Deployer):
    """The pservers and trainers of one local job, as child processes.

    `spawn(role, index, command, env)` makes a child (the job decides where its log
    goes); `user_env()` is the environment of the user's code (with its package
    path); `restart_epoch(epoch, done)` asks the master to restart an epoch with the tasks
    a checkpoint saved inside it consumed done (group mode).
    """

    def __init__(self, *, trainers: int, pservers: int, trainer_command: list[str],
                 pserver_command: list[str], output: Path, restart_limit: int, restart_mode: str,
                 spawn: Callable[[str, int, list[str], dict[str, str]], Child],
                 user_env: Callable[[], dict[str, str]],
                 restart_epoch: Callable[[int, tuple[int, ...]], Awaitable[None]],
                 event: Callable[[str], None], pserver_restart: str = "self",
                 rendezvous_reset: Callable[[], None] | None = None) -> None:
        if pserver_restart not in PSERVER_RESTART_MODES:
            raise ValueError(f"pserver restart {pserver_restart!r}: must be one of "
                             f"{', '.join(PSERVER_RESTART_MODES)}")
        if restart_mode not in RESTART_MODES:
            raise ValueError(f"restart mode {restart_mode!r}: must be one of {', '.join(RESTART_MODES)}")
        if trainers < 1 or pservers < 0 or restart_limit < 0:
            raise ValueError(f"trainers={trainers} pservers={pservers} restart_limit={restart_limit}: "
                             "need trainers >= 1, pservers >= 0, restart_limit >= 0")
        self.num_trainers, self.num_pservers = trainers, pservers
        self.trainer_command, self.pserver_command = trainer_command, pserver_command
        self.output = output
        self.restart_limit, self.restart_mode = restart_limit, restart_mode
        self._spawn, self._user_env = spawn, user_env
        self._restart_epoch, self._event = restart_epoch, event
        self._rendezvous_reset = rendezvous_reset  # set: the trainers share one gloo world
        self.pservers: list[Child] = []
        self.trainers: list[Child] = []
        self._next: list[Child] = []  # a restarting group's new members, at their start gate
        self._gates: Path | None = None  # the start gates' directory (made at the first restart)
        self.restarts = 0
        self.pserver_restart = pserver_restart
        self._ps_group_restarts = 0
        self._restore_trainers = False  # the next trainers' trainer 0 loads the checkpoint into the pservers
        self._replacing = True
        self._gave_up = ""

    # ---- Deployer ---------------------------------------------------------------------
    async def create_pservers(self) -> None:
        if self.pservers:
            return
        env = self._user_env()
        self._restore_trainers = self._has_checkpoint()
        if self._restore_trainers:  # a job resumed: its pservers load the model it saved
            env[PSERVER_RESTORE_ENV] = "1"
        for index in range(self.num_pservers):
            child = self._spawn("pserver", index, self.pserver_command, dict(env))
            await child.start()
            self.pservers.append(child)

    def _has_checkpoint(self) -> bool:
        return checkpoints.has_checkpoint(checkpoints.checkpoints_dir(str(self.output)))

    async def create_trainers(self) -> None:
        if not self.trainers:
            await self._start_trainers()

    async def scale(self, trainers: int) -> None:
        if trainers < 1:
            raise ValueError(f"scale to {trainers} trainers: need at least 1")
        if trainers == self.num_trainers or not self._replacing or self._gave_up:
            return
        before, self.num_trainers = self.num_trainers, trainers
        if not self.trainers:
            return  # not created yet: create_trainers starts the new size
        self._event(f"scaling the trainers {before} -> {trainers}")
        if self.restart_mode == "group":
            await self._restart_group(counted=False)
        elif self._rendezvous_reset is not None:  # a gloo world's size is fixed: a new one
            await self._regroup_gloo_trainers(counted=False)
        elif trainers > len(self.trainers):
            self.trainers += await self._spawn_trainers(range(len(self.trainers), trainers))
        else:
            leaving, self.trainers = self.trainers[trainers:], self.trainers[:trainers]
            await asyncio.gather(*(t.stop(grace=STOP_GRACE) for t in leaving))

    async def reconcile(self) -> None:
        if self._gave_up:
            return
        for pserver in self.pservers if self._replacing else ():
            # exit 0 is the agent's own end (it saw the job finish before this loop did)
            if self._dead(pserver) and self.pserver_restart == "group":
                await self._restart_ps_group(pserver)
                return
            if self._dead(pserver):
                if pserver.restarts >= self.restart_limit:
                    raise JobFailed(f"{pserver.name} exited with {pserver.returncode}; it was restarted "
                                    f"{pserver.restarts} times (--restart-limit {self.restart_limit})")
                await self._restart(pserver)
        dead = [t for t in self.trainers if self._dead(t)]
        if not dead:
            return
        if self.restart_mode == "trainer":
            if not self._replacing:
                return
            if self._rendezvous_reset is not None:
                await self._restart_gloo_trainers(dead)
                return
            for trainer in dead:
                if trainer.restarts >= self.restart_limit:
                    await self._give_up(f"{trainer.name} exited with {trainer.returncode}; it was "
                                        f"restarted {trainer.restarts} times "
                                        f"(--restart-limit {self.restart_limit})")
                    return
                await self._restart(trainer)
        else:
            if await self._group_restarts_spent(dead):
                return
            # also once the data is done: the master reopens the job at the checkpoint
            self._event(f"{group_loss(dead)}: restarting the trainer group")
            await self._restart_group(counted=True, lost=dead)

    async def finishing(self) -> None:
        """No more resizes nor replacements, but a group restart (see `Deployer.finishing`)."""
        self._replacing = False

    async def trainer_status(self) -> RoleStatus:
        succeeded = sum(t.returncode == 0 for t in self.trainers)
        failed = sum(t.returncode not in (0, None) for t in self.trainers)
        if self._gave_up:
            return RoleStatus(desired=self.num_trainers, active=0, succeeded=succeeded,
                              failed=max(failed, 1), detail=self._gave_up)
        running = sum(t.running for t in self.trainers)
        # a dead trainer is replaced by the next reconcile while replacing goes on (a group
        # is restarted whenever it loses one)
        replacing = self._replacing or self.restart_mode == "group"
        replaced = sum(self._dead(t) for t in self.trainers) if replacing else 0
        return RoleStatus(desired=self.num_trainers, active=running + replaced,
                          succeeded=succeeded, failed=failed)

    async def show_phase(self, phase: Phase, *, reason: str = "") -> None:
        self._event(f"job {phase}: {reason}" if reason else f"job {phase}")

    async def cleanup(self, *, succeeded: bool) -> None:
        # trainers first: a draining trainer's save may still need its pserver
        await asyncio.gather(*(c.stop(grace=STOP_GRACE) for c in [*self.trainers, *self._next]),
                             return_exceptions=True)
        await asyncio.gather(*(c.stop(grace=STOP_GRACE) for c in self.pservers), return_exceptions=True)
        if self._gates is not None:
            shutil.rmtree(self._gates, ignore_errors=True)

    # ---- restarts ---------------------------------------------------------------------
    async def restart_trainers(self) -> None:
        """Collective training: stop the group, restart the checkpoint's epoch, start all again."""
        await self._restart_group(counted=True)

    async def _restart_group(self, *, counted: bool, lost: list[Child] | None = None) -> None:
        """The group restart; `counted` (a death, not a resize) counts against the limit.
        `lost`: the members whose death caused it (already told); a survivor that aborted
        before its stop ended it is told as that death's consequence.

        The new launchers start first, held at a start gate that opens once the old group is
        gone and the master restarted the checkpoint's epoch (see the module's docstring)."""
        restarts = max((t.restarts for t in self.trainers), default=0)
        grace = GROUP_STOP_GRACE if counted else STOP_GRACE  # a death's survivors cannot drain
        gate = self._new_gate()
        # filled as they start: `cleanup` stops them when the restart fails or is cancelled
        self._next = []
        await self._spawn_trainers(range(self.num_trainers), gate=gate, into=self._next)
        await asyncio.gather(*(t.stop(grace=grace) for t in self.trainers))
        if lost and (followers := aborted_after(self.trainers, lost)):
            self._event(followers)
        epoch, done = checkpoints.resume_point(checkpoints.checkpoints_dir(str(self.output)))
        await self._restart_epoch(epoch, done)
        await self._open(gate)
        self.trainers, self._next = self._next, []
        for trainer in self.trainers:
            trainer.restarts = restarts + counted
        self.restarts += 1

    async def _group_restarts_spent(self, dead: list[Child]) -> bool:
        """Whether the trainer group has been restarted `restart_limit` times already: then the
        job gives up (`_give_up`), naming the death that would have been one restart more."""
        restarts = max(t.restarts for t in self.trainers)
        if restarts < self.restart_limit:
            return False
        await self._give_up(f"{dead[0].name} exited with {dead[0].returncode}; the trainer "
                            f"group was restarted {restarts} times "
                            f"(--restart-limit {self.restart_limit})")
        return True

    async def _restart_gloo_trainers(self, dead: list[Child]) -> None:
        """A PS job's gloo trainer died: the group restarts on the live model (see the module's
        docstring), counted against the restart limit as a group restart is."""
        if await self._group_restarts_spent(dead):
            return
        self._event(f"{group_loss(dead)}: restarting the trainer group (its gloo world cannot "
                    "take a trainer back alone; the pservers keep the model)")
        await self._regroup_gloo_trainers(counted=True, lost=dead)

    async def _regroup_gloo_trainers(self, *, counted: bool, lost: list[Child] | None = None) -> None:
        """Every trainer stopped (each launcher gives its task back), the rendezvous store
        emptied (the new group must not read the old one's addresses), `num_trainers` trainers
        started with ids 0..N-1: a gloo world of the new size. The pservers and the master's
        epoch stay. `counted` (a death, not a resize) counts against the restart limit."""
        restarts = max((t.restarts for t in self.trainers), default=0)
        grace = GROUP_STOP_GRACE if counted else STOP_GRACE  # a death's survivors cannot drain
        await asyncio.gather(*(t.stop(grace=grace) for t in self.trainers))
        if lost and (followers := aborted_after(self.trainers, lost)):
            self._event(followers)
        assert self._rendezvous_reset is not None
        self._rendezvous_reset()
        self._restore_trainers = False  # the pservers' live model stays theirs
        self.restarts += 1
        self.trainers = []
        await self._spawn_trainers(range(self.num_trainers), into=self.trainers)
        for trainer in self.trainers:
            trainer.restarts = restarts + counted

    async def _restart_ps_group(self, dead: Child) -> None:
        """`--pserver-restart group` (Paddle's fleet PS: its trainers abort when a pserver dies,
        and a restarted pserver's tables are empty): every trainer and pserver stopped, the
        master's epoch restarted at the last checkpoint, the pservers started again told to
        restore it, then the trainers (trainer 0 loads the checkpoint's tables into them)."""
        if self._ps_group_restarts >= self.restart_limit:
            raise JobFailed(f"{dead.name} exited with {dead.returncode}; the PS group was restarted "
                            f"{self._ps_group_restarts} times (--restart-limit {self.restart_limit})")
        self._ps_group_restarts += 1
        self.restarts += 1
        self._event(f"{dead.name} exited with {dead.returncode}: restarting the pservers and trainers "
                    f"from the last checkpoint (PS group restart {self._ps_group_restarts})")
        await asyncio.gather(*(t.stop(grace=GROUP_STOP_GRACE) for t in self.trainers))
        await asyncio.gather(*(p.stop(grace=STOP_GRACE) for p in self.pservers))
        epoch, done = checkpoints.resume_point(checkpoints.checkpoints_dir(str(self.output)))
        await self._restart_epoch(epoch, done)
        self.pservers, self.trainers = [], []
        if self._rendezvous_reset is not None:  # the new trainers make a new gloo world
            self._rendezvous_reset()
        await self.create_pservers()
        await self._start_trainers()

    async def _open(self, gate: Path) -> None:
        """Opens a restart's gate: rank 0's, then (a collective group) its peers' a moment later."""
        await asyncio.to_thread(gate.touch)
        peers = self._gate_of(gate, 1)
        if peers != gate:
            await asyncio.sleep(PEER_HEAD_START)
            await asyncio.to_thread(peers.touch)

    def _gate_of(self, gate: Path, index: int) -> Path:
        """Trainer `index`'s gate: in a collective group rank 0 has one of its own."""
        return gate if index == 0 or self.num_pservers else gate.with_name(f"{gate.name}-peers")

    def _new_gate(self) -> Path:
        """A start gate's path, not created yet (one per group restart)."""
        if self._gates is None:
            self._gates = Path(tempfile.mkdtemp(prefix="paddlecloud-start-gates-"))
        return self._gates / f"group-{self.restarts + 1}"

    async def _restart(self, child: Child) -> None:
        if child.role == "trainer":  # a trainer restarted alone finds the pservers' live model:
            child.env.pop(PSERVER_RESTORE_ENV, None)  # it must not load the checkpoint over it
        self.restarts += 1
        self._event(f"{child.name} exited with {child.returncode}: restarting it "
                    f"(restart {child.restarts + 1})")
        await child.restart()

    async def _give_up(self, reason: str) -> None:
        self._gave_up = reason
        self._event(f"giving up on the trainers: {reason}")
        await asyncio.gather(*(t.stop(grace=GROUP_STOP_GRACE) for t in self.trainers))

    @staticmethod
    def _dead(child: Child) -> bool:
        """Died by itself with an error (not stopped on purpose, not finished)."""
        return (child.process is not None and not child.running
                and child.returncode not in (0, None) and not child.expected_exit)

    async def _start_trainers(self) -> None:
        self.trainers = await self._spawn_trainers(range(self.num_trainers))

    async def _spawn_trainers(self, indexes: range, *, gate: Path | None = None,
                              into: list[Child] | None = None) -> list[Child]:
        """Launchers for trainer ids `indexes` (of a group of `num_trainers`), started and
        appended to `into` (returned); with `gate`, each starts its command once that file exists."""
        ports = free_ports(self.num_trainers)
        started = [] if into is None else into
        for index in indexes:
            env = self._trainer_env(index, ports)
            if gate is not None:
                env[START_GATE_ENV] = str(self._gate_of(gate, index))
            child = self._spawn("trainer", index, self.trainer_command, env)
            await child.start()
            started.append(child)
        return started

    def _trainer_env(self, index: int, ports: list[int]) -> dict[str, str]:
        env = self._user_env()
        if self._restore_trainers:
            env[PSERVER_RESTORE_ENV] = "1"
        env["PADDLE_TRAINER_ID"] = str(index)
        env["PADDLE_TRAINERS_NUM"] = str(self.num_trainers)
        env.setdefault(STOP_GRACE_ENV, f"{DRAIN_GRACE:g}")
        if self.num_pservers == 0:  # collective training: the group's endpoints
            hosts = trainer_hosts(self.num_trainers)
            endpoints = [f"{h}:{p}" for h, p in zip(hosts, ports, strict=True)]
            env.update(PADDLE_TRAINER_ENDPOINTS=",".join(endpoints), POD_IP=hosts[index],
                       PADDLE_CURRENT_ENDPOINT=endpoints[index], PADDLE_PORT=str(ports[index]),
                       # Paddle 2.x's launcher: the trainers' ports differ here (one machine)
                       DISTRIBUTED_TRAINER_ENDPOINTS=",".join(endpoints),
                       **launcher_env(endpoints, str(index)))
        else:  # a fleet PS trainer's PaddleCloudRoleMaker needs its own PADDLE_PORT and the
            # trainers' endpoints too (paddle-operator sets both)
            endpoints = [f"127.0.0.1:{p}" for p in ports]
            env.update(PADDLE_TRAINER_ENDPOINTS=",".join(endpoints), PADDLE_PORT=str(ports[index]))
        return env


def trainer_hosts(count: int) -> list[str]:
    """A loopback address of its own per trainer of a collective group (Linux routes all of
    127.0.0.0/8 to loopback): Paddle's launcher counts the group's nodes by the endpoints'
    distinct hosts, and the one whose POD_IP is the first endpoint's host serves its
    rendezvous (`paddlecloud.paddle_launcher`). From 127.0.0.2: the launcher would also serve
    on every node when that host were 127.0.0.1."""
    first = ipaddress.IPv4Address("127.0.0.2")
    return [str(first + i) for i in range(count)]


def launcher_command(role: str, user_command: list[str], *flags: str) -> list[str]:
    """`paddlecloud pserver|trainer [FLAGS] -- USER COMMAND`, with this Python."""
    return [sys.executable, "-m", "paddlecloud", role, *flags, "--", *user_command]


ABORTED = signal_exit_code(signal.SIGABRT)  # a launcher's code for a trainer that aborted


def aborted_after(group: list[Child], lost: list[Child]) -> str:
    """The survivors of `group` that aborted (gloo's abort once its peer vanished) after the
    `lost` members died, told as that death's consequence; "" when none did."""
    followers = [t for t in group if t not in lost and t.returncode == ABORTED]
    if not followers:
        return ""
    return (f"{', '.join(t.name for t in followers)} aborted without its gloo peer "
            f"after {', '.join(t.name for t in lost)} died")


def group_loss(dead: list[Child]) -> str:
    """Which members of a collective group died: a member that aborted (SIGABRT: gloo's
    IoException once a peer vanished) beside one that died otherwise is its consequence,
    named as such, not a second cause."""
    causes = [t for t in dead if t.returncode != ABORTED] or dead
    followers = [t for t in dead if t not in causes]
    text = f"{', '.join(t.name for t in causes)} died"
    if followers:
        text += f", and {', '.join(t.name for t in followers)} aborted without its gloo peer"
    return text
