"""The dataset room: a job adopts its dataset once, from the flags or `SetDataset`.

The first master to adopt expands the globs, cuts the files into tasks and freezes
the file list, the spec and the start epoch in etcd; every later start and every
standby reads that frozen list, never a fresh glob. The same spec again (equal after
defaults are filled) is OK; a different one is FAILED_PRECONDITION.

`SetDataset` makes the master list files (and, for a URL, talk to a server) on a
caller's behalf, so it is off unless the master was started with
`--allow-set-dataset PREFIX` (repeatable): then every path must start with one of
those prefixes (a scheme like `s3://bucket/`, or a directory like `/data/`) and hold
no `..`. Anything else is FAILED_PRECONDITION (off) or INVALID_ARGUMENT naming the path,
before any listing.

What this does NOT do: read the data (only the files' names and sizes).
"""

from __future__ import annotations

import asyncio
import logging

from master.config import DatasetSpec, SpecError
from master.core import Core, FailedPrecondition, InvalidArgument, partition_of
from master.state import JobState
from paddlecloud.datasets import list_files
from paddlecloud.untrusted import quote

logger = logging.getLogger(__name__)

MAX_PATHS = 1000        # paths or globs in one SetDataset
MAX_PATH_CHARS = 4096   # characters of one


class DatasetAdoption:
    def __init__(self, core: Core) -> None:
        self.core = core
        self._lock = asyncio.Lock()

    async def set_dataset(self, spec: DatasetSpec) -> int:
        async with self.core.admitted():
            if self.core.spec is None:
                self.check_allowed(spec.paths)
            return await self.adopt(spec)

    def check_allowed(self, paths: tuple[str, ...]) -> None:
        """Refuses a SetDataset whose paths the master was not started to accept."""
        prefixes = self.core.config.set_dataset_prefixes
        if not prefixes:
            raise FailedPrecondition("SetDataset is off: this master takes its dataset from --input; "
                                     "start it with --allow-set-dataset PREFIX to accept one")
        if len(paths) > MAX_PATHS:
            raise InvalidArgument(f"{len(paths)} dataset paths: at most {MAX_PATHS}")
        for path in paths:
            if len(path) > MAX_PATH_CHARS or ".." in path.split("/") or not path.startswith(prefixes):
                raise InvalidArgument(
                    f"dataset path {quote(path)} is not under an allowed prefix ({', '.join(prefixes)}) "
                    "or holds '..'")

    async def adopt(self, spec: DatasetSpec) -> int:
        """Adopts `spec` (frozen in etcd by the first master to do so); the number of tasks."""
        core = self.core
        try:
            filled = spec.filled()
        except SpecError as error:
            raise InvalidArgument(str(error)) from None
        async with self._lock:
            if core.spec is not None:
                if filled != core.spec:
                    raise FailedPrecondition(
                        f"the job already has a different dataset: {core.spec.to_json()}")
                assert core.partition is not None
                return core.partition.num_tasks
            try:
                files = await asyncio.to_thread(list_files, filled.paths)
            except SpecError as error:
                raise InvalidArgument(str(error)) from None
            partition = partition_of(filled, files)
            if partition.num_tasks == 0:
                raise InvalidArgument(f"dataset {list(filled.paths)!r} has no data: every file is empty")
            start_epoch = core.config.start_epoch
            if not await core.store.freeze_dataset(filled, files, epoch=start_epoch):
                raise FailedPrecondition("another master froze a dataset for this job first")
            core.adopt(filled, partition, JobState.new(
                num_tasks=partition.num_tasks, num_epochs=filled.num_epochs, seed=filled.shuffle_seed,
                max_failures=core.policy.max_task_failures, epoch=start_epoch))
            logger.info("dataset frozen: %d files, %d chunks, %d tasks, %d epochs (starting at %d)",
                        len(files), partition.num_chunks, partition.num_tasks, filled.num_epochs,
                        start_epoch)
            return partition.num_tasks
