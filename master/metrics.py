"""Prometheus metrics of the master (`--metrics-port`).

Counters and histograms are updated where things happen; the gauges of task
counts, epoch and sessions are read from the live state at scrape time, so the
hot path pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry()

DISPATCHES = Counter("paddlecloud_master_dispatches", "Tasks handed out", registry=REGISTRY)
FINISHES = Counter("paddlecloud_master_finishes", "Tasks counted done", registry=REGISTRY)
STALE_REPORTS = Counter("paddlecloud_master_stale_reports",
                        "Reports that named no live assignment", ["kind"], registry=REGISTRY)
REQUEUES = Counter("paddlecloud_master_requeues", "Tasks put back to todo or failed, by cause",
                   ["cause"], registry=REGISTRY)
EPOCHS = Counter("paddlecloud_master_epochs_completed", "Epochs completed", registry=REGISTRY)
RPC_LATENCY = Histogram(
    "paddlecloud_master_rpc_seconds", "Time to answer an RPC", ["method"], registry=REGISTRY,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
BATCH_SIZE = Histogram("paddlecloud_master_etcd_batch_writes",
                       "Transactions per etcd request (group commit)", registry=REGISTRY,
                       buckets=(1, 2, 4, 8, 16, 32, 64, 128))
SHED_CALLS = Counter("paddlecloud_master_shed_calls",
                     "Calls answered RESOURCE_EXHAUSTED past --max-calls-in-flight", ["method"],
                     registry=REGISTRY)
LEASE_REFRESHES = Counter("paddlecloud_master_lease_refreshes",
                          "Trainer leases refreshed in etcd (KeepAlive, or piggybacked on a call)",
                          registry=REGISTRY)


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
        yield GaugeMetricFamily("paddlecloud_master_is_leader", "1 on the leading master",
                                value=1 if numbers else 0)


def serve(port: int, read: Callable[[], dict | None]) -> None:
    REGISTRY.register(StateCollector(read))
    start_http_server(port, registry=REGISTRY)
