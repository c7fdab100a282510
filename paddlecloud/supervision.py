"""One supervisor for every backend: drive a `Deployer` through a job's phases, decide its end.

    Pending -> (create pservers) -> Starting -> (every pserver registered in etcd)
    -> (create trainers) -> Running -> Succeeded | Failed -> (clean-up per policy)

`decide_phase` is the one decision of a job's end, a pure function of what the
master's data says (`MasterState`) and what the backend reports of the trainers
(`RoleStatus`):

| master's data | trainers                          | phase                              |
| ------------- | --------------------------------- | ---------------------------------- |
| failed        | any                               | Failed                             |
| done          | gave up (failed, none active)     | Failed                             |
| done          | none active                       | Succeeded                          |
| done          | some still active                 | Succeeded once `done_grace` passed |
| not done      | gave up                           | Failed                             |
| not done      | all exited 0, no dataset          | Succeeded (deploy-and-monitor)     |
| not done      | all exited 0, no task ever taken  | Succeeded once `exited_grace`      |
|               |                                   | passed: the job read its own data  |
| not done      | all exited 0, tasks were taken    | Failed once `exited_grace` passed: |
|               |                                   | the job did not consume its data   |
| not done      | otherwise                         | Running                            |

The graces cover two clocks that are not one: trainers that hang after their last
task, and a master's view (polled, or rebuilt after a failover) that lags the
trainers' exit by a moment. A verdict that needs a grace is final only when the same
phase was decided for that long.

A suspend (Kubernetes: spec.suspend or a Kueue eviction, asked by the operator on the
master Deployment) is acted on wherever the supervisor waits: the deployer drains the
trainers and removes the workloads (`Deployer.suspend`), the supervisor waits until the
suspend is lifted, then deploys the job again from its pservers, at its checkpoint. The
master stays the one writer of its workloads (docs/architecture.md).

`supervise` is safe to call again after a failover: every deployer call is
idempotent, a phase is never written backwards (pass what etcd holds as
`initial_phase`), and a job already Succeeded or Failed only gets its clean-up
repeated. What it does NOT guarantee: that pservers ever register (a pserver that
crashes forever keeps the job Starting), nor a timeout of its own — the caller
cancels it (e.g. when leadership is lost); cancellation leaves every member in
place for the next leader.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from paddlecloud.deployer import Deployer, RoleStatus
from paddlecloud.phase import Phase

logger = logging.getLogger(__name__)

MAX_POLL_ERRORS = 5  # consecutive failures to read the trainers' state before giving up


@dataclass(frozen=True)
class MasterState:
    """What the master's data says of the job: the only truth about its progress."""

    has_dataset: bool
    done: bool = False
    failed: bool = False
    # a trainer ever took a task; False: the trainers read their own data (as under
    # paddle-operator) and their exits alone end the job (docs/design.md section 12)
    tasks_assigned: bool = True

    @property
    def over(self) -> bool:
        return self.done or self.failed


@dataclass(frozen=True)
class Graces:
    """Seconds a verdict must hold before it is final (see the module's table)."""

    done: float = 300.0   # trainers still running after the data is done get this long
    exited: float = 5.0   # the master's state may lag the trainers' exit this long

    def __post_init__(self) -> None:
        if self.done < 0 or self.exited < 0:
            raise ValueError(f"graces done={self.done:g}s exited={self.exited:g}s: must be >= 0")


@dataclass(frozen=True)
class Verdict:
    """A phase decided now, why, and how long it must hold before it is final."""

    phase: Phase
    reason: str = ""
    hold: float = 0.0


def decide_phase(master: MasterState, trainers: RoleStatus, *, graces: Graces = Graces()) -> Verdict:
    """The job's phase from the master's data and the trainers (pure; see the module's table)."""
    if master.failed:
        return Verdict(Phase.FAILED, "every task of an epoch failed: the data could not be read")
    if master.done:
        if trainers.gave_up:
            return Verdict(Phase.FAILED, f"the data is done but the trainers failed: {trainers.describe()}")
        if trainers.active == 0:
            return Verdict(Phase.SUCCEEDED, "the data is done and no trainer runs")
        return Verdict(Phase.SUCCEEDED, f"the data is done; trainers still running after "
                       f"{graces.done:g}s were left to the clean-up", hold=graces.done)
    if trainers.gave_up:
        return Verdict(Phase.FAILED, f"the trainers failed: {trainers.describe()}")
    if trainers.finished:
        if not master.has_dataset:
            return Verdict(Phase.SUCCEEDED, "every trainer finished (no dataset to wait for)")
        if not master.tasks_assigned:  # held: the master's view may lag a first task taken
            return Verdict(Phase.SUCCEEDED, "every trainer exited 0 and none took a task from the "
                           "master: the job read its own data", hold=graces.exited)
        return Verdict(Phase.FAILED, "every trainer exited 0 but the data is not done: the job did "
                       "not consume its data", hold=graces.exited)
    return Verdict(Phase.RUNNING)


class _Settle:
    """Makes a verdict final once the same phase was decided for its `hold` seconds."""

    def __init__(self) -> None:
        self._phase: Phase | None = None
        self._since = 0.0

    def final(self, verdict: Verdict, now: float) -> bool:
        if verdict.phase != self._phase:
            self._phase, self._since = verdict.phase, now
        return verdict.phase.terminal and now - self._since >= verdict.hold


