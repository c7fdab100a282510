"""One master process: the gRPC server, and the campaign loop that makes it leader or standby.

The server answers from the start: as a standby it is NOT_SERVING and every Master
RPC says where the leader is. A trainer's call (one with a session) is first held up to
`--failover-hold` in case this master serves meanwhile: through a failover the
trainers waiting at the next leader are answered the moment it serves, not one backoff
later. When this process wins the election it builds a `Dispatcher` from etcd and
serves; when it loses the lease (paused, partitioned, etcd gone past the TTL) or a
write's fence fails, it steps down and campaigns again.

Faults of etcd (unreachable, timing out, deposed us) are expected: the campaign is
retried with backoff and a warning. Anything else is a bug: it is logged with its
traceback and the process exits non-zero (1; 2 for bad flags or state, which no
retry fixes), so that its supervisor restarts it. etcd refusing our credentials is
not a fault to retry: one line, exit 1.

Every master, leader or standby, announces itself in etcd on its election session's
lease (`master.presence`), once per session: the status page lists them from there.

Security (docs/design.md section 8a): TLS with `--tls-cert/--tls-key` (mTLS with
`--tls-client-ca`), and every Master RPC through one `master.authorization`
interceptor with the job's tokens (`--tokens-dir`) and the cluster autoscaler's scaler
token (`--scaler-token-file`, GetStatus and ScaleTrainers only). A master without TLS or
tokens says so at start, in a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from pathlib import Path

import aetcd
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from master import inspection, metrics
from master.authorization import Authorization
from master.config import LOOPBACK_HOSTS, MasterConfig, SpecError, TlsFiles
from master.dispatcher import Dispatcher, lease_process
from master.malformed import add_master_servicer
from master.mirror import DoneMarkMirror
from master.presence import (
    MasterPresence,
    announce,
    dead_predecessor,
    network_id,
    read_masters,
    sole_listener_at,
)
from master.rate_limit import RegistrationLimit
from master.servicer import MasterServicer
from master.store_errors import NotLeader, StoreUnavailable
from master.web import StatusPage
from paddlecloud import etcd
from paddlecloud.aio import cancel_and_wait
from paddlecloud.api import SERVICE_NAME
from paddlecloud.auth import CredentialError, JobTokens, ScalerToken, TokenRoles
from paddlecloud.keys import JobKeys
from paddlecloud.wire import SERVER_KEEPALIVE

logger = logging.getLogger(__name__)

RETRY_FIRST = 0.5   # seconds before the first retry of an interrupted campaign
RETRY_MAX = 8.0     # ... doubling up to this

# gRPC core cancels calls the Python server has not picked up yet once 1,000 of them
# wait (CANCELLED, with no word why): past ~1,000 trainers a busy master would lose calls
# that way. The queue is made deep enough never to overflow, and load is shed in the
# servicer instead, on purpose and cheaply (`--max-calls-in-flight`: RESOURCE_EXHAUSTED).
PENDING_CALLS_LIMIT = 1 << 20
SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),  # a port of its own: `presence.sole_listener_at` relies on it
    ("grpc.server.max_pending_requests", PENDING_CALLS_LIMIT),
    ("grpc.server.max_pending_requests_hard_limit", PENDING_CALLS_LIMIT),
    *SERVER_KEEPALIVE,  # the clients' pings while their calls wait in that queue
]

_ETCD_FAULTS = (etcd.EtcdUnavailable, aetcd.ClientError, StoreUnavailable, NotLeader, OSError,
                asyncio.TimeoutError)
_TRANSIENT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                              grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED,
                              grpc.StatusCode.RESOURCE_EXHAUSTED})


def is_etcd_fault(error: BaseException) -> bool:
    """An expected fault of etcd or of leadership (retried), as opposed to a bug (surfaced)."""
    if isinstance(error, _ETCD_FAULTS):
        return True
    return isinstance(error, grpc.RpcError) and error.code() in _TRANSIENT_CODES


class MasterNode:
    def __init__(self, config: MasterConfig, client) -> None:
        self.config = config
        self.client = client
        self.keys = JobKeys(config.namespace, config.job)
        self.advertise = config.advertise or f"{os.environ.get('POD_IP', '127.0.0.1')}:{config.port}"
        self.dispatcher: Dispatcher | None = None
        self.leader_hint: str | None = None
        self.page_url = ""  # the status page's, set by `serve` once it listens
        # set by `serve` once it listens: no other live process can listen at `advertise`
        self.sole_listener = False
        self.network = network_id()  # where `advertise` lives (`master.presence`)
        # Earlier sessions of this process: a term ends (its session lost to an etcd blip)
        # before etcd lets its lease lapse, and the next may find the leader key on it.
        self.past_leases: set[int] = set()
        self.started = time.time()
        self.health = HealthServicer()
        self.serving = False  # what the health service says (also the HTTP port's /ready)
        self.stopping = asyncio.Event()
        self.fatal: Exception | None = None
        self._change = asyncio.Event()  # set, and replaced, when what a held call waits for changes
        self._other_terms = 0  # terms of other masters seen begin: a held call then goes there
        # The leader key's create revision last seen: a campaign started again (this master's
        # etcd session lost under load) sees the same term again, which is not a new one
        self._term_seen = 0

    def _changed(self) -> None:
        """Wakes the calls held in `serving_dispatcher`."""
        self._change.set()
        self._change = asyncio.Event()

    def stop(self) -> None:
        self.stopping.set()
        self._changed()

    async def serving_dispatcher(self, seconds: float) -> Dispatcher | None:
        """The dispatcher once this master serves, waited for up to `seconds`: a trainer's call
        held through a failover (`--failover-hold`). None sooner when another master's term
        begins (the call goes there; a master restarted at the leader's address counts), or
        this one stops."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        terms = self._other_terms
        while self.dispatcher is None:
            if self.stopping.is_set() or self._other_terms != terms:
                return None
            change = self._change
            try:
                await asyncio.wait_for(change.wait(), deadline - loop.time())
            except asyncio.TimeoutError:
                return None
        return self.dispatcher

    async def set_serving(self, serving: bool) -> None:
        self.serving = serving
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for service in ("", SERVICE_NAME):
            await self.health.set(service, status)

    def _seen_leader(self, address: str, term: int) -> None:
        """The campaign saw another master's term (`term`: the leader key's create revision)
        begin; one seen before (a campaign started again) changes nothing for held calls."""
        if address != self.leader_hint:
            logger.info("standby: the leader is %s", address)
        self.leader_hint = address
        if term != self._term_seen:
            self._term_seen = term
            self._other_terms += 1
        self._changed()

    async def run(self) -> None:
        """Campaigns, leads until deposed, campaigns again; returns when stopping, or on a
        fatal error (kept in `fatal`: see `exit_code`)."""
        await self.set_serving(False)
        backoff = RETRY_FIRST
        while not self.stopping.is_set():
            try:
                await self._term()
                backoff = RETRY_FIRST
            except SpecError as error:
                self.fatal = error
                return
            except Exception as error:
                if self.stopping.is_set():
                    return
                if etcd.is_auth_failure(error):
                    logger.error("etcd refused the master's credentials: %s", error)
                    self.fatal = error
                    return
                if not is_etcd_fault(error):
                    logger.exception("the master failed: %s: %s", type(error).__name__, error)
                    self.fatal = error
                    return
                logger.warning("campaign interrupted: %s: %s; retrying in %.1fs",
                               type(error).__name__, error, backoff)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), backoff)
                backoff = min(backoff * 2, RETRY_MAX)

    def exit_code(self) -> int:
        """0 after a clean stop; 2 for bad flags or state (no retry helps); 1 for a bug."""
        if self.fatal is None:
            return 0
        return 2 if isinstance(self.fatal, SpecError) else 1

    async def _term(self) -> None:
        session = await etcd.Session(self.client, ttl=self.config.election_ttl).open()
        election = etcd.Election(session, self.keys.leader)
        mirror = DoneMarkMirror(self.client, self.keys)  # while standby: the first load takes it
        mirror.start()
        keeper = lease_process(self.config)  # started while standing by: a failover's KeepAlives
        keeper.start()                       # must not wait for a Python to start
        try:
            # read before our presence replaces its predecessor's (`master.presence`)
            dead = (await dead_predecessor(self.client, self.keys, self.advertise, network=self.network)
                    if self.sole_listener else None)
            reclaim = {*self.past_leases, *([dead] if dead else [])}
            # present for as long as this session lives, leader or standby
            await announce(self.client, self.keys, MasterPresence(
                advertise=self.advertise, page=self.page_url, started=self.started,
                network=self.network), lease=session.lease_id)
            campaign = asyncio.create_task(election.campaign(self.advertise, on_leader=self._seen_leader,
                                                             reclaim=reclaim))
            stop = asyncio.create_task(self.stopping.wait())
            await asyncio.wait({campaign, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not campaign.done():
                await cancel_and_wait(campaign)
                return
            stop.cancel()
            leadership = campaign.result()
            logger.info("elected leader of job %s/%s as %s", self.config.namespace, self.config.job,
                        self.advertise)
            self.leader_hint = self.advertise
            dispatcher = Dispatcher(client=self.client, config=self.config, leadership=leadership,
                                    advertise=self.advertise, mirror=mirror, keeper=keeper)
            deployment = None
            try:
                await dispatcher.start()
                await mirror.stop()
                self.dispatcher = dispatcher
                self._changed()  # the calls held for this term are served now
                await self.set_serving(True)
                if self.config.job_spec:
                    deployment = asyncio.create_task(self._deploy(dispatcher), name="deployment")
                await self._lead(session, dispatcher)
            finally:
                await cancel_and_wait(deployment)  # objects stay in place for the next leader
                self.dispatcher = None
                await self.set_serving(False)
                await dispatcher.stop()
                if not session.lost.is_set():
                    await election.resign(leadership)
        finally:
            self.past_leases.add(session.lease_id)  # this term is over: nothing leads on it
            await mirror.stop()
            await keeper.close()
            await session.close()

    async def _deploy(self, dispatcher: Dispatcher) -> None:
        """Deploys the job's pservers and trainers on Kubernetes and follows them to the end.

        A permanent deploy error fails the job (`master.deployment` records it); a
        transient one deposes this leader, so another master tries.
        """
        from master.deployment import StepDown, deploy_job

        try:
            verdict = await deploy_job(dispatcher, Path(self.config.job_spec))
        except StepDown as error:
            logger.error("%s: stepping down so that another master tries", error)
            if not dispatcher.deposed.done():
                dispatcher.deposed.set_result(error)
            return
        if verdict is not None:
            logger.info("job %s ended: %s (%s)", self.config.job, verdict.phase, verdict.reason)

    async def _lead(self, session: etcd.Session, dispatcher: Dispatcher) -> None:
        waits = {
            asyncio.create_task(session.lost.wait(), name="lease-lost"),
            asyncio.ensure_future(dispatcher.deposed),
            asyncio.create_task(self.stopping.wait(), name="stopping"),
        }
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if not self.stopping.is_set():
            logger.warning("stepping down: %s",
                           "election lease lost" if session.lost.is_set() else dispatcher.deposed.result())


def _server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    cert, key = Path(tls.cert).read_bytes(), Path(tls.key).read_bytes()
    client_ca = Path(tls.client_ca).read_bytes() if tls.client_ca else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca,
                                       require_client_auth=client_ca is not None)


def _warn_if_open(config: MasterConfig) -> None:
    """Says at start what a master without TLS or tokens exposes. Plaintext with tokens on a
    loopback address (a local job's masters) is not warned about: its calls never leave the
    machine, and anyone who could read them there could read the token files too."""
    if config.open_access:
        logger.warning("INSECURE: no --tokens-dir: every caller who reaches %s:%d may do anything "
                       "(register, finish tasks, restart epochs)%s", config.host, config.port,
                       "" if config.insecure else "; fine on loopback only")
    if config.tls is None and (config.open_access or config.host not in LOOPBACK_HOSTS):
        logger.warning("INSECURE: no --tls-cert: calls%s travel in plaintext",
                       "" if config.open_access else " and their tokens")


async def serve(config: MasterConfig) -> int:
    """Runs a master until SIGTERM/SIGINT; returns the process exit code."""
    try:
        job_tokens = JobTokens.load(Path(config.tokens_dir)) if config.tokens_dir else None
        scaler = (ScalerToken(Path(config.scaler_token_file), namespace=config.namespace)
                  if config.scaler_token_file else None)
        roles = TokenRoles(job_tokens, job=config.job, scaler=scaler) if job_tokens else None
        credentials = _server_credentials(config.tls) if config.tls else None
    except (CredentialError, OSError) as error:
        logger.error("%s", error)
        return 2
    try:
        client = await etcd.connect(config.etcd_endpoints, timeout=config.etcd_timeout,
                                    credentials=config.etcd_credentials,
                                    probe=JobKeys(config.namespace, config.job).prefix)
    except (etcd.EtcdUnavailable, ValueError) as error:
        logger.error("%s", error)
        return 1
    node = MasterNode(config, client)
    # Without tokens every caller is the operator (`authorization.caller()`'s default): the
    # interceptor would change nothing, and costs every call (`master.authorization`).
    interceptors = [Authorization(roles)] if roles is not None else []
    server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=interceptors)
    add_master_servicer(
        MasterServicer(dispatcher=lambda: node.dispatcher, leader_hint=lambda: node.leader_hint,
                       serving_dispatcher=node.serving_dispatcher, hold=config.failover_hold,
                       max_in_flight=config.max_calls_in_flight, task_streams=config.task_streams,
                       session_token=roles.session_token if roles else None,
                       registrations=RegistrationLimit(rate=config.register_rate, burst=config.register_burst)),
        server)
    health_pb2_grpc.add_HealthServicer_to_server(node.health, server)
    reflection.enable_server_reflection(
        [SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME], server)
    address = f"{config.host}:{config.port}"
    try:
        if credentials is not None:
            server.add_secure_port(address, credentials)
        else:
            server.add_insecure_port(address)
    except RuntimeError as error:
        logger.error("cannot listen on %s: %s", address, error)
        await client.close()
        return 1
    node.sole_listener = sole_listener_at(node.advertise, host=config.host, port=config.port)
    await server.start()
    page = None
    if config.metrics_port:
        metrics.collect_state(
            lambda: inspection.metrics_snapshot(node.dispatcher) if node.dispatcher else None)
        # the page opens to the job's viewer and operator tokens (a trainer's is refused)
        page_tokens = ({token: role for role, token in job_tokens.as_mapping().items()}
                       if job_tokens else None)
        page = StatusPage(job=config.job, namespace=config.namespace, advertise=node.advertise,
                          dispatcher=lambda: node.dispatcher, leader_hint=lambda: node.leader_hint,
                          masters=lambda: read_masters(client, node.keys), tokens=page_tokens,
                          serving=lambda: node.serving)
        try:
            await page.start(host=config.host, port=config.metrics_port)
        except OSError as error:
            logger.error("cannot serve the status page on %s:%d: %s", config.host,
                         config.metrics_port, error)
            await server.stop(grace=None)
            await client.close()
            return 1
        logger.info("status page and /metrics at http://%s:%d/", config.host, page.port)
        node.page_url = f"http://{node.advertise.rpartition(':')[0]}:{page.port}/"
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, node.stop)
    logger.info("master of job %s/%s listening on %s (advertised as %s; event loop: %s)", config.namespace,
                config.job, address, node.advertise, type(loop).__module__.partition(".")[0])
    _warn_if_open(config)
    try:
        await node.run()
    finally:
        if page is not None:
            await page.stop()
        await server.stop(grace=1)
        await client.close()
    if isinstance(node.fatal, SpecError):
        logger.error("%s", node.fatal)
    return node.exit_code()


__all__ = ["serve", "MasterNode"]
