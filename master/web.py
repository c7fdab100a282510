"""The master's HTTP port: its job's status page at `/`, the page's JSON under `/api/`,
Prometheus' `/metrics` (docs/design.md §11), and `/ready`: the pod's readiness probe (200 on the
leader once it serves, as the gRPC health check's SERVING; 503 on a standby or while
loading), plain HTTP so that the kubelet's own probe reads it (its gRPC probe speaks no TLS).

One aiohttp application on the master's own event loop. Handlers read the job
only through `master.inspection`'s read-only views and answer from memory (two
etcd requests per `/api/job`: the pservers, on a leader, and the masters present,
leader and standbys, from their presence keys: `master.presence`), so a page open
in a browser costs the loop a few milliseconds a second. A `Recorder`, a background task owned by the
`StatusPage` (named, cancelled on `stop()`), samples the master's counters every
second into ring buffers of an hour: the page's plots.

Every request passes `authorize()`, the one place a caller's access is decided
(a bearer token in the `Authorization` header, or `?token=` which the page keeps
in sessionStorage), checked against the job's tokens (`--tokens-dir`: every local and
Kubernetes job has them). A master started without tokens (an explicitly insecure one)
takes every caller for an operator. A viewer sees no session ids.

`/` is this master's own job; the Job Server's `/` lists every job and serves this
page under a prefix (job_server.routers.pages), so every URL the page uses is relative.

The port faces whoever reaches it, so it bounds what a client can hold: a connection
that has not sent a whole request within IDLE_TIMEOUT seconds (a slowloris' half-sent
headers, an idle keep-alive) is closed, at most MAX_CONNECTIONS are open at once (one
more is closed as it opens), and a malformed request (a bad URL or header) is one log line,
not a traceback. Every answer carries `SECURITY_HEADERS`: a Content-Security-Policy that
lets the page load only its own script, style and data (it has no inline script or style),
no framing, and no content sniffing.

What this does NOT do: keep the time series across a restart or failover of the
master (they start with its term of leadership), or count a trainer restarted
twice within one sampling second as more than one restart.
"""

from __future__ import annotations

import asyncio
import hmac
import importlib.resources
import logging
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Literal

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from pydantic import BaseModel, Field

from master import goodput, inspection, metrics
from master.presence import MasterPresence
from paddlecloud import pagestyle
from paddlecloud.aio import cancel_and_wait
from paddlecloud.goodput_text import summarize_trainer_seconds
from paddlecloud.phase import Phase
from paddlecloud.untrusted import loggable

if TYPE_CHECKING:
    from master.dispatcher import Dispatcher

logger = logging.getLogger(__name__)

SAMPLE_PERIOD = 1.0        # seconds between two samples of the counters
HISTORY = 3600             # samples kept: an hour
FAILED_TASKS_SHOWN = 100   # failed tasks listed on the page at most
TRAINERS_SHOWN = 100       # trainers listed on the page at most (`inspection.trainers_to_show`)
CAUSES = ("expiry", "leave", "superseded", "failure", "deadline", "return")
MASTERS_READ_TIMEOUT = 2.0  # seconds the page waits for etcd's list of masters
IDLE_TIMEOUT = 15.0  # seconds a connection may take to send a whole request (and idle between two)
MAX_CONNECTIONS = 256  # open at once; the page polls over one or two per browser
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "connect-src 'self'; img-src 'self'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # `?token=` must not leave in a Referer
}

# The leader key's value and the masters present (`master.presence.read_masters`, bound).
MastersReader = Callable[[], Awaitable[tuple[str | None, list[MasterPresence]]]]

OPERATOR, VIEWER, TRAINER = "operator", "viewer", "trainer"
ROLES = (OPERATOR, VIEWER, TRAINER)
# What needs no token: the page's shell and code, the schema (no job data in them), and
# the pod's readiness (whether the Service should route here, no more).
PUBLIC_PATHS = ("/", "/api/schema", "/ready")
PUBLIC_PREFIXES = ("/static/",)
ROLE = web.RequestKey("role", str)  # the caller's role, as `authorize` decided it


