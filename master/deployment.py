"""The leading master deploys its job: the Kubernetes deployer, driven by the shared supervisor.

`deploy_job` builds a `KubernetesDeployer` from the job spec and runs
`paddlecloud.supervision.supervise` with what only the master knows: its data's
state (the dispatcher's cache), the pservers registered in etcd, and its fenced
write of the `phase` key (shown too as annotations of the master Deployment: the
phase, and the reason of a terminal one).

A deploy error is decided here, once:
* permanent — the API refused for good (400, 401, 403, 404, 409 from another job's
  object, 422), or a bug (logged with its traceback): another master would meet the
  same answer, so the job is Failed, with the reason recorded;
* transient — the API unreachable, throttled or failing past the deployer's
  retries, or etcd unavailable or the fence lost: `StepDown` is raised and the
  master steps down, so another master (or this one, elected again) tries.

What this does NOT guarantee: that a permanent error's reason reaches the
Deployment (the annotation is written when the API lets it; etcd's `phase` and the
master's log hold it anyway).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from master.state import TaskStatus
from master.store_errors import NotLeader, StoreUnavailable
from paddlecloud import checkpoints
from paddlecloud.backends.k8s.client import KubernetesApiError, is_transient
from paddlecloud.backends.k8s.deployer import KubernetesDeployer
from paddlecloud.etcd import EtcdUnavailable
from paddlecloud.jobspec import JobSpec
from paddlecloud.phase import Phase
from paddlecloud.supervision import Graces, MasterState, Verdict, supervise

if TYPE_CHECKING:
    from master.dispatcher import Dispatcher

logger = logging.getLogger(__name__)

DEFAULT_GRACES = Graces()
# seconds between two writes of the goodput figures on the master Deployment: the PaddleJob's
# status follows within that (plus the operator's interval), at one API call per half minute
GOODPUT_SHOW_EVERY = 30.0


class StepDown(RuntimeError):
    """Deploying failed in a way another try may pass: the master must step down."""


def is_transient_deploy_error(error: BaseException) -> bool:
    """Worth another master's try: a passing API failure, etcd unreachable, the fence lost."""
    if isinstance(error, KubernetesApiError):
        return error.transient
    return is_transient(error) or isinstance(error, (NotLeader, StoreUnavailable, EtcdUnavailable))


async def deploy_job(dispatcher: Dispatcher, spec_path: Path, *, poll_interval: float = 2.0,
                     graces: Graces = DEFAULT_GRACES) -> Verdict | None:
    """Deploys the job and follows it to its end; returns its verdict.

    A permanent error fails the job (None is returned once Failed is recorded); a
    transient one raises `StepDown`.
    """
    deployer: KubernetesDeployer | None = None
    try:
        spec = JobSpec.from_yaml(await asyncio.to_thread(spec_path.read_text))
        deployer = await asyncio.to_thread(
            functools.partial(KubernetesDeployer, spec, restart_epoch=epoch_restarter(dispatcher, spec)))
        return await supervise_on_kubernetes(dispatcher, deployer, poll_interval=poll_interval,
                                             graces=graces)
    except asyncio.CancelledError:
        raise
    except Exception as error:
        if is_transient_deploy_error(error):
            raise StepDown(f"deploying failed for now: {error}") from error
        if isinstance(error, KubernetesApiError):
            logger.error("deploying the job failed for good: %s", error)
        else:  # a bug, or a spec the master's flags let through: the traceback says which
            logger.exception("deploying the job failed")
        await _fail(dispatcher, deployer, f"deploying failed: {error}")
        return None


def epoch_restarter(dispatcher: Dispatcher, spec: JobSpec) -> Callable[[], Awaitable[None]]:
    """RestartEpoch at the position of the job's last checkpoint: for a collective group restart,
    and for the resume after a suspend (collective or PS: a PS job's pservers restore that
    same checkpoint, docs/kubernetes.md "spec.suspend").

    The checkpoint is read where the trainers write it (`spec.output`, a path the
    master mounts or an fsspec URL); one saved inside an epoch resumes it with the tasks
    it consumed done; none there (or no output) is epoch 0, which is where a model
    without a checkpoint starts too. A job without a dataset has no epoch to restart, nor
    one whose checkpoint was saved at the end of its last epoch: that holds the whole job
    (reading the last epoch again would count it twice in the model).
    """

    async def restart() -> None:
        if dispatcher.spec is None:
            return
        epoch, done = 0, ()
        if spec.output:
            epoch, done = await asyncio.to_thread(checkpoints.resume_point,
                                                  checkpoints.checkpoints_dir(spec.output))
        if epoch >= dispatcher.spec.num_epochs:  # saved at the end of the last epoch
            logger.info("group restart: the checkpoint holds the whole job: no epoch to restart")
            return
        # reopen: the group may have acknowledged the job's last task before it stopped
        await dispatcher.epochs.restart(epoch, done=done, reopen=True)
        logger.info("group restart: the master restarted epoch %d%s", epoch,
                    f" with the checkpoint's {len(done)} tasks done" if done else "")

    return restart


