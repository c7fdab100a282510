"""The leading master's domain, wired from its rooms: one `Dispatcher` per term of leadership.

    machine.py           the job's whole state: named events, one `apply`, subscriptions
    core.py              the machine as the cache, the admission gate and rebuild, `commit(event)`
    trainers.py          sessions: register, keep-alive, leave, supersede, dead trainers
    tasks.py             GetTask, finished/failed/returned reports, task deadlines
    epochs.py            the end of an epoch, RestartEpoch
    dataset_adoption.py  the job's dataset, adopted once and frozen in etcd
    save_model.py        the save-model grant
    deploy_adapter.py    what the deployer reads of the job and writes of its phase
    scaling.py           the trainer range and desired size (ScaleTrainers)
    accounting.py        goodput: the job's trainer-seconds, productive or lost by cause
    stealing.py          work stealing: a straggler's task split for an idle trainer

Each RPC becomes one call into a room; the servicer translates protobufs at the
edge, so nothing here sees one. Every room reads and writes etcd only through
`master.store`, and changes the machine only through the core. A room that acts on
another's events subscribes to them on the machine when it is made
(`MasterMachine.subscribe`): the epochs room to those that may complete an epoch, the
trainers room to `Loaded` (its watch starts after the snapshot), the save-model room
to `SessionEnded`.

What this does NOT do: keep trainer leases alive on its own (it refreshes them when their
trainers call, from a process of its own: `paddlecloud.lease_process`), or read any data.
"""

from __future__ import annotations

import aetcd

from master.accounting import Accounting
from master.config import DatasetSpec, MasterConfig, SpecError
from master.core import Core, FailedPrecondition, InvalidArgument
from master.dataset_adoption import DatasetAdoption
from master.deploy_adapter import DeployAdapter
from master.epochs import Epochs
from master.save_model import SaveModel
from master.scaling import Scaling
from master.snapshot import MarkMirror
from master.stealing import Stealing
from master.store import EtcdStore
from master.tasks import Tasks
from master.trainers import Trainers
from paddlecloud.etcd import Leadership
from paddlecloud.keys import JobKeys
from paddlecloud.lease_process import LeaseKeeperProcess
from paddlecloud.phase import Phase


class Dispatcher:
    def __init__(self, *, client: aetcd.Client, config: MasterConfig, leadership: Leadership,
                 advertise: str, mirror: MarkMirror | None = None,
                 keeper: LeaseKeeperProcess | None = None) -> None:
        self.config = config
        self.advertise = advertise
        # the term's lease process (`MasterNode` starts it while standing by); else our own
        self._own_keeper = keeper is None
        self.keeper = keeper if keeper is not None else lease_process(config)
        self.store = EtcdStore(client, JobKeys(config.namespace, config.job), leadership,
                               keeper=self.keeper)
        self.core = Core(store=self.store, config=config, standby_marks=mirror)
        self.trainers = Trainers(self.core)
        self.stealing = Stealing(self.core, self.trainers)
        self.tasks = Tasks(self.core, self.trainers, stealing=self.stealing)
        self.epochs = Epochs(self.core)
        self.dataset = DatasetAdoption(self.core)
        self.save_model = SaveModel(self.core, self.trainers)
        self.deployment = DeployAdapter(self.core)
        self.scaling = Scaling(self.core)
        self.accounting = Accounting(self.core, scaling=self.scaling, save_model=self.save_model)
        self.deposed = self.core.deposed
        # The deployment adapter, as `MasterNode._deploy` hands it to `supervise()`.
        self.registered_pservers = self.deployment.registered_pservers
        self.record_phase = self.deployment.record_phase
        self.dataset_done = self.deployment.dataset_done
        self.dataset_failed = self.deployment.dataset_failed

    @property
    def spec(self) -> DatasetSpec | None:
        return self.core.spec

    @property
    def recorded_phase(self) -> Phase | None:
        return self.core.recorded_phase

    async def start(self) -> None:
        await self.store.start()
        await self.core.load()
        await self.scaling.load(self.config.trainer_size)
        await self.accounting.load()
        given = self.config.dataset
        if self.core.spec is None and given is not None:
            try:
                await self.dataset.adopt(given)
            except (InvalidArgument, FailedPrecondition) as error:
                raise SpecError(str(error)) from None  # bad flags: fatal, not retried
        elif self.core.spec is not None and given is not None and given.filled() != self.core.spec:
            raise SpecError(
                f"job {self.config.job} already has a different dataset in etcd "
                f"({self.core.spec.to_json()}); the flags give {given.filled().to_json()}. "
                "Delete the job's state (`paddlecloud job delete`, or --fresh locally) to change it"
            )
        self.core.spawn(self.tasks.deadline_loop(), "deadlines")
        self.core.spawn(self.accounting.run(), "goodput")
        self.core.open()
        self.epochs.maybe_end()

    async def stop(self) -> None:
        """Stops serving: calls at the gate or in flight fail with NotLeader."""
        await self.trainers.stop()
        await self.core.stop()
        if self._own_keeper:
            await self.keeper.close()


def lease_process(config: MasterConfig) -> LeaseKeeperProcess:
    """The keeper of the trainers' leases, in a process of its own, logged in as the master is."""
    return LeaseKeeperProcess(config.etcd_endpoints, credentials=config.etcd_credentials,
                              timeout=config.etcd_timeout,
                              probe=JobKeys(config.namespace, config.job).prefix)

