"""`supervise()`: the leading master drives a job through its phases with a `Deployer`.

    Pending -> (create pservers) -> Starting -> (every pserver registered in etcd)
    -> (create trainers) -> Running -> Succeeded | Failed -> (clean-up per policy)

It is safe to call again after a failover: every deployer call is idempotent, a
phase is never written backwards (pass what etcd holds as `initial_phase`), and a
job already Succeeded or Failed only gets its clean-up repeated — nothing is
re-created. The job ends Succeeded when every trainer finished, or when the master's
dataset is done (`job_done()`) and no trainer is active any more (or they had
`done_grace` seconds to exit); it ends Failed when the trainers failed for good (the
backend gave up restarting them).

What this does NOT guarantee: that pservers ever register (a pserver that crashes
forever keeps the job in Starting), nor a timeout of its own — the caller cancels
it (e.g. when leadership is lost); cancellation leaves every object in place for
the next leader.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from master.deployer import Deployer, RoleStatus

logger = logging.getLogger(__name__)

PENDING, STARTING, RUNNING, SUCCEEDED, FAILED = "Pending", "Starting", "Running", "Succeeded", "Failed"
PHASES = (PENDING, STARTING, RUNNING, SUCCEEDED, FAILED)
TERMINAL = frozenset({SUCCEEDED, FAILED})
_RANK = {PENDING: 0, STARTING: 1, RUNNING: 2, SUCCEEDED: 3, FAILED: 3}

MAX_POLL_ERRORS = 5  # consecutive failures to read the trainers' state before giving up


@runtime_checkable
class PhaseRecorder(Protocol):
    """A deployer that can also show the phase where users look (KubernetesDeployer)."""

    async def annotate_phase(self, phase: str) -> None: ...


def trainers_failed(status: RoleStatus) -> bool:
    """Failed for good: nothing runs any more, something failed, and not all finished."""
    return status.failed > 0 and status.active == 0 and not status.finished


async def supervise(
    deployer: Deployer,
    *,
    num_pservers: int,
    registered_pservers: Callable[[], Awaitable[int]],
    set_phase: Callable[[str], Awaitable[None]],
    job_done: Callable[[], bool] | None,
    poll_interval: float = 2.0,
    initial_phase: str | None = None,
    done_grace: float = 300.0,
    job_failed: Callable[[], bool] | None = None,
) -> str:
    """Runs the job to its end and returns the final phase (Succeeded or Failed).

    `registered_pservers()` counts the pservers registered in etcd; `set_phase` is
    the master's fenced etcd write; `job_done()` (None without a dataset) is true
    once every epoch is done; `job_failed()` is true once the master's data says the
    job failed (every task of an epoch failed); `initial_phase` is the phase etcd
    holds, if any.
    """
    if num_pservers < 0:
        raise ValueError(f"num_pservers={num_pservers}: must be >= 0")
    if poll_interval <= 0:
        raise ValueError(f"poll_interval={poll_interval}: must be > 0")
    if initial_phase is not None and initial_phase not in PHASES:
        raise ValueError(f"initial_phase={initial_phase!r}: must be one of {', '.join(PHASES)}")

    current = initial_phase

    async def advance(phase: str) -> None:
        nonlocal current
        if current is not None and _RANK[phase] <= _RANK[current]:
            return  # never backwards, never twice
        await set_phase(phase)
        current = phase
        logger.info("job phase: %s", phase)
        if isinstance(deployer, PhaseRecorder):
            try:
                await deployer.annotate_phase(phase)
            except Exception as error:  # etcd holds the truth; the annotation is a view of it
                logger.warning("could not record phase %s on the deployment: %s", phase, error)

    if current in TERMINAL:
        logger.info("job already %s: repeating its clean-up only", current)
        await deployer.cleanup(succeeded=current == SUCCEEDED)
        return current

    await advance(PENDING)
    await deployer.create_pservers()
    await advance(STARTING)
    if current == STARTING:  # a job already Running had its pservers registered before
        await _wait_for_pservers(num_pservers, registered=registered_pservers,
                                 poll_interval=poll_interval)
    await deployer.create_trainers()
    await advance(RUNNING)

    final = await _watch(deployer, job_done=job_done, job_failed=job_failed,
                         poll_interval=poll_interval, done_grace=done_grace)
    await advance(final)
    await deployer.cleanup(succeeded=final == SUCCEEDED)
    return final


async def _wait_for_pservers(num_pservers: int, *, registered: Callable[[], Awaitable[int]],
                             poll_interval: float) -> None:
    last = -1
    while True:
        count = await registered()
        if count >= num_pservers:
            return
        if count != last:
            logger.info("waiting for pservers: %d of %d registered", count, num_pservers)
            last = count
        await asyncio.sleep(poll_interval)


async def _watch(deployer: Deployer, *, job_done: Callable[[], bool] | None,
                 job_failed: Callable[[], bool] | None, poll_interval: float,
                 done_grace: float) -> str:
    loop = asyncio.get_running_loop()
    errors = 0
    done_since: float | None = None
    while True:
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
        if job_failed is not None and job_failed():
            logger.warning("the master's data says the job failed")
            return FAILED
        if status.finished:
            if job_done is not None and not job_done():
                logger.warning("every trainer finished but the dataset is not done")
            return SUCCEEDED
        done = job_done is not None and job_done()
        if done:
            if done_since is None:
                done_since = loop.time()
            if status.active == 0 or loop.time() - done_since >= done_grace:
                return SUCCEEDED
        elif trainers_failed(status):
            logger.warning("trainers failed: %s", status)
            return FAILED
        await asyncio.sleep(poll_interval)