# ---- authorization ------------------------------------------------------------------------


def token_of(request: web.Request) -> str | None:
    """The caller's bearer token: the `Authorization` header's, else the `token` query parameter."""
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise web.HTTPUnauthorized(text="the Authorization header must be 'Bearer <token>'")
        return token.strip()
    return request.query.get("token") or None


def authorize(request: web.Request, *, tokens: Mapping[str, str]) -> str:
    """The caller's role for this request, or an HTTP error: the one decision of access.

    `tokens` maps a token to its role; empty, everyone is an operator (a master
    without tokens is for loopback or explicitly insecure use). The page's shell,
    code and schema are open; its data needs a viewer or an operator.
    """
    path = request.path
    public = path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)
    if not tokens:
        return OPERATOR
    token = token_of(request)
    role = None
    if token is not None:
        for known, known_role in tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                role = known_role
    if public:
        return role or VIEWER
    if role is None:
        raise web.HTTPUnauthorized(text="a viewer's or an operator's token is needed",
                                   headers={"WWW-Authenticate": "Bearer"})
    if role not in (OPERATOR, VIEWER):
        raise web.HTTPForbidden(text=f"a {role}'s token does not open the status page")
    return role


# ---- the page's JSON: its models are its schema ---------------------------------------------


class EpochModel(BaseModel):
    """One bar of the page: an epoch, or a run of `epochs` epochs from `epoch` on (summed)."""

    epoch: int = Field(description="the first epoch of the bar; epochs count from 0")
    stage: Literal["past", "current", "future"]
    done: int
    pending: int
    todo: int
    failed: int
    epochs: int = Field(1, description="epochs the bar sums")
    unknown: int = Field(0, description="past epochs of the bar another master ended: "
                                        "their counts are not known to this one")


class TrainerModel(BaseModel):
    trainer: str
    session: str | None = Field(None, description="operators only; a string: 64-bit ids lose digits as JS numbers")
    session_age_s: float = Field(description="since this master first saw the session (to a second)")
    tasks: list[int]
    since_last_call_s: float = Field(description="since the trainer's last call (a keep-alive or a report)")
    restarts: int = Field(description="new sessions of this trainer id seen by this master")


class ReasonModel(BaseModel):
    epoch: int
    attempt: int
    trainer: str
    reason: str
    at: float


class FailedTaskModel(BaseModel):
    task: int
    status: Literal["todo", "pending", "done", "failed"]
    failures: int
    reasons: list[ReasonModel]


class MasterModel(BaseModel):
    advertise: str = Field(description="the master's --advertise address")
    role: Literal["leader", "standby"] = Field(description="leader: its address is the leader key's value")
    page: str = Field(description="its status page's URL (as it sees itself); empty when it serves none")
    started: float = Field(description="when its process started (wall clock)")
    this: bool = Field(description="the master that answers this request")


class GoodputModel(BaseModel):
    trainer_seconds: dict[str, float] = Field(
        description="the job's trainer-seconds by cause, productive or lost (docs/design.md §12; "
        "the causes are defined in docs/metrics.md), over its whole life")
    productive_percent: float | None = Field(None, description="productive share of all; None before any second")
    summary: str = Field(description="the same figures in the one line `paddlecloud job status` prints")


class GoodputHistoryModel(BaseModel):
    causes: list[str] = Field(description="the causes, productive first")
    at: list[float] = Field(description="wall time of each point, oldest first (the job's whole life: "
                            "the step grows as it lasts, at most a few hundred points)")
    seconds: dict[str, list[float]] = Field(description="cumulative trainer-seconds by cause at each point")


