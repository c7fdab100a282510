"""The deployment adapter: what the leader's deployer (`master.deployment.supervise`)
reads of the job and writes of its phase, through the core and the store.

What this does NOT do: deploy anything (the deployer does), or change task state. The
phase is the machine's (`master.machine.PhaseRecorded`).
"""

from __future__ import annotations

from master.core import Core
from master.machine import PhaseRecorded
from paddlecloud.phase import Phase


class DeployAdapter:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.phase_override: Phase | None = None   # set by the deployer while it deploys

    async def registered_pservers(self) -> int:
        return len(await self.core.store.pservers())

    async def record_phase(self, phase: str) -> None:
        """The deployer's phase: a fenced write of the `phase` key, shown by GetStatus."""
        known = Phase(phase)
        # Known before it is written: a RestartEpoch that would reopen the job (`Epochs`)
        # sees the verdict while its write is in flight (`MasterMachine.phase_verdict`). A
        # write that fails steps this master down; the next one loads what etcd holds.
        self.phase_override = known
        await self.core.commit(PhaseRecorded(known))

    def dataset_done(self) -> bool:
        return self.core.state is not None and self.core.state.job_over

    def dataset_failed(self) -> bool:
        return self.core.state is not None and self.core.state.failed_job
