"""The command line of a job's master, built in one place for every backend.

The local backend runs `python -m paddlecloud master FLAGS`, the Kubernetes
manifests run `paddlecloud master FLAGS`; both get FLAGS from `master_flags`, so
a flag renamed in `master/cli.py` is renamed for both here. What this does NOT
do: check values — the master validates its flags and exits 2 on a bad one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

logger = logging.getLogger(__name__)


def master_flags(*, job: str, namespace: str, etcd_endpoints: str, port: int, advertise: str,
                 host: str | None = None, inputs: Sequence[str] = (), epochs: int | None = None,
                 data_format: str | None = None, chunk_bytes: int | None = None,
                 shuffle_seed: int | None = None,
                 start_epoch: int | None = None, resume_from: str | None = None,
                 session_ttl: str | None = None, election_ttl: str | None = None,
                 metrics_port: int | None = None, trainers: tuple[int, int, int] | None = None,
                 tokens_dir: str | None = None, scaler_token_file: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None, deployer: str | None = None,
                 extra: Sequence[str] = ()) -> list[str]:
    """The flags after `paddlecloud master`; None (or empty) leaves a flag to its default.

    `epochs`, `data_format`, `chunk_bytes`, `shuffle_seed` and `resume_from` are given only with
    `inputs` (they belong to the dataset; a chunk size of 0 is the master's default);
    `trainers` is (desired, min, max) at start; `extra` flags come last, as given.
    """
    flags = ["--job", job, "--namespace", namespace, "--etcd-endpoints", etcd_endpoints]
    if host is not None:
        flags += ["--host", host]
    flags += ["--port", str(port), "--advertise", advertise]
    optional = (("--metrics-port", metrics_port), ("--session-ttl", session_ttl),
                ("--election-ttl", election_ttl), ("--start-epoch", start_epoch),
                ("--tokens-dir", tokens_dir), ("--scaler-token-file", scaler_token_file),
                ("--tls-cert", tls_cert), ("--tls-key", tls_key), ("--deployer", deployer))
    flags += [arg for flag, value in optional if value is not None for arg in (flag, str(value))]
    if trainers is not None:
        desired, low, high = trainers
        flags += ["--trainers", str(desired), "--min-trainers", str(low), "--max-trainers", str(high)]
    if inputs:
        flags += [arg for pattern in inputs for arg in ("--input", pattern)]
        if epochs is not None:
            flags += ["--epochs", str(epochs)]
        if data_format is not None:
            flags += ["--format", data_format]
        if chunk_bytes:
            flags += ["--chunk-bytes", str(chunk_bytes)]
        if shuffle_seed is not None:
            flags += ["--shuffle-seed", str(shuffle_seed)]
        if resume_from:
            flags += ["--resume-from", resume_from]
    return [*flags, *extra]
