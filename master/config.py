"""Settings of the master, as frozen dataclasses, with the validation that names bad values.

`DatasetSpec` mirrors the wire message of the same name, with 0 meaning "the
default" (DESIGN.md section 4); `filled()` replaces the zeros so two specs can be
compared for equality after defaults are filled, as `SetDataset` must.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace

from master.dataset_allowlist import AllowList, NotAllowed
from paddlecloud.datasets import (  # the one error of a bad spec or setting
    FORMATS,
    LINE_FORMATS,
    SpecError,
)
from paddlecloud.elastic import TrainerRange
from paddlecloud.etcd import MIN_LEASE_TTL, EtcdCredentials
from paddlecloud.untrusted import quote

DEFAULT_CHUNK_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class DatasetSpec:
    paths: tuple[str, ...]
    format: str = ""
    chunk_bytes: int = 0
    chunks_per_task: int = 0
    num_epochs: int = 0
    shuffle_seed: int = 0

    def filled(self) -> DatasetSpec:
        """Validates, then returns the spec with every 0/empty replaced by its default."""
        if not self.paths or any(not p.strip() for p in self.paths):
            raise SpecError(f"dataset paths {quote(repr(list(self.paths)))}: give at least one non-empty "
                            "path or glob")
        for name in ("chunk_bytes", "chunks_per_task", "num_epochs"):
            value = getattr(self, name)
            if value < 0:
                raise SpecError(f"{name} {value} is negative: use 0 for the default or a positive number")
        fmt = self.format or "lines"
        if fmt not in FORMATS:
            raise SpecError(f"unknown format {quote(self.format)}: known formats are {', '.join(FORMATS)}")
        return replace(
            self,
            paths=tuple(self.paths),
            format=fmt,
            chunk_bytes=self.chunk_bytes or DEFAULT_CHUNK_BYTES,
            chunks_per_task=self.chunks_per_task or 1,
            num_epochs=self.num_epochs or 1,
        )

    @property
    def splits_files(self) -> bool:
        return self.format in LINE_FORMATS or not self.format

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> DatasetSpec:
        raw = json.loads(text)
        raw["paths"] = tuple(raw["paths"])
        return cls(**raw)


@dataclass(frozen=True)
class Policy:
    """How the master treats sessions and tasks (DESIGN.md section 8 defaults)."""

    session_ttl: float = 30.0  # 3x the election's: sessions outlive a failover
    task_timeout: float = 30 * 60.0  # 0 = off
    max_task_failures: int = 3
    max_tasks_per_trainer: int = 2
    work_stealing: bool = True  # split a straggler's task for an idle trainer (master.stealing)

    def __post_init__(self) -> None:
        if self.session_ttl < MIN_LEASE_TTL:
            raise SpecError(f"--session-ttl {self.session_ttl:g}s is too short: etcd leases need at least "
                            f"{MIN_LEASE_TTL:g}s")
        if self.task_timeout < 0:
            raise SpecError(f"--task-timeout {self.task_timeout:g}s is negative: use 0 to turn it off")
        if self.max_task_failures < 0:
            raise SpecError(f"--max-task-failures {self.max_task_failures} is negative")
        if self.max_tasks_per_trainer < 1:
            raise SpecError(f"--max-tasks-per-trainer {self.max_tasks_per_trainer} must be at least 1")


@dataclass(frozen=True)
class MasterConfig:
    job: str
    namespace: str
    etcd_endpoints: str
    port: int = 8080
    host: str = "0.0.0.0"
    advertise: str = ""
    election_ttl: float = 10.0
    failover_hold: float = 2.0  # how long a master not serving holds a trainer's call (0: not at all)
    policy: Policy = field(default_factory=Policy)
    dataset: DatasetSpec | None = None
    start_epoch: int = 0
    metrics_port: int | None = None
    etcd_timeout: float = 10.0
    job_spec: str | None = None   # with it, the leader deploys the job on Kubernetes
    deployer: str = "none"        # who owns the job's end: kubernetes, local (`local train`), none
    trainer_size: tuple[TrainerRange, int] | None = None  # the range and desired size at start
    max_calls_in_flight: int = 1024  # trainer calls worked on at once; more are shed (RESOURCE_EXHAUSTED)
    task_streams: bool = True  # serve GetTaskStream; off: UNIMPLEMENTED, trainers call GetTask unary
    register_rate: float = 100.0  # RegisterTrainer calls per second per token (master.rate_limit)
    register_burst: int = 20_000  # ... at once: a whole job's start
    set_dataset_prefixes: tuple[str, ...] = ()  # SetDataset accepts paths under these; empty: off
    tls: TlsFiles | None = None       # None: plaintext
    tokens_dir: str | None = None     # the job's role tokens (paddlecloud.auth.JobTokens); None: open
    scaler_token_file: str | None = None  # the autoscaler's token (paddlecloud.auth.ScalerToken); None: none
    insecure: bool = False            # plaintext without tokens off loopback, explicitly asked for
    etcd_credentials: EtcdCredentials = field(default_factory=EtcdCredentials)

    def __post_init__(self) -> None:
        if not self.job:
            raise SpecError("--job is empty: every master serves one named job")
        if "/" in self.job or "/" in self.namespace:
            raise SpecError(f"job {self.job!r} / namespace {self.namespace!r} must not contain '/'")
        if self.election_ttl < 2:
            raise SpecError(f"--election-ttl {self.election_ttl:g}s is too short: use at least 2s")
        if self.failover_hold < 0:
            raise SpecError(f"--failover-hold {self.failover_hold:g}s is negative: use 0 to answer at once")
        if self.max_calls_in_flight < 1:
            raise SpecError(f"--max-calls-in-flight {self.max_calls_in_flight} must be at least 1")
        if self.deployer not in DEPLOYERS:
            raise SpecError(f"--deployer {self.deployer!r}: use one of {', '.join(DEPLOYERS)}")
        if self.register_rate <= 0 or self.register_burst < 1:
            raise SpecError(f"--register-rate {self.register_rate:g} and --register-burst "
                            f"{self.register_burst} must be positive")
        if self.start_epoch < 0:
            raise SpecError(f"--start-epoch {self.start_epoch} is negative")
        if self.scaler_token_file and not self.tokens_dir:
            raise SpecError(f"--scaler-token-file {self.scaler_token_file} needs --tokens-dir: a master "
                            "without tokens lets every caller scale already")
        if any(not p for p in self.set_dataset_prefixes):
            raise SpecError("--allow-set-dataset '' would allow every path: name a scheme or directory")
        try:
            AllowList(self.set_dataset_prefixes)
        except NotAllowed as error:
            raise SpecError(f"--allow-set-dataset: {error}") from None

    @property
    def open_access(self) -> bool:
        """No tokens: every caller acts as the operator."""
        return self.tokens_dir is None

    def check_access(self) -> None:
        """The command line's rule: no tokens off loopback only with --insecure."""
        if not (self.tokens_dir or self.insecure or self.host in LOOPBACK_HOSTS):
            raise SpecError(f"--host {self.host} without --tokens-dir: anyone who reaches the port could "
                            "do anything; give the job's tokens, or pass --insecure to run open anyway")


DEPLOYERS = ("none", "kubernetes", "local")  # who owns a job's end (`master.epochs`)
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


@dataclass(frozen=True)
class TlsFiles:
    """The master's certificate and key (PEM), and for mTLS the CA its clients' certificates need."""

    cert: str
    key: str
    client_ca: str | None = None
