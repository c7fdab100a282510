"""One pserver agent, start to end: claim a slot, wait for the others, run the pserver.

    connect to etcd -> open a session (lease + keep-alive)
    -> claim slot i (`pserver_agent.slots`)
    -> wait until every slot 0..n-1 is registered
    -> run the pserver with the PaddlePaddle environment (`pserver_env`), restarting
       it on a crash (`pserver_agent.supervisor`)
    -> stop it when the job is done (`pserver_agent.jobwatch`) and its trainers left (at
       most --trainers-grace later), on SIGTERM/SIGINT, or when the lease is lost
    -> revoke the lease, which releases the slot at once.

Exit codes (`run_agent`): 0 when the job is done or the pserver exited 0 by itself;
the pserver's own code (shell style, 128+N for signal N) after a forwarded
SIGTERM/SIGINT or past the restart limit; 128+N for a signal that came before any
pserver ran; 1 when the lease is lost. Errors that reach the caller: `EtcdUnavailable`
and `AgentConfigError` (see `pserver_agent.cli` for their exit codes).

What this does NOT guarantee: that only one pserver serves a slot at every instant.
An agent that loses etcd notices that its lease is gone only when its keep-alive
fails past the TTL, and stops its pserver then, so for up to the TTL (plus the
stop's grace period) an agent that took the slot over may run a second pserver at
the same endpoint (locally its bind fails and it is restarted; on Kubernetes the
StatefulSet keeps one pod per ordinal). The pserver is also not restarted when one
of the *other* slots changes hands: endpoints never change, so it need not be.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Mapping

import aetcd

from paddlecloud.aio import cancel_and_wait
from paddlecloud.deployer import PSERVER_RESTORE_ENV
from paddlecloud.etcd import Session, connect
from paddlecloud.exits import signal_exit_code
from paddlecloud.keys import JobKeys
from pserver_agent.config import AgentConfig
from pserver_agent.jobwatch import (
    job_done_reason,
    trainers_alive,
    wait_until_job_done,
    wait_until_trainers_left,
)
from pserver_agent.slots import Claim, SlotTable
from pserver_agent.supervisor import PserverSupervisor, RestartPolicy

logger = logging.getLogger(__name__)

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
ETCD_CREDENTIAL_ENV = frozenset({"PADDLE_ETCD_CERT_FILE", "PADDLE_ETCD_KEY_FILE", "PADDLE_ETCD_USER",
                                 "PADDLE_ETCD_PASSWORD", "PADDLE_ETCD_PASSWORD_FILE"})


def pserver_env(config: AgentConfig, *, claim: Claim, endpoints: list[str],
                base: Mapping[str, str]) -> dict[str, str]:
    """The pserver's environment (docs/design.md section 8): `base` plus its place in the job,
    less the agent's etcd credentials (the pserver's own code needs no etcd rights)."""
    env = {k: v for k, v in base.items() if k not in ETCD_CREDENTIAL_ENV}
    env.update(
        TRAINING_ROLE="PSERVER",
        PADDLE_PSERVER_ID=str(claim.index),
        POD_IP=claim.host,
        PADDLE_PORT=str(claim.port),
        PADDLE_PSERVERS_NUM=str(config.num_pservers),
        PADDLE_PSERVERS_IP_PORT_LIST=",".join(endpoints),
        PADDLE_JOB_NAME=config.job,
        PADDLE_NAMESPACE=config.namespace,
        PADDLE_ETCD_ENDPOINTS=config.etcd_endpoints,
    )
    if config.num_trainers is not None:
        env["PADDLE_TRAINERS_NUM"] = config.num_trainers
    return env


async def run_agent(config: AgentConfig) -> int:
    """Runs one agent to its end and returns its exit code; the slot is released on return."""
    client = await connect(config.etcd_endpoints, timeout=config.etcd_timeout,
                           probe=JobKeys(config.namespace, config.job).prefix)
    try:
        session = await Session(client, ttl=config.lease_ttl).open()
        try:
            return await PserverAgent(config=config, client=client, session=session).run()
        finally:
            await release(session)
    finally:
        await client.close()


async def release(session: Session) -> None:
    """Revokes the session's lease, so the slot is free at once; then closes the session.

    Revoked here rather than by `Session.close()` to say in the log whether the slot
    was freed at once or will only free when the lease lapses.
    """
    if not session.lost.is_set():
        try:
            await asyncio.wait_for(session.client.revoke_lease(session.lease_id), 5)
            logger.info("released lease %x", session.lease_id)
        except Exception as error:  # the slot frees when the lease lapses instead
            logger.warning("could not revoke lease %x (%s): the slot frees within the TTL",
                           session.lease_id, error)
    await session.close(revoke=False)


class PserverAgent:
    """Claims a slot on `session`'s lease and supervises the pserver; `run()` once."""

    def __init__(self, *, config: AgentConfig, client: aetcd.Client, session: Session) -> None:
        self.config = config
        self.client = client
        self.session = session
        self.keys = JobKeys(config.namespace, config.job)
        self.supervisor: PserverSupervisor | None = None
        self._signal: int | None = None
        self._signalled = asyncio.Event()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in FORWARDED_SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            return await self._run()
        finally:
            for sig in FORWARDED_SIGNALS:
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        if self._signal is None:
            logger.info("got %s: stopping", signal.Signals(sig).name)
            self._signal = sig
            self._signalled.set()
        elif self.supervisor is not None:
            self.supervisor.forward(sig)

    async def _run(self) -> int:
        reason = await job_done_reason(self.client, self.keys)
        if reason is not None:
            logger.info("job %s is done (%s): no pserver to run", self.config.job, reason)
            return 0
        ends = {
            asyncio.create_task(wait_until_job_done(self.client, self.keys), name="job-done"): "job",
            asyncio.create_task(self.session.lost.wait(), name="lease-lost"): "lost",
            asyncio.create_task(self._signalled.wait(), name="signalled"): "signal",
        }
        tasks = list(ends)
        try:
            setup = asyncio.create_task(self._claim_and_gather(), name="claim")
            tasks.append(setup)
            await asyncio.wait({setup, *ends}, return_when=asyncio.FIRST_COMPLETED)
            if setup.done():
                claim, endpoints = setup.result()  # a bad slot or an etcd error raises here
            if not setup.done() or any(task.done() for task in ends):
                return self._early_exit(ends)

            env = pserver_env(self.config, claim=claim, endpoints=endpoints, base=os.environ)
            self.supervisor = PserverSupervisor(
                command=self.config.command, env=env, grace=self.config.grace,
                restore_first=not claim.first or os.environ.get(PSERVER_RESTORE_ENV) == "1",
                policy=RestartPolicy(limit=self.config.restart_limit, backoff=self.config.restart_backoff,
                                     max_backoff=self.config.max_backoff))
            logger.info("every pserver slot is registered (%s): starting pserver %d",
                        ",".join(endpoints), claim.index)
            supervised = asyncio.create_task(self.supervisor.run(), name="supervisor")
            tasks.append(supervised)
            await asyncio.wait({supervised, *ends}, return_when=asyncio.FIRST_COMPLETED)
            if supervised.done():
                code = supervised.result()
                return 0 if code is None else code
            return await self._stop_pserver(ends, supervised)
        finally:
            await cancel_and_wait(*tasks)

    async def _claim_and_gather(self) -> tuple[Claim, list[str]]:
        table = SlotTable(self.client, self.keys, num_slots=self.config.num_pservers,
                          lease_id=self.session.lease_id, pod_ip=self.config.pod_ip,
                          port=self.config.port)
        how = self.config.index_source or "first free slot"
        logger.info("claiming a pserver slot of job %s/%s (%s) on lease %x", self.config.namespace,
                    self.config.job, how, self.session.lease_id)
        claim = await table.claim(index=self.config.index)
        logger.info("claimed pserver slot %d at %s%s", claim.index, claim.endpoint,
                    " (served before: the pserver will restore)" if not claim.first
                    else " (the job resumes: the pserver will restore)"
                    if os.environ.get(PSERVER_RESTORE_ENV) == "1" else "")
        return claim, await table.wait_all_registered()

    async def _wait_for_trainers(self, reason: str) -> None:
        """The job's data is done: the pserver serves on until its trainers left (their last
        evaluation, save or `stop_worker` goes through it), at most `trainers_grace` seconds."""
        try:
            alive = await trainers_alive(self.client, self.keys)
        except Exception:  # etcd down: wait as if some were there
            alive = -1
        if alive == 0:
            return
        logger.info("job %s is done (%s): serving until its trainers left (at most %gs)",
                    self.config.job, reason, self.config.trainers_grace)
        try:
            await asyncio.wait_for(wait_until_trainers_left(self.client, self.keys),
                                   self.config.trainers_grace)
        except asyncio.TimeoutError:
            logger.warning("trainers still hold sessions %gs after the job's end: stopping anyway",
                           self.config.trainers_grace)

    def _reason(self, ends: dict[asyncio.Task, str]) -> str:
        done = {name for task, name in ends.items() if task.done()}
        for name in ("signal", "lost", "job"):  # a signal wins; a job done wins least
            if name in done:
                return name
        raise AssertionError(f"no end among {sorted(done)}")

    def _early_exit(self, ends: dict[asyncio.Task, str]) -> int:
        reason = self._reason(ends)
        if reason == "signal":
            assert self._signal is not None
            return signal_exit_code(self._signal)
        if reason == "lost":
            logger.error("lost etcd lease %x before the pserver started", self.session.lease_id)
            return 1
        job = next(task for task, name in ends.items() if name == "job")
        logger.info("job %s is done (%s): no pserver to run", self.config.job, job.result())
        return 0

    async def _stop_pserver(self, ends: dict[asyncio.Task, str], supervised: asyncio.Task) -> int:
        assert self.supervisor is not None
        reason = self._reason(ends)
        if reason == "signal":
            assert self._signal is not None
            await self.supervisor.stop(self._signal)
            code = await supervised
            return signal_exit_code(self._signal) if code is None else code
        if reason == "lost":
            logger.error("lost etcd lease %x: another agent may take slot; stopping the pserver",
                         self.session.lease_id)
            await self.supervisor.stop(signal.SIGTERM)
            await supervised
            return 1
        job = next(task for task, name in ends.items() if name == "job")
        await self._wait_for_trainers(job.result())
        logger.info("job %s is done (%s): stopping the pserver", self.config.job, job.result())
        await self.supervisor.stop(signal.SIGTERM)
        await supervised
        return 0