class JobModel(BaseModel):
    job: str
    namespace: str
    this_master: str
    role: Literal["leader", "standby"]
    leader: str
    phase: str
    failure_reason: str = ""
    epoch: int = 0
    num_epochs: int = 0
    num_tasks: int = 0
    counts: dict[str, int] = Field(default_factory=dict)
    requeued: int = 0
    trainers_alive: int = 0
    pservers: list[str] = Field(default_factory=list)
    masters: list[MasterModel] = Field(
        default_factory=list, description="every live master, from its presence key in etcd (a dead "
        "one goes within its election TTL); empty when etcd did not answer")
    epochs: list[EpochModel] = Field(default_factory=list)
    trainers: list[TrainerModel] = Field(
        default_factory=list, description="every live trainer in id order; when more are alive than "
        "the page lists, the ones longest since their last call, longest first")
    trainers_omitted: int = Field(0, description="live trainers not in `trainers`")
    trainer_restarts: int = Field(0, description="new sessions of known trainer ids seen by this master")
    failed_tasks: list[FailedTaskModel] = Field(default_factory=list)
    goodput: GoodputModel | None = Field(None, description="None on a standby")
    finished_total: float = 0
    requeues_total: dict[str, float] = Field(default_factory=dict)
    splits_this_epoch: int = Field(0, description="tasks split by work stealing in the current epoch")
    splits_total: int = Field(0, description="tasks split by work stealing since this master leads")
    viewer_role: Literal["operator", "viewer"]
    at: float


class SeriesModel(BaseModel):
    period_s: float
    end: float = Field(description="wall time of the last sample")
    finished_per_s: list[float]
    requeues: dict[str, list[float]] = Field(description="re-queues per second, by cause")
    trainers_alive: list[int]
    trainer_restarts: list[int]
    group_restarts: list[float] = Field(description="RestartEpoch calls per second")
    resizes: list[float] = Field(description="ScaleTrainers calls that changed the desired size, per second")


def schema() -> dict:
    return {"job": JobModel.model_json_schema(), "series": SeriesModel.model_json_schema(),
            "goodput": GoodputHistoryModel.model_json_schema()}


# ---- the time series ------------------------------------------------------------------------


class Recorder:
    """Ring buffers of the last hour, one sample a second, and what it learns of sessions."""

    def __init__(self, *, history: int = HISTORY) -> None:
        self.history = history
        self.end = 0.0
        self.finished: deque[float] = deque(maxlen=history)
        self.requeues: dict[str, deque[float]] = {c: deque(maxlen=history) for c in CAUSES}
        self.alive: deque[int] = deque(maxlen=history)
        self.trainer_restarts: deque[int] = deque(maxlen=history)
        self.group_restarts: deque[float] = deque(maxlen=history)
        self.resizes: deque[float] = deque(maxlen=history)
        self.first_seen: dict[int, float] = {}    # session -> monotonic time first seen
        self.sessions: dict[str, int] = {}        # trainer -> the last session seen of it
        self.restarts: dict[str, int] = {}        # trainer -> new sessions of it seen
        self._last: tuple[float, dict[str, float], float, float] | None = None

    def sample(self, sessions: Mapping[str, int] | None) -> None:
        """Takes one sample: the counters' increase since the last, and the live sessions
        (trainer id -> session; the registry's own dict, read as is: no copy, no sort, so
        a sample stays cheap at 10,000 trainers)."""
        self.end = time.time()  # before the reads: a sample ending after t holds all counted before t
        finished = metrics.counter_values(metrics.FINISHES).get("", 0.0)
        requeues = metrics.counter_values(metrics.REQUEUES)
        restarts = metrics.counter_values(metrics.EPOCH_RESTARTS).get("", 0.0)
        resizes = sum(metrics.counter_values(metrics.RESIZES).values())  # up and down alike
        last = self._last or (finished, requeues, restarts, resizes)
        self._last = (finished, requeues, restarts, resizes)
        self.finished.append(finished - last[0])
        for cause in requeues.keys() - self.requeues.keys():
            self.requeues[cause] = deque([0.0] * (len(self.finished) - 1), maxlen=self.history)
        for cause, ring in self.requeues.items():
            ring.append(requeues.get(cause, 0.0) - last[1].get(cause, 0.0))
        self.group_restarts.append(restarts - last[2])
        self.resizes.append(resizes - last[3])
        self.alive.append(len(sessions) if sessions is not None else 0)
        self.trainer_restarts.append(self._see_sessions(sessions or {}))

    def _see_sessions(self, sessions: Mapping[str, int]) -> int:
        now = time.monotonic()
        restarted = 0
        for trainer, session in sessions.items():
            self.first_seen.setdefault(session, now)
            before = self.sessions.get(trainer)
            if before is not None and before != session:
                self.restarts[trainer] = self.restarts.get(trainer, 0) + 1
                restarted += 1
            self.sessions[trainer] = session
        if len(self.first_seen) > len(sessions):
            for gone in self.first_seen.keys() - set(sessions.values()):
                del self.first_seen[gone]
        return restarted

    def series(self) -> SeriesModel:
        return SeriesModel(period_s=SAMPLE_PERIOD, end=self.end, finished_per_s=list(self.finished),
                           requeues={c: list(r) for c, r in self.requeues.items()},
                           trainers_alive=list(self.alive),
                           trainer_restarts=list(self.trainer_restarts),
                           group_restarts=list(self.group_restarts), resizes=list(self.resizes))


