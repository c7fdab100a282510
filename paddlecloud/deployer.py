"""The `Deployer` contract: what runs one job's pservers and trainers, on any backend.

Two backends implement it: `paddlecloud.backends.k8s.deployer.KubernetesDeployer` (a StatefulSet
and an Indexed Job, driven by the job's leading master) and
`paddlecloud.backends.local.deployer.LocalDeployer` (child processes, driven by
`paddlecloud local train`). Both are driven by one loop,
`paddlecloud.supervision.supervise`, which calls, in this order:

    create_pservers()                      the pservers (none for collective jobs)
    ... until every pserver registered in etcd (the loop asks the master, not the backend)
    create_trainers()                      the trainer group, ids 0..N-1
    every poll: scale(desired) when the master's desired size is known, reconcile(),
                trainer_status()
    once the master's data is done or failed: finishing(); reconcile() no more once it failed
    whenever suspend_requested(): suspend(), then, once it is not requested any more, the
                job is deployed again from create_pservers() (it resumes at its checkpoint)
    show_phase(phase, reason=...)          at every phase change
    cleanup(succeeded=...)                 per the job's cleanPodPolicy

and decides the job's phase from the master's state and `trainer_status()` with one
pure function (`paddlecloud.supervision.decide_phase`), so the backends cannot
disagree about a job's end.

Every method must be idempotent: a master that took over from a dead leader calls
them all again, and what already exists is adopted, not duplicated.

Elastic jobs (docs/design.md section 11): `scale(n)` takes the trainers' desired size
(the master holds it in etcd; the supervisor hands it over at every poll) and
converges to it — in PS mode by adding or removing trainers while the others go
on (Kubernetes: the Indexed Job's parallelism and completions; local: launchers
started, or stopped with SIGTERM so they leave the master and their tasks return
at once); in collective mode, where a group cannot change its world size in
flight, by `restart_trainers()`: the whole group stopped, the master's epoch
restarted at the checkpoint, the group started again at the new size with ids
0..N-1.

What this does NOT guarantee: anything about the master's own processes (the
Kubernetes Deployment, or the local job's master children): they run the deployer.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from paddlecloud.phase import Phase

# A file's path: the trainer launcher (trainer_agent.launcher) starts its command only once the
# file exists. The local backend's group restart starts the new launchers while the old group
# stops, and creates the file once the old group is gone and the master restarted the epoch.
START_GATE_ENV = "PADDLECLOUD_START_GATE"
# "1" tells a pserver (its agent, and through the agent the pserver) to load the job's last
# checkpoint from its first start: a job resumed from one (pserver_agent/supervisor.py)
PSERVER_RESTORE_ENV = "PADDLECLOUD_PSERVER_RESTORE"


@dataclass(frozen=True)
class RoleStatus:
    """What a backend sees of one role's members (pods or child processes).

    `active`: running, or failed and about to be replaced (the backend still
    tries); `succeeded`: members whose last run exited 0; `failed`: failed runs the
    backend counts (Kubernetes: every failed pod; local: members whose last run
    failed). `detail` says why the backend gave up, when it did.
    """

    desired: int
    active: int = 0
    succeeded: int = 0
    failed: int = 0
    detail: str = field(default="", compare=False)  # words for people, not a state

    @property
    def finished(self) -> bool:
        """Every member's last run exited 0."""
        return self.desired > 0 and self.succeeded >= self.desired

    @property
    def gave_up(self) -> bool:
        """Failed for good: nothing runs or will be replaced, something failed, not all finished."""
        return self.failed > 0 and self.active == 0 and not self.finished

    def describe(self) -> str:
        counts = (f"{self.active} active, {self.succeeded} succeeded, {self.failed} failed "
                  f"of {self.desired}")
        return f"{counts} ({self.detail})" if self.detail else counts


class Deployer(abc.ABC):
    """Creates, observes, replaces and removes the pservers and trainers of one job."""

    @abc.abstractmethod
    async def create_pservers(self) -> None:
        """Creates the pservers (no-op when the job has none, or they exist)."""

    @abc.abstractmethod
    async def create_trainers(self) -> None:
        """Creates the trainer group; only called once every pserver has registered."""

    @abc.abstractmethod
    async def scale(self, trainers: int) -> None:
        """Converges the trainer group to `trainers` members (the master checked the range).

        A no-op when the group has that size already (or is converging to it); PS
        mode adds or removes members, collective mode restarts the group.
        """

    @abc.abstractmethod
    async def restart_trainers(self) -> None:
        """Stops every trainer, restarts the master's epoch at the checkpoint, starts the group again."""

    @abc.abstractmethod
    async def reconcile(self) -> None:
        """Replaces the members that died, within the backend's restart limit.

        Kubernetes: nothing to do, its controllers replace pods. Local: a dead
        trainer (or, for collective jobs, the whole group) and dead pservers are
        started again; past the limit the backend gives up on the trainers
        (`trainer_status().gave_up`).
        """

    @abc.abstractmethod
    async def finishing(self) -> None:
        """The master's data is done or failed: from now on nothing is resized, and a PS
        trainer or a pserver that exits is not replaced. A collective group that loses a
        member after the data is done is still restarted by `reconcile` (while the data
        has not failed): what it trained since its checkpoint is in no saved model, and the
        restart reopens the job there (`RestartEpoch` with `reopen`)."""

    @abc.abstractmethod
    async def trainer_status(self) -> RoleStatus:
        """The trainers as the backend sees them now."""

    @abc.abstractmethod
    async def show_phase(self, phase: Phase, *, reason: str = "") -> None:
        """Shows the job's phase where users look (Kubernetes: annotations of the master
        Deployment; local: a line on the console). etcd's `phase` key, written by the
        master, stays the truth: this is a view of it, and may fail."""

    async def suspend_requested(self) -> bool:
        """Whether the job must stop for now and resume later (Kubernetes: the operator's
        request on the master Deployment, for spec.suspend or a Kueue eviction); a backend
        that cannot be suspended answers False."""
        return False

    async def suspend(self) -> None:
        """Stops the trainers (each drains and saves) and the pservers, for a suspend; the
        next `create_pservers`/`create_trainers` resume the job at its checkpoint."""
        raise NotImplementedError(f"{type(self).__name__} cannot suspend a job")

    @abc.abstractmethod
    async def cleanup(self, *, succeeded: bool) -> None:
        """Removes what the job's cleanPodPolicy says should go when the job ends.

        A backend whose members cannot outlive it (local child processes) stops them all.
        """
