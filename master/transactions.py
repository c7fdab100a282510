"""Event to transaction: the one place an event of the master's machine becomes the etcd
transaction that stands for it (docs/design.md section 6 for the keys and invariants).

`Transactions.txn_for(event, machine)` builds the write of one `master.machine.Durable`
event against the machine as it is now; the core submits it to the fenced group
committer (`master.committer`) and applies the event once etcd took it. Each write's
compares are what make the event valid in etcd whatever this master's cache believes:
an assignment compares the trainer's session and the epoch, a finish the attempt, an
epoch's end that no assignment is live. Beside the events' writes are the two that
prepare or finish one: a dataset's file list, staged before its adoption
(`file_list_txns`), and a big restart's done marks, written after it
(`restart_mark_txns`).

What this does NOT do: send anything, or decide whether an event should happen.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import assert_never

from aetcd import rpc

from master.committer import (
    MAX_TXN_OPS,
    Txn,
    delete,
    delete_prefix,
    mod_revision_is,
    nested_txn,
    put,
    value_is,
    version_is,
)
from master.machine import (
    DatasetAdopted,
    Durable,
    MasterMachine,
    PhaseRecorded,
    SaveModelGranted,
    SaveModelReleased,
    SessionOpened,
    TrainerRangeSet,
    TrainersScaled,
)
from master.partition import FileEntry
from master.state import (
    Assignment,
    EpochAdvanced,
    EpochRestarted,
    JobFailed,
    JobState,
    TaskAssigned,
    TaskFailed,
    TaskFinished,
    TaskReleased,
    TaskSplit,
)
from paddlecloud.keys import JobKeys, prefix_range_end
from paddlecloud.phase import Phase

MAX_RESTART_DONE = (MAX_TXN_OPS - 6) // 2  # done marks a RestartEpoch keeps in its own txn
RESTART_MARKS_PER_TXN = MAX_TXN_OPS - 8   # done marks per follow-up write of a bigger restart
MAX_RESTART_LIST = 100_000  # done tasks a restart lists in its marker (about 0.6 MB of value)
MAX_FILES_PIECE = 512 * 1024  # bytes of file list per `files/<n>` value (etcd values stay < 1 MiB)
_VALUE, _VERSION, _MOD, _EQUAL = (rpc.Compare.VALUE, rpc.Compare.VERSION, rpc.Compare.MOD,
                                  rpc.Compare.EQUAL)


def encode_extent(root: int, lo: int, hi: int) -> bytes:
    """The `extents/<epoch>/<unit>` value (work stealing: master.stealing)."""
    return b'{"task":%d,"lo":%d,"hi":%d}' % (root, lo, hi)


def encode_assignment(a: Assignment, epoch: int, trainer_json: bytes | None = None) -> bytes:
    """The `assign/<task>` value: compact JSON, as json.dumps would write it (hot path)."""
    trainer = trainer_json or json.dumps(a.trainer).encode()
    return b'{"session":%d,"trainer":%s,"epoch":%d,"deadline":%s}' % (
        a.session, trainer, epoch, repr(float(a.deadline)).encode())


class Transactions:
    """The job's keys, and the one transaction each durable event takes."""

    def __init__(self, keys: JobKeys) -> None:
        self.keys = keys
        # The hot paths' keys, from prefixes computed once (JobKeys builds them from strings).
        self._assign_prefix = keys.kind_prefix("assign")
        self._done_prefix = keys.kind_prefix("done")
        self._epoch_key = keys.epoch
        # A bigger restart's list of done tasks, until their marks are written (`restart_mark_txns`).
        self.restart_key = keys.kind_prefix("restart") + b"done"
        self._trainers: dict[str, tuple[bytes, bytes]] = {}   # id -> (key, JSON string)
        assert self._assign_key(7) == keys.assign(7) and self._done_key(3, 7) == keys.done(3, 7)

    def _assign_key(self, task: int) -> bytes:
        return self._assign_prefix + b"%d" % task

    def _done_key(self, epoch: int, task: int) -> bytes:
        return self._done_prefix + b"%d/%d" % (epoch, task)

    def _trainer(self, trainer: str) -> tuple[bytes, bytes]:
        found = self._trainers.get(trainer)
        if found is None:
            if len(self._trainers) > 100_000:
                self._trainers.clear()
            found = self._trainers[trainer] = (self.keys.trainer(trainer), json.dumps(trainer).encode())
        return found

    def txn_for(self, event: Durable, machine: MasterMachine) -> Txn:
        """The one etcd transaction that stands for `event`, applied to `machine` as it is now."""
        k = self.keys
        state = machine.tasks
        match event:
            case TaskAssigned(task=task, assignment=assignment):
                return self._assign_txn(task, state.epoch, assignment)
            case TaskFinished(task=task, attempt=attempt):
                return self._finish_txn(task, state.epoch, attempt)
            case TaskFailed(task=task, attempt=attempt):
                # counts the failure iff `attempt` is live and the count is the cache's
                before, failures = state.failures[task], k.failures(state.epoch, task)
                return Txn.of([mod_revision_is(k.assign(task), attempt), version_is(failures, before)],
                              [put(failures, str(before + 1)), delete(k.assign(task))],
                              (k.assign(task), failures))
            case TaskReleased(task=task, attempt=attempt):
                return Txn.of([mod_revision_is(k.assign(task), attempt)], [delete(k.assign(task))],
                              (k.assign(task),))
            case TaskSplit():
                return self._split_txn(event, state)
            case EpochAdvanced(epoch=epoch):
                # ends the epoch before `epoch` only if no assignment is live; old marks go.
                # The last one (epoch >= num_epochs: the data's end) leaves `phase` alone:
                # Succeeded is the deployer's verdict, once the trainers are done too.
                assign_prefix = k.kind_prefix("assign")
                ops = [put(k.epoch, str(epoch)), delete_prefix(k.kind_prefix("done")),
                       delete_prefix(k.kind_prefix("failures")), delete(self.restart_key),
                       delete_prefix(k.kind_prefix("extents"))]
                return Txn.of([value_is(k.epoch, str(epoch - 1)),
                               version_is(assign_prefix, 0, prefix_range_end(assign_prefix))],
                              ops, exclusive=True)
            case JobFailed(epoch=epoch):
                return Txn.of([value_is(k.epoch, str(epoch))], [put(k.phase, Phase.FAILED.value)],
                              exclusive=True)
            case EpochRestarted(epoch=epoch, done=done):
                return self._restart_txn(epoch, done, keep_cuts=state.keeps_cuts(epoch))
            case DatasetAdopted(spec=spec, epoch=epoch):
                # the commit point of a freeze: its file list was staged before (`file_list_txns`)
                return Txn.of([version_is(k.spec, 0)],
                              [put(k.spec, spec.to_json()), put(k.epoch, str(epoch))], exclusive=True)
            case PhaseRecorded(phase=phase):
                return Txn.of([], [put(k.phase, phase.value)], (k.phase,))
            case TrainerRangeSet(span=span, desired=desired):
                return Txn.of([version_is(k.trainers_range, 0)],
                              [put(k.trainers_range, span.to_json()), put(k.trainers_desired, str(desired))],
                              (k.trainers_range, k.trainers_desired))
            case TrainersScaled(span=span, desired=desired):
                # the desired size, while the range is still `span`
                return Txn.of([value_is(k.trainers_range, span.to_json())],
                              [put(k.trainers_desired, str(desired))], (k.trainers_desired,))
            case SessionOpened(trainer=trainer, session=session, superseded=old):
                # binds `trainer` to the new session; the superseded one is remembered on its lease
                ops = [put(k.trainer(trainer), str(session), lease=session)]
                if old:
                    ops.append(put(k.superseded(old), trainer, lease=session))
                return Txn.of([], ops, (k.trainer(trainer),))
            case SaveModelGranted(trainer=trainer, lease=lease):
                return Txn.of([version_is(k.save_model, 0)], [put(k.save_model, trainer, lease=lease)],
                              (k.save_model,))
            case SaveModelReleased(trainer=trainer):
                # deletes the grant only if `trainer` holds it (its session ended)
                return Txn.of([value_is(k.save_model, trainer)], [delete(k.save_model)], (k.save_model,))
            case _:
                assert_never(event)

    def _restart_txn(self, epoch: int, done: tuple[int, ...], *, keep_cuts: bool) -> Txn:
        """Sessions stay; their assignments and the save-model grant (the old group's: its
        holder may be stopped and never leave) are gone; the checkpoint's tasks are done:
        their marks kept or written here, or (more than one transaction holds) every mark
        deleted and the list put in the restart marker, whose marks `restart_mark_txns`
        then writes in follow-up transactions. The epoch in progress keeps its splits' cuts
        (`JobState.keeps_cuts`), another's go."""
        k = self.keys
        if len(done) <= MAX_RESTART_DONE:
            marks = [*self._restart_done_ops(epoch, done), delete(self.restart_key)]
        else:
            marks = [delete_prefix(self._done_prefix),
                     put(self.restart_key, json.dumps({"epoch": epoch, "done": list(done)},
                                                      separators=(",", ":")))]
        cuts = [] if keep_cuts else [delete_prefix(k.kind_prefix("extents"))]
        return Txn.of([], [put(k.epoch, str(epoch)), put(k.phase, Phase.RUNNING.value), *marks,
                           delete_prefix(k.kind_prefix("failures")), *cuts,
                           delete_prefix(k.kind_prefix("assign")), delete(k.save_model)],
                      exclusive=True)

    def _split_txn(self, e: TaskSplit, state: JobState) -> Txn:
        """Cuts live assignment `attempt` of `task` short at `at` and makes the rest piece
        `piece`, iff the assignment is still that one (its holder agreed to stop there) and the
        epoch has not moved. The assignment's key is not written: its revision, the holder's
        fencing token, stays, so the holder's finish counts its own part done."""
        k, epoch = self.keys, state.epoch
        cut, piece = k.extent(epoch, e.task), k.extent(epoch, e.piece)
        before = state.extent(e.task)
        return Txn.of([mod_revision_is(k.assign(e.task), e.attempt), value_is(k.epoch, str(epoch)),
                       version_is(piece, 0),
                       value_is(cut, encode_extent(*before)) if before else version_is(cut, 0)],
                      [put(cut, encode_extent(e.root, e.lo, e.at)),
                       put(piece, encode_extent(e.root, e.at, e.end))],
                      (cut, piece))

    def _restart_done_ops(self, epoch: int, done: tuple[int, ...]) -> list[rpc.RequestOp]:
        """Every done mark deleted but those of `done`, which are kept or written.

        etcd refuses a key both deleted and written in one request, so the deletes are
        the ranges between `done`'s keys, and each of those is put only when absent
        (a nested transaction): a mark that stays is not written twice."""
        prefix = self._done_prefix
        keys = sorted(self._done_key(epoch, t) for t in done)
        ops: list[rpc.RequestOp] = []
        start = prefix
        for key in keys:
            if start < key:
                ops.append(delete(start, key))
            ops.append(nested_txn([version_is(key, 0)], [put(key, b"")]))
            start = key + b"\0"
        ops.append(delete(start, prefix_range_end(prefix)))
        return ops

    def restart_mark_txns(self, epoch: int, done: tuple[int, ...], *, revision: int) -> Iterator[Txn]:
        """The writes of a bigger restart committed at `revision`: its done marks, then its
        marker's delete. Each compares the marker's revision, so none lands after a later
        restart or the epoch's end; a mark is put only when absent, so a write repeated
        after a failure counts nothing twice."""
        fence = mod_revision_is(self.restart_key, revision)
        keys = [self._done_key(epoch, t) for t in done]
        for start in range(0, len(keys), RESTART_MARKS_PER_TXN):
            chunk = keys[start:start + RESTART_MARKS_PER_TXN]
            yield Txn.of([fence], [nested_txn([version_is(key, 0)], [put(key, b"")]) for key in chunk], chunk)
        yield Txn.of([fence], [delete(self.restart_key)], (self.restart_key,))

    def file_list_txns(self, files: list[FileEntry]) -> Iterator[Txn]:
        """The writes that stage a dataset's file list before its adoption commits it: every
        old piece deleted, then the pieces (below 1 MiB each), each only while no spec is frozen."""
        k = self.keys
        pieces: list[list] = [[]]
        size = 0
        for item in ([f.path, f.size] for f in files):
            item_size = len(json.dumps(item)) + 1
            if size + item_size > MAX_FILES_PIECE and pieces[-1]:
                pieces.append([])
                size = 0
            pieces[-1].append(item)
            size += item_size
        yield Txn.of([], [delete_prefix(k.kind_prefix("files"))], exclusive=True)
        for n, piece in enumerate(pieces):
            yield Txn.of([version_is(k.spec, 0)], [put(k.files(n), json.dumps(piece, separators=(",", ":")))],
                         exclusive=True)

    def _assign_txn(self, task: int, epoch: int, assignment: Assignment) -> Txn:
        """Compares: the trainer's key still names this session, the task has no assignment
        and no done mark this epoch, the epoch has not moved. Built in place (hot path);
        the write's revision is the attempt."""
        trainer_key, trainer_json = self._trainer(assignment.trainer)
        assign_key = self._assign_key(task)
        op = rpc.RequestOp()
        txn = op.request_txn
        add = txn.compare.add
        add(key=trainer_key, target=_VALUE, result=_EQUAL, value=b"%d" % assignment.session)
        add(key=assign_key, target=_VERSION, result=_EQUAL, version=0)
        add(key=self._done_key(epoch, task), target=_VERSION, result=_EQUAL, version=0)
        add(key=self._epoch_key, target=_VALUE, result=_EQUAL, value=b"%d" % epoch)
        request = txn.success.add().request_put
        request.key = assign_key
        request.value = encode_assignment(assignment, epoch, trainer_json)
        request.lease = assignment.session
        return Txn(op, 4, frozenset((assign_key,)))

    def _finish_txn(self, task: int, epoch: int, attempt: int) -> Txn:
        """Counts the task done for `epoch` iff `attempt` is its live assignment (invariant 2).

        Compares: the assignment is the one of `attempt`, no done mark yet; puts the mark,
        deletes the assignment. Built in place (hot path).
        """
        assign_key, done_key = self._assign_key(task), self._done_key(epoch, task)
        op = rpc.RequestOp()
        txn = op.request_txn
        add = txn.compare.add
        add(key=assign_key, target=_MOD, result=_EQUAL, mod_revision=attempt)
        add(key=done_key, target=_VERSION, result=_EQUAL, version=0)
        txn.success.add().request_put.key = done_key
        txn.success.add().request_delete_range.key = assign_key
        return Txn(op, 2, frozenset((assign_key, done_key)))
