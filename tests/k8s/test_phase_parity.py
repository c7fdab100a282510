"""The same job endings through both backends: the same phase.

Each scenario is one way a job can end — trainers exiting 0 or failing for good or
running on, the master's data done, failed or not done — played through
`supervise` twice: with the `KubernetesDeployer` against the emulated API server
(the test plays the Job controller), and with the `LocalDeployer` running real
child processes that exit as the scenario says. Both must reach the scenario's
phase: the one decision (`paddlecloud.supervision.decide_phase`) serves both.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_k8s_deployer import FAST_RETRY, create_master, make_spec

from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.k8s.deployer import KubernetesDeployer
from paddlecloud.backends.local.children import Child
from paddlecloud.backends.local.deployer import LocalDeployer
from paddlecloud.deployer import Deployer
from paddlecloud.phase import Phase
from paddlecloud.supervision import Graces, MasterState, supervise

TRAINERS = 2
GRACES = Graces(done=0.5, exited=0.3)

# What the trainers do, as a child process and as the Job controller would report it.
PROGRAMS = {
    "exit 0": "import sys; sys.exit(0)",
    "exit 1": "import sys; sys.exit(1)",
    "run": "import time; time.sleep(120)",
}
JOB_STATUS = {
    "exit 0": {"succeeded": TRAINERS, "conditions": [{"type": "Complete", "status": "True"}]},
    "exit 1": {"failed": TRAINERS, "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "Job has reached the specified backoff limit"}]},
    "run": {"active": TRAINERS},
}


@dataclass(frozen=True)
class Scenario:
    trainers: str
    master: MasterState
    expected: Phase


SCENARIOS = {
    "trainers exit 0, data done": Scenario("exit 0", MasterState(True, done=True), Phase.SUCCEEDED),
    # The case the backends used to disagree on (Kubernetes: Succeeded; local: Failed).
    "trainers exit 0, data not done": Scenario("exit 0", MasterState(True), Phase.FAILED),
    # docs/design.md section 12: no trainer took a task, the job brought its own data
    "trainers exit 0, own data": Scenario("exit 0", MasterState(True, tasks_assigned=False),
                                          Phase.SUCCEEDED),
    "trainers exit 0, no dataset": Scenario("exit 0", MasterState(False), Phase.SUCCEEDED),
    "trainers fail for good": Scenario("exit 1", MasterState(True), Phase.FAILED),
    "trainers fail for good, data done": Scenario("exit 1", MasterState(True, done=True), Phase.FAILED),
    "trainers run, data failed": Scenario("run", MasterState(True, failed=True), Phase.FAILED),
    "trainers hang, data done": Scenario("run", MasterState(True, done=True), Phase.SUCCEEDED),
}


async def _supervise(deployer: Deployer, scenario: Scenario, *, started: Any = None) -> Phase:
    """Runs `supervise` to its end; `started()` plays what happens once the trainers exist."""
    recorded: list[Phase] = []

    async def master_state() -> MasterState:
        return scenario.master

    async def set_phase(phase: Phase, reason: str) -> None:
        recorded.append(phase)

    async def no_pservers() -> int:
        return 0

    task = asyncio.create_task(supervise(
        deployer, num_pservers=0, registered_pservers=no_pservers, master_state=master_state,
        set_phase=set_phase, poll_interval=0.02, graces=GRACES))
    try:
        if started is not None:
            await started()
        verdict = await asyncio.wait_for(task, 60)
    finally:
        task.cancel()
    assert recorded == [Phase.PENDING, Phase.STARTING, Phase.RUNNING, verdict.phase]
    return verdict.phase


async def run_on_kubernetes(scenario: Scenario, *, k8s: Any, api_client: Any, name: str) -> Phase:
    spec = make_spec(name, pservers=0, trainers=TRAINERS)
    await create_master(api_client, spec)
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    trainer = manifests.trainer_name(spec.name)

    async def play_the_job_controller() -> None:
        await k8s.wait_for(lambda: k8s.stored("jobs", spec.namespace, trainer), what="the Job")
        k8s.set_job_status(spec.namespace, trainer, JOB_STATUS[scenario.trainers])

    return await _supervise(deployer, scenario, started=play_the_job_controller)


async def run_locally(scenario: Scenario, *, tmp: Path) -> Phase:
    def spawn(role: str, index: int, command: list[str], env: dict[str, str]) -> Child:
        return Child(role=role, index=index, command=command, env=env, log_dir=tmp / "logs",
                     on_line=lambda who, text: None)

    async def no_epoch_restart(epoch: int) -> None:
        raise AssertionError("trainer restart mode never restarts an epoch")

    deployer = LocalDeployer(
        trainers=TRAINERS, pservers=0, output=tmp,
        trainer_command=[sys.executable, "-c", PROGRAMS[scenario.trainers]], pserver_command=[],
        restart_limit=0, restart_mode="trainer", spawn=spawn, user_env=lambda: dict(os.environ),
        restart_epoch=no_epoch_restart, event=lambda text: None)
    try:
        return await _supervise(deployer, scenario)
    finally:
        await deployer.cleanup(succeeded=False)
        assert not any(t.running for t in deployer.trainers)  # nothing outlives the job


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_both_backends_decide_the_same_phase(name, k8s, api_client, tmp_path):
    scenario = SCENARIOS[name]
    job = "parity-" + str(sorted(SCENARIOS).index(name))
    on_kubernetes = await run_on_kubernetes(scenario, k8s=k8s, api_client=api_client, name=job)
    locally = await run_locally(scenario, tmp=tmp_path)
    assert (on_kubernetes, locally) == (scenario.expected, scenario.expected)
