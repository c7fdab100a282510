"""A parameter-server job stopped by SIGTERM saves its model where the master's count is.

A PS job's model lives in its pservers, and its trainers share no collective, so the
boundary protocol of collective training (``trainer_agent.paddle``: ``all_gather`` of
the tasks each trainer read) has no channel here. The master is the one place that
knows every task of the epoch the pservers were fed — trainers scaled away earlier in
the epoch included — so the saver takes the tasks done from it, at a moment it cannot
change any more:

    client = TaskClient.from_env(parse=parse)
    stop = PsStop(client, resumed=status)        # status: the TrainStatus the pservers restored
    for epoch in stop.epochs():                  # client.epochs(), the checkpoint's tasks unread
        for record in epoch.records():
            push_to_pservers(record)             # each step's update reaches the pservers
        if stop.requested:
            sys.exit(stop.stop(save=save_model))  # save_model(train_status) on trainer 0 only

1. Drain. On SIGTERM (a suspend, a Kueue preemption: the backend stops the trainers first,
   as a group, then the pservers) each trainer's reading ends between tasks
   (``trainer_agent.termination``), it finishes its last steps, flushes its
   acknowledgements and leaves the master (``stop``): every task it acknowledged is in
   the pservers, and nothing of a task it did not acknowledge is (nothing is half read).
2. Agree. Trainer 0 (``$PADDLE_TRAINER_ID`` 0) waits until it is the only trainer the
   master counts alive (GetStatus ``trainers_alive``): the master's done tasks can no
   longer change.
3. Save. It lists the epoch's done tasks (ListTasks) and calls ``save(train_status)``
   with ``TrainStatus(epoch, tasks_done=...)``: the program saves the pservers' model
   with it as one checkpoint (``trainer_agent.checkpoint.save_checkpoint``, atomic), e.g.
   the state it asks each pserver for, or the files ``fleet.save_persistables`` wrote.
   Every trainer then exits with ``termination.STOPPED_EXIT`` (no failure counted).

The resume restarts the epoch at the newest checkpoint (the backend's ``RestartEpoch``,
docs/kubernetes.md "spec.suspend"; a ``local train`` started again deals the epoch anew
and ``epochs()`` acknowledges the checkpoint's tasks unread), and the pservers, started
with ``PADDLECLOUD_PSERVER_RESTORE=1``, load that same checkpoint (the newest complete
version under ``$PADDLECLOUD_OUTPUT/checkpoints``, ``trainer_agent.checkpoint.load_checkpoint``):
model and tasks agree, so each record is in the model once.

Why the master's count and not the trainers' acknowledgements: a trainer knows only the
tasks it read; one that left earlier in the epoch (a scale-down, a death) took its list
with it, while its updates stayed in the pservers. Once every trainer drained and left,
the master's done tasks are exactly what the pservers were fed.

Any failure of the stop (a trainer that does not leave within the grace,
``$PADDLECLOUD_STOP_GRACE``; the master unreachable; a failed save) saves nothing: the
last checkpoint stands, and the resume restarts there, with the pservers restoring it,
which is still exactly once, only with more to read again.

The trainer reads through ``PsStop.epochs()`` of a ``TaskClient`` in its own process (one
session, no loader workers, records pushed as they come or in batches it builds itself):
``MasterDataset`` (``trainer_agent.paddle``) is the collective path, and its drain's stall
rule (a loop that made no collective step) does not apply to PS trainers, which ``PsStop``
turns off.

Not guaranteed: a trainer killed after it acknowledged a task but before its last
update reached the pservers (SIGKILL, its grace spent) leaves the task counted without
its whole update; a trainer killed in a task's middle leaves part of the task in the
pservers, to be read again. Pushes must be synchronous (or flushed, e.g. Paddle's
``fleet.stop_worker()``, before ``stop``) for "acknowledged" to mean "in the pservers".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from paddlecloud.api import pb
from paddlecloud.phase import Phase
from trainer_agent import termination
from trainer_agent.checkpoint import TrainStatus
from trainer_agent.client import Epoch, TaskClient

logger = logging.getLogger(__name__)

SAVER = "0"          # the trainer id that saves the model at a stop
POLL = 0.2           # seconds between two looks at the trainers the master counts alive


class PsStop:
    """A PS trainer's side of a stop (see the module docstring); SIGTERM drains from now on.

    ``resumed`` is the TrainStatus of the checkpoint the pservers restored (None: none):
    a task it lists as done that the master deals again (a job started afresh on the
    checkpoint) is acknowledged unread.
    """

    def __init__(self, client: TaskClient, *, resumed: TrainStatus | None = None) -> None:
        termination.drain_on_stop(stall=False)  # no collective: only the grace bounds it
        self.client = client
        self._consumed: dict[int, frozenset[int]] = {}
        if resumed is not None and resumed.in_epoch:
            self._consumed[resumed.epoch] = frozenset(resumed.tasks_done or ())

    @property
    def requested(self) -> bool:
        """SIGTERM came: the reading ended (or ends) between tasks; call ``stop``."""
        return termination.stop_requested()

    def epochs(self) -> Iterator[Epoch]:
        """``client.epochs()``, with the resumed checkpoint's tasks acknowledged unread."""
        for epoch in self.client.epochs():
            epoch.consumed = self._consumed.get(epoch.number, frozenset())
            yield epoch

    def stop(self, save: Callable[[TrainStatus], object]) -> int:
        """Leaves the master; on trainer 0, first saves through ``save`` once every other
        trainer left. Returns the exit code: ``termination.STOPPED_EXIT``."""
        termination.saving()
        client = self.client
        try:
            client.flush()
            if client.trainer_id == SAVER and not client.progress.finished:
                status = self._train_status()
                if status is not None:
                    save(status)
                    logger.info("stopped: saved the model with %s", _describe(status))
        except Exception as error:  # a failed stop saves nothing: the last checkpoint stands
            logger.warning("stopped without saving (%s): the last checkpoint stands", error)
        finally:
            client.close()
        return termination.STOPPED_EXIT

    def _train_status(self) -> TrainStatus | None:
        """Where the master is once this is the only trainer left (None: the others did not
        leave within the grace, or the job is over)."""
        connection = self.client.connection
        deadline = time.monotonic() + termination.stop_grace()
        while True:
            status = connection.get_status()
            if status.trainers_alive <= 1:
                break
            if time.monotonic() >= deadline:
                logger.warning("%d other trainer(s) still alive after %gs: not saving",
                               status.trainers_alive - 1, termination.stop_grace())
                return None
            time.sleep(POLL)
        if status.phase in (Phase.SUCCEEDED.value, Phase.FAILED.value):
            return None  # the job is over: its normal end saved the model
        done = self._done_tasks(status.current_epoch)
        return TrainStatus(status.current_epoch, tasks_done=done)

    def _done_tasks(self, epoch: int) -> tuple[int, ...]:
        """The tasks of ``epoch`` the master counts done (ListTasks, every page)."""
        tasks = self.client.connection.list_tasks(state=pb.DONE, epoch=epoch)
        return tuple(task.id for task in tasks if task.epoch == epoch)


def _describe(status: TrainStatus) -> str:
    return f"epoch {status.epoch}, {len(status.tasks_done or ())} task(s) of it done"