async def supervise_on_kubernetes(dispatcher: Dispatcher, deployer: KubernetesDeployer, *,
                                  poll_interval: float = 2.0, graces: Graces = DEFAULT_GRACES) -> Verdict:
    """`supervise` with the master's data, its etcd and its fenced phase write."""

    shown: list[tuple[int, int, int, int]] = []
    goodput_shown = GoodputShown()

    async def master_state() -> MasterState:
        await _show_epoch(dispatcher, deployer, shown)
        await _show_goodput(dispatcher, deployer, goodput_shown)
        state = dispatcher.core.state
        return MasterState(has_dataset=dispatcher.spec is not None,
                           done=dispatcher.dataset_done(), failed=dispatcher.dataset_failed(),
                           tasks_assigned=state is not None and state.tasks_assigned)

    async def set_phase(phase: Phase, reason: str) -> None:
        await dispatcher.record_phase(phase.value)  # fenced: etcd holds the truth

    async def desired_trainers() -> int | None:
        return dispatcher.scaling.desired or None  # etcd's, read at load, changed by ScaleTrainers

    loaded = dispatcher.recorded_phase
    return await supervise(
        deployer, num_pservers=deployer.spec.pservers,
        registered_pservers=dispatcher.registered_pservers, master_state=master_state,
        set_phase=set_phase, poll_interval=poll_interval,
        initial_phase=Phase(loaded) if loaded else None, graces=graces,
        desired_trainers=desired_trainers,
    )


@dataclass
class GoodputShown:
    at: float | None = None  # monotonic time of the last write
    final: bool = False      # the figures at the data's end were written: nothing moves after


async def _show_goodput(dispatcher: Dispatcher, deployer: KubernetesDeployer,
                        shown: GoodputShown) -> None:
    """Annotates the master Deployment with the job's goodput figures every
    GOODPUT_SHOW_EVERY seconds, and once more as the data ends. A courtesy like the epoch's:
    an API error is logged and a later poll tries again."""
    now = time.monotonic()
    over = dispatcher.dataset_done() or dispatcher.dataset_failed()
    due = shown.at is None or now - shown.at >= GOODPUT_SHOW_EVERY
    if shown.final or not (due or over):
        return
    try:
        await deployer.show_goodput(dispatcher.accounting.meter.figures())
    except Exception as error:
        logger.info("could not annotate the master Deployment with the goodput: %s", error)
        return
    shown.at, shown.final = now, over


async def _show_epoch(dispatcher: Dispatcher, deployer: KubernetesDeployer,
                      shown: list[tuple[int, int, int, int]]) -> None:
    """Annotates the master Deployment with the epoch and its tasks done when they moved. A
    courtesy for readers of the Deployment (the operator's `kubectl get pdj`): an API error
    is logged and the next poll tries again; it never fails the deployment."""
    state, spec = dispatcher.core.state, dispatcher.spec
    if state is None or spec is None:
        return
    counts = state.counts
    now = (state.epoch, spec.num_epochs, counts[TaskStatus.DONE], sum(counts))
    if shown == [now]:
        return
    try:
        await deployer.show_epoch(*now)
    except Exception as error:
        logger.info("could not annotate the master Deployment with epoch %d/%d: %s", *now[:2],
                    error)
        return
    shown[:] = [now]


async def _fail(dispatcher: Dispatcher, deployer: KubernetesDeployer | None, reason: str) -> None:
    try:
        await dispatcher.record_phase(Phase.FAILED.value)
    except Exception as error:  # the fence or etcd: another master must record it
        raise StepDown(f"cannot record the job's failure ({reason}): {error}") from error
    logger.error("job failed: %s", reason)
    if deployer is not None:
        try:
            await deployer.show_phase(Phase.FAILED, reason=reason)
        except Exception as error:  # e.g. the same 403: the log and etcd hold it
            logger.warning("could not show phase Failed on the deployment: %s", error)
