"""The epochs room: an epoch ends on whatever transition completed it; RestartEpoch.

The room subscribes `maybe_end()` to the machine's events that may complete an epoch
(`EPOCH_COMPLETING`): when todo, reserved and pending are all empty, the epoch's end is committed in the background —
`EpochAdvanced`, or `JobFailed` when every task of the epoch failed — so an epoch
can never stall (PaddlePaddle issue #5279). Its write in flight is a mark in the
state, so it is committed once.

A job whose data is all consumed is restarted only when asked to `reopen` it (a group
restart that raced the job's last task: the group was stopped before it saved what it
trained since its checkpoint, so the data must be read again from there), only where a
deployer owns the job's end (`--deployer kubernetes` or `local`: a standalone master's
end is final, or any operator could revive a Succeeded job), and only while that deployer
has not recorded the job's end; otherwise FAILED_PRECONDITION.

Each epoch this master ended keeps its final counts (`ended`: tasks done and failed) for
the status page: etcd deletes an epoch's marks at its end, so epochs another master
ended are not known here (the page says so rather than draw them complete).

What this does NOT do: restart an epoch while any call is in flight (RestartEpoch
closes the gate first), or restart a job whose data failed, or whose end is recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from master import metrics
from master.core import Core, FailedPrecondition, InvalidArgument
from master.machine import Loaded, SessionEnded
from master.state import (
    EpochAdvanced,
    EpochRestarted,
    JobFailed,
    JobState,
    TaskFailed,
    TaskFinished,
    TaskReleased,
    TaskStatus,
)
from master.transactions import MAX_RESTART_DONE, MAX_RESTART_LIST

logger = logging.getLogger(__name__)

# The events after which an epoch may be complete: a task's end, a session's (its tasks go
# back), a restart with every task done, a cache loaded from etcd.
EPOCH_COMPLETING = (TaskFinished, TaskFailed, TaskReleased, SessionEnded, EpochRestarted, Loaded)


@dataclass(frozen=True)
class EndedEpoch:
    """An epoch's tasks when it ended: each done or failed for good (none left to do). A
    task split by work stealing counts once, by its own status (its pieces are its parts)."""

    done: int
    failed: int


def _ended_tasks(state: JobState) -> EndedEpoch:
    """The done and failed counts of the epoch's tasks (not its pieces)."""
    tasks = bytes(state.status[:state.num_tasks])
    return EndedEpoch(tasks.count(TaskStatus.DONE.value), tasks.count(TaskStatus.FAILED.value))