# ---- the application ------------------------------------------------------------------------


class StatusPage:
    """The master's HTTP port: the page, its JSON, `/metrics`; and the recorder's task."""

    def __init__(self, *, job: str, namespace: str, advertise: str,
                 dispatcher: Callable[[], Dispatcher | None], leader_hint: Callable[[], str | None],
                 masters: MastersReader | None = None, tokens: Mapping[str, str] | None = None,
                 serving: Callable[[], bool] | None = None, trainers_shown: int = TRAINERS_SHOWN,
                 idle_timeout: float = IDLE_TIMEOUT) -> None:
        self.job, self.namespace, self.advertise = job, namespace, advertise
        self.idle_timeout = idle_timeout
        self.trainers_shown = trainers_shown
        self.serving = serving
        self.dispatcher = dispatcher
        self.leader_hint = leader_hint
        self.read_masters = masters
        self._masters_failing = False
        self.tokens = dict(tokens or {})
        bad = {role for role in self.tokens.values() if role not in ROLES}
        if bad:
            raise ValueError(f"token roles {sorted(bad)}: must be one of {', '.join(ROLES)}")
        self.recorder = Recorder()
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self._sampler: asyncio.Task[None] | None = None
        self.port = 0

    def app(self) -> web.Application:
        @web.middleware
        async def guard(request: web.Request, handler):
            request[ROLE] = authorize(request, tokens=self.tokens)
            return await handler(request)

        app = web.Application(middlewares=[guard])
        app.on_response_prepare.append(_secure_headers)  # errors and static files too
        static = importlib.resources.files("master") / "static"
        app.router.add_get("/", self._index)
        app.router.add_get("/api/job", self._job)
        app.router.add_get("/api/series", self._series)
        app.router.add_get("/api/goodput", self._goodput)
        app.router.add_get("/api/schema", self._schema)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/static/page.css", self._stylesheet)  # before the folder: it is not in it
        app.router.add_static("/static/", str(static))
        return app

    async def start(self, *, host: str, port: int) -> None:
        """Listens on `host:port` (0: a free port, then in `self.port`) and starts sampling."""
        handler_args = dict(access_log=None, keepalive_timeout=self.idle_timeout,
                            logger=_OneLineBadRequests(logger, {}))
        self._runner = web.AppRunner(self.app(), **handler_args)
        await self._runner.setup()
        server, loop = self._runner.server, asyncio.get_running_loop()
        assert server is not None
        self._listener = await loop.create_server(
            lambda: _LimitedHandler(server, loop=loop, limit=MAX_CONNECTIONS, **handler_args),
            host, port, reuse_address=True)
        self.port = self._listener.sockets[0].getsockname()[1]
        self._sampler = asyncio.create_task(self._sample_forever(), name="status-page-sampler")

    async def stop(self) -> None:
        await cancel_and_wait(self._sampler)
        if self._listener is not None:
            self._listener.close()
        if self._runner is not None:
            await self._runner.cleanup()  # closes the connections the listener accepted
        if self._listener is not None:
            await self._listener.wait_closed()

    async def _sample_forever(self) -> None:
        """Samples the counters every second until cancelled; a failed sample is logged, not fatal."""
        while True:
            try:
                d = self.dispatcher()
                self.recorder.sample(d.core.sessions.by_trainer if d is not None else None)
            except Exception:
                logger.exception("the status page's sample failed")
            await asyncio.sleep(SAMPLE_PERIOD)

    # ---- handlers -----------------------------------------------------------------------

    async def _index(self, request: web.Request) -> web.StreamResponse:
        page = importlib.resources.files("master") / "static" / "index.html"
        return web.Response(text=page.read_text(encoding="utf-8"), content_type="text/html",
                            headers={"Cache-Control": "no-store"})

    async def _stylesheet(self, request: web.Request) -> web.Response:
        return web.Response(text=pagestyle.stylesheet(), content_type=pagestyle.MEDIA_TYPE,
                            headers={"Cache-Control": pagestyle.CACHE_CONTROL})

    async def _schema(self, request: web.Request) -> web.Response:
        return web.json_response(schema())

    async def _ready(self, request: web.Request) -> web.Response:
        if self.serving is not None and self.serving():
            return web.Response(text="serving\n")
        return web.Response(status=503, text="not serving: a standby, or loading\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def _series(self, request: web.Request) -> web.Response:
        return _json(self.recorder.series())

    async def _goodput(self, request: web.Request) -> web.Response:
        return _json(self.goodput_history())

    def goodput_history(self) -> GoodputHistoryModel:
        """The leader's goodput figures over the job's life (empty on a standby)."""
        d = self.dispatcher()
        points = d.accounting.meter.history_figures() if d is not None else []
        return GoodputHistoryModel(causes=list(goodput.CAUSES), at=[wall for wall, _ in points],
                                   seconds={c: [figures[c] for _, figures in points] for c in goodput.CAUSES})

    async def _job(self, request: web.Request) -> web.Response:
        return _json(await self.job_model(operator=request[ROLE] == OPERATOR))

    async def masters(self) -> list[MasterModel]:
        """Every master present in etcd with its role (one etcd request); [] when etcd does not
        answer in time (said once in the log until it answers again) or no reader was given."""
        if self.read_masters is None:
            return []
        try:
            leader, present = await asyncio.wait_for(self.read_masters(), MASTERS_READ_TIMEOUT)
        except Exception as error:
            if not self._masters_failing:
                logger.warning("the status page cannot list the masters: %s: %s",
                               type(error).__name__, error)
            self._masters_failing = True
            return []
        self._masters_failing = False
        return [MasterModel(advertise=m.advertise, role="leader" if m.advertise == leader else "standby",
                            page=m.page, started=m.started, this=m.advertise == self.advertise)
                for m in present]

    async def job_model(self, *, operator: bool) -> JobModel:
        """The page's job panel, as this master knows it now."""
        d = self.dispatcher()
        common = dict(job=self.job, namespace=self.namespace, this_master=self.advertise,
                      viewer_role=OPERATOR if operator else VIEWER, at=time.time(),
                      masters=await self.masters(),
                      finished_total=metrics.counter_values(metrics.FINISHES).get("", 0.0),
                      requeues_total=metrics.counter_values(metrics.REQUEUES))
        if d is None:
            return JobModel(role="standby", leader=self.leader_hint() or "", phase="Standby", **common)
        status = await inspection.status(d)
        now = time.monotonic()
        rec = self.recorder
        listed, omitted = inspection.trainers_to_show(d, limit=self.trainers_shown)
        trainers = [
            TrainerModel(trainer=t.trainer, session=str(t.session) if operator else None,
                         session_age_s=round(now - rec.first_seen.get(t.session, now), 1),
                         tasks=t.tasks, since_last_call_s=round(t.since_last_call, 1),
                         restarts=rec.restarts.get(t.trainer, 0))
            for t in listed]
        shown = list(dict.fromkeys([*reversed(metrics.FAILURE_REASONS.tasks_seen()),
                                    *inspection.failed_tasks(d, limit=FAILED_TASKS_SHOWN)]))
        failed = [
            FailedTaskModel(task=f.task, status=f.status.name.lower(), failures=f.failures,
                            reasons=[ReasonModel(**vars(r)) for r in metrics.FAILURE_REASONS.of(f.task)])
            for f in inspection.task_failures(d, shown[:FAILED_TASKS_SHOWN])
            if f.failures or f.status.name == "FAILED"]
        return JobModel(
            role="leader", leader=status.leader, phase=status.phase,
            failure_reason=inspection.failure_reason(d) if status.phase == Phase.FAILED.value else "",
            epoch=status.epoch, num_epochs=status.num_epochs, num_tasks=status.num_tasks,
            counts=status.counts, requeued=status.requeued, trainers_alive=status.trainers_alive,
            pservers=status.pservers,
            epochs=[EpochModel(**vars(bar)) for bar in inspection.epoch_bars(d)],
            trainers=trainers, trainers_omitted=omitted, trainer_restarts=sum(rec.restarts.values()),
            failed_tasks=failed, goodput=goodput_model(status.trainer_seconds or {}),
            splits_this_epoch=status.splits_this_epoch, splits_total=status.splits, **common)


def goodput_model(figures: Mapping[str, float]) -> GoodputModel:
    total = sum(figures.values())
    return GoodputModel(trainer_seconds=dict(figures),
                        productive_percent=round(100 * figures.get("productive", 0.0) / total, 1)
                        if total > 0 else None,
                        summary=summarize_trainer_seconds(figures))


async def _secure_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)