async def supervise(
    deployer: Deployer,
    *,
    num_pservers: int,
    registered_pservers: Callable[[], Awaitable[int]],
    master_state: Callable[[], Awaitable[MasterState]],
    set_phase: Callable[[Phase, str], Awaitable[None]] | None = None,
    poll_interval: float = 2.0,
    initial_phase: Phase | None = None,
    graces: Graces = Graces(),
    desired_trainers: Callable[[], Awaitable[int | None]] | None = None,
    wake: asyncio.Event | None = None,
) -> Verdict:
    """Runs the job to its end and returns the final verdict (Succeeded or Failed).

    `registered_pservers()` counts the pservers registered in etcd; `master_state()`
    reads the master's data; `set_phase(phase, reason)` records a phase (the master:
    its fenced etcd write; None where the master's data is the only record, locally)
    before the deployer shows it; `initial_phase` is the phase etcd holds, if any;
    `desired_trainers()` is the trainers' desired size the master holds (None while
    unknown), handed to `deployer.scale` at every poll until the data is done; `wake`, set
    (e.g. when a member exits), ends the wait for the next poll at once.
    """
    if num_pservers < 0:
        raise ValueError(f"num_pservers={num_pservers}: must be >= 0")
    if poll_interval <= 0:
        raise ValueError(f"poll_interval={poll_interval}: must be > 0")
    if initial_phase is not None and not isinstance(initial_phase, Phase):
        raise ValueError(f"initial_phase={initial_phase!r}: must be one of "
                         f"{', '.join(p.value for p in Phase)}")

    current = initial_phase

    async def advance(phase: Phase, reason: str = "") -> None:
        nonlocal current
        if current is not None and phase.rank <= current.rank:
            return  # never backwards, never twice
        if set_phase is not None:
            await set_phase(phase, reason)
        current = phase
        logger.info("job phase: %s%s", phase, f" ({reason})" if reason else "")
        try:
            await deployer.show_phase(phase, reason=reason)
        except Exception as error:  # a view of the recorded phase: never the job's end
            logger.warning("could not show phase %s: %s", phase, error)

    if current is not None and current.terminal:
        logger.info("job already %s: repeating its clean-up only", current)
        await deployer.cleanup(succeeded=current == Phase.SUCCEEDED)
        return Verdict(current, "ended before this supervisor started")

    await advance(Phase.PENDING)
    while True:
        try:
            await _hold_while_suspended(deployer, poll_interval)
            await deployer.create_pservers()
            await advance(Phase.STARTING)
            if current == Phase.STARTING:  # a job already Running had its pservers registered
                await _wait_for_pservers(deployer, num_pservers, registered=registered_pservers,
                                         poll_interval=poll_interval)
            await deployer.create_trainers()
            await advance(Phase.RUNNING)
            verdict = await _watch(deployer, master_state=master_state,
                                   poll_interval=poll_interval, graces=graces,
                                   desired_trainers=desired_trainers, wake=wake)
            break
        except _Resumed:
            logger.info("the suspend is lifted: deploying the job again")
    await advance(verdict.phase, verdict.reason)
    await deployer.cleanup(succeeded=verdict.phase == Phase.SUCCEEDED)
    return verdict


class _Resumed(Exception):
    """The job was suspended and may run again: it is deployed again from its pservers."""


async def _hold_while_suspended(deployer: Deployer, poll_interval: float) -> None:
    """Nothing when no suspend is asked; else stops the job (`Deployer.suspend`), waits until
    the suspend is lifted (or the master is stopped: then this is cancelled) and raises
    `_Resumed`. The phase is not moved: a suspended job resumes in the phase it had."""
    if not await deployer.suspend_requested():
        return
    await deployer.suspend()
    while True:
        await asyncio.sleep(poll_interval)
        if not await deployer.suspend_requested():
            raise _Resumed


async def _wait_for_pservers(deployer: Deployer, num_pservers: int, *,
                             registered: Callable[[], Awaitable[int]],
                             poll_interval: float) -> None:
    last = -1
    while True:
        await _hold_while_suspended(deployer, poll_interval)
        count = await registered()
        if count >= num_pservers:
            return
        if count != last:
            logger.info("waiting for pservers: %d of %d registered", count, num_pservers)
            last = count
        await asyncio.sleep(poll_interval)


async def _watch(deployer: Deployer, *, master_state: Callable[[], Awaitable[MasterState]],
                 poll_interval: float, graces: Graces,
                 desired_trainers: Callable[[], Awaitable[int | None]] | None,
                 wake: asyncio.Event | None = None) -> Verdict:
    loop = asyncio.get_running_loop()
    settle = _Settle()
    errors = 0
    finishing = False
    while True:
        await _hold_while_suspended(deployer, poll_interval)
        master = await master_state()
        if master.over and not finishing:
            await deployer.finishing()
            finishing = True
        if desired_trainers is not None and not finishing:
            desired = await desired_trainers()
            if desired is not None:
                await deployer.scale(desired)
        if not master.failed:  # a job whose data failed is Failed: nothing to restart
            await deployer.reconcile()
        try:
            status = await deployer.trainer_status()
            errors = 0
        except Exception as error:
            errors += 1
            if errors >= MAX_POLL_ERRORS:
                raise
            logger.warning("cannot read the trainers' state (%d in a row): %s", errors, error)
            await asyncio.sleep(poll_interval)
            continue
        verdict = decide_phase(master, status, graces=graces)
        if settle.final(verdict, loop.time()):
            if verdict.phase == Phase.FAILED:
                logger.warning("job failed: %s", verdict.reason)
            return verdict
        await _pause(poll_interval, wake)


async def _pause(seconds: float, wake: asyncio.Event | None) -> None:
    """Sleeps `seconds`, or less when `wake` is set (then clears it for the next pause)."""
    if wake is None:
        await asyncio.sleep(seconds)
        return
    try:
        await asyncio.wait_for(wake.wait(), seconds)
    except asyncio.TimeoutError:
        return
    wake.clear()
