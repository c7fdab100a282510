"""The dataset room: a job adopts its dataset once, from the flags or `SetDataset`.

The first master to adopt expands the globs, cuts the files into tasks and freezes
the file list, the spec and the start epoch in etcd; every later start and every
standby reads that frozen list, never a fresh glob. The same spec again (equal after
defaults are filled) is OK; a different one is FAILED_PRECONDITION.

`SetDataset` makes the master list files (and, for a URL, talk to a server) on a
caller's behalf, so it is off unless the master was started with
`--allow-set-dataset PREFIX` (repeatable): then every path must lie under one of
those prefixes (a scheme like `s3://bucket/`, or a directory like `/data/`), compared on
parsed URLs and resolved paths (`master.dataset_allowlist`), before any listing, and every
file the listing found is checked again before anything is frozen. Anything else is
FAILED_PRECONDITION (off) or INVALID_ARGUMENT naming the path.

The adoption is the machine's `DatasetAdopted` (`master.machine`): the file list is
staged in etcd first, then the event's one transaction freezes the spec and the epoch.

What this does NOT do: read the data (only the files' names and sizes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from master.config import DatasetSpec, SpecError
from master.core import Core, FailedPrecondition, InvalidArgument
from master.dataset_allowlist import AllowList, NotAllowed
from master.machine import DatasetAdopted, partition_of
from paddlecloud.datasets import FileEntry, list_files
from paddlecloud.untrusted import quote

logger = logging.getLogger(__name__)

MAX_PATHS = 1000        # paths or globs in one SetDataset
MAX_PATH_CHARS = 4096   # characters of one


class DatasetAdoption:
    def __init__(self, core: Core) -> None:
        self.core = core
        self._lock = asyncio.Lock()
        self.allow_list = AllowList(core.config.set_dataset_prefixes)

    async def set_dataset(self, spec: DatasetSpec) -> int:
        async with self.core.admitted():
            if self.core.spec is not None:
                return await self.adopt(spec)
            await asyncio.to_thread(self.check_allowed, spec.paths)  # resolving symlinks blocks
            return await self.adopt(spec, vet=self._check_listed)

    def check_allowed(self, paths: tuple[str, ...]) -> None:
        """Refuses a SetDataset whose paths the master was not started to accept."""
        if not self.allow_list.prefixes:
            raise FailedPrecondition("SetDataset is off: this master takes its dataset from --input; "
                                     "start it with --allow-set-dataset PREFIX to accept one")
        if len(paths) > MAX_PATHS:
            raise InvalidArgument(f"{len(paths)} dataset paths: at most {MAX_PATHS}")
        for path in paths:
            if len(path) > MAX_PATH_CHARS:
                raise InvalidArgument(f"dataset path {quote(path)} is longer than {MAX_PATH_CHARS} characters")
            try:
                self.allow_list.check(path)
            except NotAllowed as error:
                raise InvalidArgument(str(error)) from None

    def _check_listed(self, paths: tuple[str, ...], files: list[FileEntry]) -> None:
        """Every file listed lies under a prefix too (a symlink, an index linking elsewhere)."""
        try:
            self.allow_list.check_listed(", ".join(paths), (f.path for f in files))
        except NotAllowed as error:
            raise InvalidArgument(str(error)) from None

    async def adopt(self, spec: DatasetSpec, *,
                    vet: Callable[[tuple[str, ...], list[FileEntry]], None] | None = None) -> int:
        """Adopts `spec` (frozen in etcd by the first master to do so); the number of tasks.

        `vet` sees the files listed before anything is frozen, and may refuse them."""
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
                if vet is not None:
                    await asyncio.to_thread(vet, filled.paths, files)
            except SpecError as error:
                raise InvalidArgument(str(error)) from None
            partition = partition_of(filled, files)
            if partition.num_tasks == 0:
                raise InvalidArgument(f"dataset {list(filled.paths)!r} has no data: every file is empty")
            start_epoch = core.config.start_epoch
            if (not await core.store.stage_files(files)
                    or await core.commit(DatasetAdopted(filled, partition, start_epoch)) is None):
                raise FailedPrecondition("another master froze a dataset for this job first")
            logger.info("dataset frozen: %d files, %d chunks, %d tasks, %d epochs (starting at %d)",
                        len(files), partition.num_chunks, partition.num_tasks, filled.num_epochs,
                        start_epoch)
            return partition.num_tasks