class _LimitedHandler(RequestHandler):
    """aiohttp's handler of one connection, which closes the connection as it opens when its
    server has `limit` open already. Decided in `connection_made`, where the count is exact:
    the protocols of one batch of accepted connections are all made before any is counted."""

    __slots__ = ("_server", "_limit", "_refused")

    def __init__(self, server: web.Server, *, limit: int, **kwargs) -> None:
        super().__init__(server, **kwargs)
        self._server, self._limit, self._refused = server, limit, False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if len(self._server.connections) >= self._limit:
            self._refused = True
            transport.close()
            return
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._refused:  # a refused one was never the server's
            super().connection_lost(exc)


class _OneLineBadRequests(logging.LoggerAdapter):
    """aiohttp logs each malformed request (a bad URL or header: an HttpProcessingError) with
    a traceback, so any client could flood the log; one escaped line instead. Any other
    error keeps its traceback."""

    def exception(self, msg, *args, exc_info=True, **kwargs) -> None:  # noqa: ANN001 (logging's)
        error = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(error, HttpProcessingError):
            first = (error.message or type(error).__name__).strip().splitlines()[0]
            remote = args[0] if args else "?"
            self.logger.warning("bad HTTP request from %s (%d): %s", remote, error.code, loggable(first))
            return
        self.logger.exception(msg, *args, exc_info=exc_info, **kwargs)


def _json(model: BaseModel) -> web.Response:
    return web.Response(body=model.model_dump_json(exclude_none=True).encode(),
                        content_type="application/json", headers={"Cache-Control": "no-store"})


__all__ = ["StatusPage", "Recorder", "authorize", "schema", "JobModel", "MasterModel", "SeriesModel"]