class Epochs:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.ended: dict[int, EndedEpoch] = {}  # epoch -> its counts, for the epochs this master ended
        core.machine.subscribe(self.maybe_end, *EPOCH_COMPLETING)

    def maybe_end(self, _event: object = None) -> None:
        """Ends the epoch once it is complete (a subscriber of the events that may complete it)."""
        state = self.core.state
        if state is None or state.epoch_ending:
            return
        event = self._end_of(state)
        if event is None:
            return
        self.core.machine.begin(event)  # the end of this epoch is in flight from now on: once
        self.core.spawn(self._end(state, event), "end-epoch")

    @staticmethod
    def _end_of(state: JobState) -> JobFailed | EpochAdvanced | None:
        """The event that ends the current epoch, once it is complete."""
        if not state.epoch_complete:
            return None
        return JobFailed(state.epoch) if state.all_failed else EpochAdvanced(state.epoch + 1)

    async def _end(self, state: JobState, event: JobFailed | EpochAdvanced) -> None:
        core = self.core
        try:
            async with core.admitted():
                if core.state is not state or self._end_of(state) != event or not state.epoch_ending:
                    return  # rebuilt or restarted meanwhile: the cache decides afresh
                # final: the epoch is complete and its end is in flight; the tasks', not
                # their pieces' (ids from num_tasks up), so a past epoch's bar adds up
                ended = _ended_tasks(state)
                revision = await core.write(event)
        except BaseException:
            if core.state is state and state.epoch_ending:
                core.machine.abandon(event)
            raise
        if core.state is not state:
            return
        if revision is None:
            core.schedule_rebuild()  # etcd's epoch is not the cache's
        elif isinstance(event, JobFailed):
            logger.error("every task of epoch %d failed: the job failed", event.epoch)
        else:
            metrics.EPOCHS.inc()
            self.ended[event.epoch - 1] = ended
            logger.info("epoch %d complete", event.epoch - 1)

    @staticmethod
    def _check_done(state: JobState, epoch: int, done: tuple[int, ...]) -> None:
        """The done tasks are ids of `epoch`: its pieces too when it is the epoch in progress
        (work stealing keeps its cuts over such a restart: JobState.restart_units)."""
        units = state.restart_units(epoch)
        bad = [t for t in done if not 0 <= t < units]
        if bad:
            raise InvalidArgument(f"done task {bad[0]} is outside 0..{units - 1}")

    async def restart(self, epoch: int, *, done: Iterable[int] = (), reopen: bool = False) -> int:
        """Starts `epoch` afresh with the tasks `done` (a checkpoint's consumed tasks) done;
        with `reopen`, also when the job's data is all consumed (see the module's docstring).

        Up to MAX_RESTART_DONE, the done marks are written in the restart's own
        transaction: a master that dies meanwhile leaves either the old epoch or the
        restarted one with those marks. More (up to MAX_RESTART_LIST) are listed in the
        restart's marker by that transaction, and their marks written after it, each
        write fenced by the marker (`EtcdStore.restart_marks`): a master that dies
        half-way leaves the restarted epoch with the marker's list done, as `load` reads it.
        """
        core = self.core
        done = tuple(sorted(set(done)))
        async with core.admitted():
            state = core.state
            if state is None:
                raise FailedPrecondition("the job has no dataset yet: nothing to restart")
            if not 0 <= epoch < state.num_epochs:
                raise InvalidArgument(f"epoch {epoch} is outside 0..{state.num_epochs - 1}")
            self._check_restartable(state, reopen=reopen)
            self._check_done(state, epoch, done)
            if len(done) > MAX_RESTART_LIST:
                raise InvalidArgument(f"{len(done)} done tasks: a restart takes at most "
                                      f"{MAX_RESTART_LIST} (the list is one etcd value)")
        # Exclusive: no call may be in flight while every assignment is dropped. Checked
        # again there: the job's last task may have been acknowledged meanwhile.
        async with core.exclusive():
            if core.state is None:  # a rebuild that found no dataset: as the check above
                raise FailedPrecondition("the job has no dataset yet: nothing to restart")
            self._check_restartable(core.state, reopen=reopen)
            self._check_done(core.state, epoch, done)  # the epoch may have ended meanwhile
            revision = await core.commit(EpochRestarted(epoch, done))  # sessions stay; assignments go
            for later in [e for e in self.ended if e >= epoch]:
                del self.ended[later]  # they will be read again
            if revision is not None and len(done) > MAX_RESTART_DONE:
                # more marks than one transaction holds: the restart's marker lists them
                # (load reads it) until they are written here, one fenced write after another
                await core.store.restart_marks(epoch, done, revision=revision)
            metrics.EPOCH_RESTARTS.inc()
            logger.info("epoch %d restarted%s", epoch, f" with {len(done)} tasks done" if done else "")
            return epoch

    def _check_restartable(self, state: JobState, *, reopen: bool) -> None:
        """FAILED_PRECONDITION unless `state` may be restarted (the module's docstring)."""
        recorded = self.core.recorded_phase
        if state.failed_job:
            raise FailedPrecondition(f"the job has finished (Failed: every task of epoch {state.epoch} "
                                     "failed): a failed job is not restarted; submit it again")
        if not state.job_over:
            return
        if not reopen:
            raise FailedPrecondition(f"the job has finished ({state.phase.value}: its data is all "
                                     "consumed): a finished job is not restarted; submit it again, "
                                     "or reopen it (reopen=true) from a group restart that raced its end")
        if self.core.config.deployer == "none":
            raise FailedPrecondition("the job has finished and this master has no deployer (--deployer none): "
                                     "its end is final, only a deployer's group restart reopens a job; "
                                     "submit it again")
        if recorded is not None and recorded.terminal:
            raise FailedPrecondition(f"the job's end is recorded ({recorded.value}): it is not "
                                     "reopened; submit it again")
