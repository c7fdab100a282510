"""Prometheus metrics of the master, and the recent reasons of failed tasks.

Names follow Prometheus's conventions (`_total` counters, base units such as
`_seconds`, no units in labels); docs/metrics.md documents each one, and
`catalog()` is what a test checks that table against. Counters and histograms are
updated where things happen; the gauges of task
counts, epoch and sessions are read from the live state at scrape time, so the
hot path pays nothing for them. They are served as `/metrics` on the master's
HTTP port (`master.web`), whose status page also samples the counters.

`FAILURE_REASONS` keeps the last reasons a trainer gave for each failed task, in
bounded memory (the oldest task's entry goes first): what this does NOT do is keep
them across a master's restart or failover (the master's log has them all).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry()

DISPATCHES = Counter("paddlecloud_master_dispatches", "Tasks handed out", registry=REGISTRY)
FINISHES = Counter("paddlecloud_master_finishes", "Tasks counted done", registry=REGISTRY)
STALE_REPORTS = Counter("paddlecloud_master_stale_reports",
                        "Reports that named no live assignment", ["kind"], registry=REGISTRY)
REQUEUES = Counter("paddlecloud_master_requeues", "Tasks put back to todo or failed, by cause",
                   ["cause"], registry=REGISTRY)
EPOCHS = Counter("paddlecloud_master_epochs_completed", "Epochs completed", registry=REGISTRY)
SPLITS = Counter("paddlecloud_master_task_splits",
                 "Tasks split by work stealing: the unread rest of a straggler's task handed to an idle trainer",
                 registry=REGISTRY)
RPC_LATENCY = Histogram(
    "paddlecloud_master_rpc_duration_seconds", "Time to answer an RPC", ["method"], registry=REGISTRY,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
BATCH_SIZE = Histogram("paddlecloud_master_etcd_request_transactions",
                       "Transactions per etcd request (group commit)", registry=REGISTRY,
                       buckets=(1, 2, 4, 8, 16, 32, 64, 128))
RATE_LIMITED = Counter("paddlecloud_master_rate_limited_calls",
                       "Calls answered RESOURCE_EXHAUSTED past their token's rate (--register-rate)",
                       ["method"], registry=REGISTRY)
SHED_CALLS = Counter("paddlecloud_master_shed_calls",
                     "Calls answered RESOURCE_EXHAUSTED past --max-calls-in-flight", ["method"],
                     registry=REGISTRY)
SESSIONS_CAPPED = Counter("paddlecloud_master_capped_registrations",
                          "Registrations refused RESOURCE_EXHAUSTED past the job's session cap",
                          registry=REGISTRY)
HELD_CALLS = Counter("paddlecloud_master_held_calls",
                     "Trainer calls a master not serving held (--failover-hold), by how they ended: "
                     "served (it serves now) or not_leader (told where the leader is)", ["outcome"],
                     registry=REGISTRY)
TASK_STREAMS_OPENED = Counter("paddlecloud_master_task_streams_opened",
                              "GetTaskStream streams opened (a trainer keeps one while it can)", registry=REGISTRY)
TASK_STREAMS = Gauge("paddlecloud_master_task_streams", "GetTaskStream streams open now", registry=REGISTRY)
LEASE_REFRESHES = Counter("paddlecloud_master_lease_refreshes",
                          "Trainer leases refreshed in etcd (KeepAlive, or piggybacked on a call)",
                          registry=REGISTRY)
LAPSED_ALIVE = Counter("paddlecloud_master_sessions_lapsed_alive",
                       "Sessions that lapsed although their trainer called again afterwards: the "
                       "master was slower than --session-ttl, or the trainer was paused", registry=REGISTRY)
EPOCH_RESTARTS = Counter("paddlecloud_master_epoch_restarts",
                         "RestartEpoch calls (a collective group's restart)", registry=REGISTRY)
RESIZES = Counter("paddlecloud_master_resizes",
                  "ScaleTrainers calls that changed the desired size, by direction (up, down)",
                  ["direction"], registry=REGISTRY)


class StateCollector(Collector):
    """Reads the gauges from a callable that returns the live numbers, or None when standby."""

    def __init__(self, read: Callable[[], dict | None]) -> None:
        self._read = read

    def collect(self):
        numbers = self._read() or {}
        tasks = GaugeMetricFamily("paddlecloud_master_tasks", "Tasks by state", labels=["state"])
        for state, value in numbers.get("tasks", {}).items():
            tasks.add_metric([state], value)
        yield tasks
        yield GaugeMetricFamily("paddlecloud_master_epoch", "Current epoch",
                                value=numbers.get("epoch", 0))
        yield GaugeMetricFamily("paddlecloud_master_sessions_alive", "Trainer sessions alive",
                                value=numbers.get("sessions", 0))
        for bound in ("min", "max", "desired"):
            yield GaugeMetricFamily(f"paddlecloud_master_trainers_{bound}",
                                    f"The trainer range's {bound} (desired: the size scaled to)",
                                    value=numbers.get(f"{bound}_trainers", 0))
        yield GaugeMetricFamily("paddlecloud_master_is_leader", "1 on the leading master",
                                value=1 if numbers else 0)
        # goodput: kept in etcd across masters, so a counter read at scrape time
        seconds = CounterMetricFamily("paddlecloud_master_trainer_seconds",
                                      "The job's trainer-seconds, productive or lost, by cause "
                                      "(docs/design.md section 12)", labels=["cause"])
        for cause, value in (numbers.get("trainer_seconds") or {}).items():
            seconds.add_metric([cause], value)
        yield seconds


@dataclass(frozen=True)
class MetricInfo:
    """One exported metric as docs/metrics.md documents it."""

    name: str            # as exposed: a counter's with its `_total`
    type: str            # counter, gauge, histogram
    labels: tuple[str, ...]
    help: str


def catalog() -> list[MetricInfo]:
    """Every metric the master exports, the live gauges included (docs/metrics.md's table)."""
    out = [MetricInfo(name=m._name + ("_total" if m._type == "counter" else ""), type=m._type,
                      labels=tuple(m._labelnames), help=m._documentation)
           for m in globals().values() if isinstance(m, MetricWrapperBase)]
    for family in StateCollector(lambda: {"tasks": {"todo": 0}, "trainer_seconds": {"productive": 0.0}}).collect():
        labels = tuple(sorted({k for sample in family.samples for k in sample.labels}))
        name = family.name + ("_total" if family.type == "counter" else "")
        out.append(MetricInfo(name=name, type=family.type, labels=labels,
                              help=family.documentation))
    return out


def collect_state(read: Callable[[], dict | None]) -> None:
    """Adds the live gauges (read at scrape time) to the registry; once per process."""
    REGISTRY.register(StateCollector(read))


def exposition() -> bytes:
    """The Prometheus text of every metric (what `/metrics` answers)."""
    return generate_latest(REGISTRY)


def counter_values(counter: Counter) -> dict[str, float]:
    """A counter's totals by its one label's value ("" for an unlabelled counter)."""
    values: dict[str, float] = {}
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                label = next(iter(sample.labels.values()), "")
                values[label] = sample.value
    return values


@dataclass(frozen=True)
class FailureReason:
    epoch: int
    attempt: int
    trainer: str
    reason: str
    at: float  # seconds since the epoch (wall clock)


class FailureReasons:
    """The last `per_task` reasons of at most `tasks` failed tasks (the least recent goes first)."""

    def __init__(self, *, per_task: int = 5, tasks: int = 1000, reason_chars: int = 500) -> None:
        self.per_task = per_task
        self.tasks = tasks
        self.reason_chars = reason_chars
        self._by_task: OrderedDict[int, deque[FailureReason]] = OrderedDict()

    def record(self, task: int, *, epoch: int, attempt: int, trainer: str, reason: str,
               at: float) -> None:
        ring = self._by_task.pop(task, None) or deque(maxlen=self.per_task)
        if len(reason) > self.reason_chars:
            reason = reason[:self.reason_chars] + "..."
        ring.append(FailureReason(epoch, attempt, trainer, reason, at))
        self._by_task[task] = ring
        while len(self._by_task) > self.tasks:
            self._by_task.popitem(last=False)

    def of(self, task: int) -> list[FailureReason]:
        return list(self._by_task.get(task, ()))

    def tasks_seen(self) -> list[int]:
        """The tasks with reasons kept, the most recent failure last."""
        return list(self._by_task)


FAILURE_REASONS = FailureReasons()
