"""Settings of the master, as frozen dataclasses, with the validation that names bad values.

`DatasetSpec` mirrors the wire message of the same name, with 0 meaning "the
default" (docs/design.md section 4); `filled()` replaces the zeros so two specs can be
compared for equality after defaults are filled, as `SetDataset` must.

What each setting is (its flag, type, default, help) is declared once in
`paddlecloud.master_settings`; these types take their defaults from there, hold every
value to the flag's own rules (`check_fields`), and add the rules that relate settings.
`MasterConfig.from_settings` builds the configuration from the parsed command line.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from master.dataset_allowlist import AllowList, NotAllowed
from paddlecloud.datasets import (  # the one error of a bad spec or setting
    FORMATS,
    LINE_FORMATS,
    SpecError,
)
from paddlecloud.elastic import TrainerRange
from paddlecloud.etcd import EtcdCredentials
from paddlecloud.master_settings import by_part, check_fields, default_of
from paddlecloud.untrusted import quote

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES: int = default_of("chunk_bytes")


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
        fmt = self.format or default_of("data_format")
        if fmt not in FORMATS:
            raise SpecError(f"unknown format {quote(self.format)}: known formats are {', '.join(FORMATS)}")
        return replace(
            self,
            paths=tuple(self.paths),
            format=fmt,
            chunk_bytes=self.chunk_bytes or DEFAULT_CHUNK_BYTES,
            chunks_per_task=self.chunks_per_task or default_of("chunks_per_task"),
            num_epochs=self.num_epochs or default_of("epochs"),
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
    """How the master treats sessions and tasks (docs/design.md section 8 defaults)."""

    session_ttl: float = default_of("session_ttl")  # longer than a failover: sessions outlive it
    task_timeout: float = default_of("task_timeout")  # 0 = off
    max_task_failures: int = default_of("max_task_failures")
    max_tasks_per_trainer: int = default_of("max_tasks_per_trainer")
    work_stealing: bool = default_of("work_stealing")  # split a straggler's task for an idle trainer (master.stealing)

    def __post_init__(self) -> None:
        check_fields(self, "policy")


@dataclass(frozen=True)
class MasterConfig:
    job: str
    namespace: str
    etcd_endpoints: str
    port: int = default_of("port")
    host: str = default_of("host")
    advertise: str = default_of("advertise")
    election_ttl: float = default_of("election_ttl")
    failover_hold: float = default_of("failover_hold")  # how long a master not serving holds a call
    policy: Policy = field(default_factory=Policy)
    dataset: DatasetSpec | None = None
    start_epoch: int = default_of("start_epoch")
    metrics_port: int | None = default_of("metrics_port")
    etcd_timeout: float = default_of("etcd_timeout")
    job_spec: str | None = default_of("job_spec")  # with it, the leader deploys the job on Kubernetes
    deployer: str = default_of("deployer")  # who owns the job's end: kubernetes, local (`local train`), none
    trainers: int | None = default_of("trainers")  # the desired size at start; None: not sized here
    min_trainers: int | None = default_of("min_trainers")  # the range; None: `trainers`
    max_trainers: int | None = default_of("max_trainers")
    max_calls_in_flight: int = default_of("max_calls_in_flight")  # more are shed (RESOURCE_EXHAUSTED)
    task_streams: bool = default_of("task_streams")  # off: GetTaskStream UNIMPLEMENTED, GetTask unary
    register_rate: float = default_of("register_rate")  # RegisterTrainer calls/s per token (master.rate_limit)
    register_burst: int = default_of("register_burst")  # ... at once: a whole job's start
    set_dataset_prefixes: tuple[str, ...] = default_of("set_dataset_prefixes")  # SetDataset's; empty: off
    tls: TlsFiles | None = None       # None: plaintext
    tokens_dir: str | None = default_of("tokens_dir")  # the job's role tokens (auth.JobTokens); None: open
    scaler_token_file: str | None = default_of("scaler_token_file")  # the autoscaler's (auth.ScalerToken)
    insecure: bool = default_of("insecure")  # plaintext without tokens off loopback, explicitly asked for
    etcd_credentials: EtcdCredentials = field(default_factory=EtcdCredentials)

    def __post_init__(self) -> None:
        check_fields(self, "")
        if "/" in self.job or "/" in self.namespace:
            raise SpecError(f"job {self.job!r} / namespace {self.namespace!r} must not contain '/'")
        if (self.deployer == "kubernetes") != bool(self.job_spec):
            raise SpecError("--deployer kubernetes and --job-spec go together")
        if self.scaler_token_file and not self.tokens_dir:
            raise SpecError(f"--scaler-token-file {self.scaler_token_file} needs --tokens-dir: a master "
                            "without tokens lets every caller scale already")
        try:
            AllowList(self.set_dataset_prefixes)
        except NotAllowed as error:
            raise SpecError(f"--allow-set-dataset: {error}") from None
        _ = self.trainer_size  # a range that cannot be is refused here, naming it

    @classmethod
    def from_settings(cls, values: Mapping[str, Any]) -> MasterConfig:
        """The configuration of `paddlecloud master`, from every setting's parsed value by name
        (`paddlecloud.master_settings`). Reads what settings point at: the checkpoint of
        --resume-from, the job spec of --deployer kubernetes (its trainer range wins over
        the flags') and the etcd password file."""
        parts = by_part(values)
        own, dataset, tls = parts[""], parts["dataset"], parts["tls"]
        own["start_epoch"] = _resumed_epoch(own["start_epoch"], values["resume_from"])
        if own["deployer"] == "kubernetes" and own["job_spec"]:
            own.update(_trainers_of_spec(own["job_spec"]))
        return cls(
            **own, policy=Policy(**parts["policy"]),
            dataset=DatasetSpec(**dataset).filled() if dataset["paths"] else None,
            tls=TlsFiles(**tls) if any(tls.values()) else None,
            etcd_credentials=EtcdCredentials.from_env(password_file=values["etcd_password_file"],
                                                      **parts["etcd_credentials"]))

    @property
    def trainer_size(self) -> tuple[TrainerRange, int] | None:
        """The trainer range and desired size at start; None when no flag sizes the job."""
        if self.trainers is None and self.min_trainers is None and self.max_trainers is None:
            return None
        return TrainerRange.of(trainers=self.trainers, minimum=self.min_trainers, maximum=self.max_trainers)

    @property
    def open_access(self) -> bool:
        """No tokens: every caller acts as the operator."""
        return self.tokens_dir is None

    def check_access(self) -> None:
        """The command line's rule: no tokens off loopback only with --insecure."""
        if not (self.tokens_dir or self.insecure or self.host in LOOPBACK_HOSTS):
            raise SpecError(f"--host {self.host} without --tokens-dir: anyone who reaches the port could "
                            "do anything; give the job's tokens, or pass --insecure to run open anyway")


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


@dataclass(frozen=True)
class TlsFiles:
    """The master's certificate and key (PEM), and for mTLS the CA its clients' certificates need."""

    cert: str | None
    key: str | None
    client_ca: str | None = None

    def __post_init__(self) -> None:
        if not (self.cert and self.key):
            raise SpecError("--tls-cert and --tls-key go together (and --tls-client-ca needs them)")


def _resumed_epoch(start_epoch: int, checkpoint: str | None) -> int:
    """--start-epoch, or later where the checkpoint in `checkpoint` resumes."""
    if not checkpoint:
        return start_epoch
    from paddlecloud.checkpoints import resume_epoch

    resumed = resume_epoch(checkpoint)
    if not resumed:
        return start_epoch
    start_epoch = max(start_epoch, resumed)
    logger.info("checkpoint in %s: starting at epoch %d", checkpoint, start_epoch)
    return start_epoch


def _trainers_of_spec(path: str) -> dict[str, int | None]:
    from paddlecloud.jobspec import JobSpec

    spec = JobSpec.from_yaml(Path(path).read_text()).validate()
    return {"trainers": spec.trainers, "min_trainers": spec.min_trainers, "max_trainers": spec.max_trainers}
