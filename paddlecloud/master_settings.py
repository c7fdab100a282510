"""The master's settings, declared once: what `paddlecloud master` takes and where each lands.

Each `Setting`, placed under its section (`SECTIONS`: server, etcd, security, dataset,
tasks and sessions, deployment and elasticity), names a flag, its click type (which
parses and bounds one value), its default, help, environment variable, and the field of
the master's configuration (`master.config.MasterConfig`) its value fills. From
this one table come the command's options (`master_options`), its sectioned `--help`
(`MasterCommand`), the argv both backends render (`paddlecloud.master_flags`), the
defaults of the configuration's dataclasses (`default_of`) and the checks they run on
every value, however they were built (`check_fields`).

What this does NOT hold: rules that relate settings (`--tls-cert` with `--tls-key`,
`--scaler-token-file` needs `--tokens-dir`, the trainer range) or need the master's own
code (the SetDataset allow-list); the configuration's dataclasses keep those. The
table is in the core so that the backends read it without importing the master.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click

from paddlecloud.clitypes import DURATION, NON_NEGATIVE, POSITIVE, SIZE
from paddlecloud.datasets import SpecError
from paddlecloud.etcd import MIN_LEASE_TTL, parse_endpoints


class Section(enum.Enum):
    """The groups `paddlecloud master --help` lists the settings under, in this order."""

    SERVER = "Server"
    ETCD = "etcd"
    SECURITY = "Security"
    DATASET = "Dataset"
    POLICY = "Tasks and sessions"
    ELASTICITY = "Deployment and elasticity"


Rule = Callable[[str, Any], None]  # (flag, value): raises SpecError naming both


@dataclass(frozen=True)
class Setting:
    """One setting of the master: its flag, how one value is parsed and checked, where it lands.

    `field` is the dotted path of the value in a MasterConfig (`policy.session_ttl`,
    `dataset.paths`, `tls.cert`, `etcd_credentials.user`, `port`); None for a value read
    at start into another one (`resume_from` moves `start_epoch`, the password file
    becomes `etcd_credentials.password`). `rule` checks what the type cannot say.
    """

    name: str
    flag: str
    field: str | None
    help: str
    type: click.ParamType | None = None
    default: Any = None
    required: bool = False
    envvar: str | None = None
    multiple: bool = False
    metavar: str | None = None
    rule: Rule | None = None

    @property
    def is_switch(self) -> bool:
        return isinstance(self.default, bool)

    @property
    def part(self) -> str:
        """The part of a MasterConfig the value lands in: '' (its own field), 'policy', ..."""
        return (self.field or "").rpartition(".")[0]

    @property
    def attribute(self) -> str:
        return (self.field or "").rpartition(".")[2]

    def option(self) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """The click option of this setting, its parameter named `name`."""
        shown = self.default is not None and self.default != "" and self.default is not False
        extra: dict[str, Any] = {"is_flag": True} if self.is_switch else {"type": self.type}
        return click.option(self.flag, self.name, default=self.default, required=self.required,
                            envvar=self.envvar, show_envvar=self.envvar is not None, help=self.help,
                            multiple=self.multiple, metavar=self.metavar, show_default=shown or None,
                            **extra)

    def argv(self, value: Any) -> list[str]:
        """The command-line words giving `value`; none for None (the master's default)."""
        if value is None:
            return []
        if self.is_switch:
            on, _, off = self.flag.partition("/")
            return [on] if value else [off] if off else []
        values = value if self.multiple else (value,)
        return [word for item in values for word in (self.flag, str(item))]

    def check(self, value: Any) -> None:
        """Raises SpecError naming the flag when `value` is not one the flag would take."""
        if value is None:
            return
        if self.type is not None and not isinstance(self.type, click.Path):  # no I/O here
            for item in value if self.multiple else (value,):
                try:
                    self.type.convert(item, None, None)
                except click.BadParameter as error:
                    raise SpecError(f"{self.flag}: {error.message}") from None
        if self.rule is not None:
            self.rule(self.flag, value)

    def parsed_default(self) -> Any:
        if self.multiple:
            return ()
        if self.default is None or self.type is None or self.is_switch:
            return self.default
        return self.type.convert(self.default, None, None)


def _named(flag: str, value: str) -> None:
    if not value:
        raise SpecError(f"{flag} is empty: every master serves one named job")


def _endpoints(flag: str, value: str) -> None:
    parse_endpoints(value)  # its ValueError names the bad endpoint


def _lease(flag: str, seconds: float) -> None:
    if seconds < MIN_LEASE_TTL:
        raise SpecError(f"{flag} {seconds:g}s is too short: etcd leases need at least {MIN_LEASE_TTL:g}s")


def _prefixes(flag: str, prefixes: Sequence[str]) -> None:
    if any(not p for p in prefixes):
        raise SpecError(f"{flag} '' would allow every path: name a scheme or directory")


_PORT = click.IntRange(0, 65535)
_AT_LEAST_ONE = click.IntRange(min=1)
_EXISTING_FILE = click.Path(exists=True, dir_okay=False)

# The table, by section; within a section in the order of --help.
SECTIONS: Mapping[Section, tuple[Setting, ...]] = {Section.SERVER: (
    Setting("job", "--job", "job", "Job name.", required=True, envvar="PADDLE_JOB_NAME",
            rule=_named),
    Setting("namespace", "--namespace", "namespace", "Kubernetes namespace, or 'local'.",
            default="local", envvar="PADDLE_NAMESPACE"),
    Setting("port", "--port", "port", "The gRPC port trainers and clients call (0: any free port).",
            type=_PORT, default=8080),
    Setting("host", "--host", "host", "Address to listen on.", default="0.0.0.0"),
    Setting("advertise", "--advertise", "advertise",
            "HOST:PORT published as leader [default: POD_IP:PORT with POD_IP from the environment, "
            "else 127.0.0.1:PORT].", default=""),
    Setting("failover_hold", "--failover-hold", "failover_hold",
            "A master that does not serve (a standby, a leader still loading) holds a trainer's "
            "call this long and serves it if it leads meanwhile, so that after a failover "
            "the trainers are served at once, not one retry later; 0 answers at once.",
            type=DURATION, default="2s"),
    Setting("max_calls_in_flight", "--max-calls-in-flight", "max_calls_in_flight",
            "Trainer calls the master works on at once; past it a call is answered "
            "RESOURCE_EXHAUSTED at once and the trainer retries with jittered backoff. "
            "GetTasks on streams are never shed: they wait their turn.",
            type=_AT_LEAST_ONE, default=1024),
    Setting("register_rate", "--register-rate", "register_rate",
            "RegisterTrainer calls per second per token, once a burst is spent; past it a call "
            "is answered RESOURCE_EXHAUSTED with a retry delay (the trainer waits and retries).",
            type=click.FloatRange(min=0, min_open=True), default=100.0),
    Setting("register_burst", "--register-burst", "register_burst",
            "RegisterTrainer calls per token at once: every trainer of the largest job registers in "
            "one burst.", type=_AT_LEAST_ONE, default=20_000),
    Setting("task_streams", "--task-streams/--no-task-streams", "task_streams",
            "Serve GetTaskStream. Off, it answers UNIMPLEMENTED and trainers send each GetTask "
            "as a call of its own: about 0.6 of the dispatch at 64 trainers, but thousands starting "
            "at once are all served sooner (docs/benchmarks.md).", default=True),
    Setting("metrics_port", "--metrics-port", "metrics_port",
            "Serve the status page, its JSON and Prometheus metrics on this port (on --host).",
            type=click.IntRange(1, 65535)),
), Section.ETCD: (
    Setting("etcd_endpoints", "--etcd-endpoints", "etcd_endpoints", "Comma-separated etcd URLs.",
            required=True, envvar="PADDLE_ETCD_ENDPOINTS", rule=_endpoints),
    Setting("etcd_timeout", "--etcd-timeout", "etcd_timeout",
            "Give up at start when etcd does not answer within this.", type=DURATION, default="10s"),
    Setting("election_ttl", "--election-ttl", "election_ttl",
            "The leader's etcd lease: a dead leader's standby takes over within this.",
            type=DURATION, default="10s", rule=_lease),
    Setting("etcd_ca_file", "--etcd-ca-file", "etcd_credentials.ca_file",
            "CA of https:// etcd endpoints.", envvar="PADDLE_ETCD_CA_FILE"),
    Setting("etcd_cert_file", "--etcd-cert-file", "etcd_credentials.cert_file",
            "Client certificate for etcd.", envvar="PADDLE_ETCD_CERT_FILE"),
    Setting("etcd_key_file", "--etcd-key-file", "etcd_credentials.key_file", "Its private key.",
            envvar="PADDLE_ETCD_KEY_FILE"),
    Setting("etcd_user", "--etcd-user", "etcd_credentials.user", "etcd user (auth enabled).",
            envvar="PADDLE_ETCD_USER"),
    Setting("etcd_password_file", "--etcd-password-file", None,
            "File holding the etcd user's password (else the environment's PADDLE_ETCD_PASSWORD).",
            envvar="PADDLE_ETCD_PASSWORD_FILE"),
), Section.SECURITY: (
    Setting("tokens_dir", "--tokens-dir", "tokens_dir",
            "The job's tokens (files trainer, operator, viewer): every RPC must carry one.",
            type=click.Path(file_okay=False)),
    Setting("scaler_token_file", "--scaler-token-file", "scaler_token_file",
            "The cluster autoscaler's token of this --namespace (one naming another is refused): "
            "accepted for GetStatus and ScaleTrainers only; re-read when the file changes; "
            "absent or empty: no autoscaler (needs --tokens-dir).", type=click.Path(dir_okay=False)),
    Setting("tls_cert", "--tls-cert", "tls.cert", "Serve TLS with this certificate (PEM).",
            type=_EXISTING_FILE),
    Setting("tls_key", "--tls-key", "tls.key", "... and its private key.", type=_EXISTING_FILE),
    Setting("tls_client_ca", "--tls-client-ca", "tls.client_ca",
            "mTLS: require client certificates signed by this CA.", type=_EXISTING_FILE),
    Setting("insecure", "--insecure", "insecure",
            "Allow no --tokens-dir off loopback: anyone who reaches the port may do anything.",
            default=False),
    Setting("set_dataset_prefixes", "--allow-set-dataset", "set_dataset_prefixes",
            "Accept SetDataset for paths under PREFIX (a scheme like s3://bucket/ or a directory); "
            "repeatable. Without it SetDataset is off.", multiple=True, metavar="PREFIX",
            rule=_prefixes),
), Section.DATASET: (
    Setting("inputs", "--input", "dataset.paths",
            "Input path, glob or fsspec URL (repeatable). Without it the master waits for SetDataset.",
            multiple=True),
    Setting("data_format", "--format", "dataset.format",
            "Data format: lines (csv, tsv, jsonl, text) or file.", default="lines"),
    Setting("chunk_bytes", "--chunk-bytes", "dataset.chunk_bytes", "Chunk size.",
            type=SIZE, default="64MiB"),
    Setting("chunks_per_task", "--chunks-per-task", "dataset.chunks_per_task",
            "Chunks grouped into one task (what a trainer is handed at once).",
            type=NON_NEGATIVE, default=1),
    Setting("epochs", "--epochs", "dataset.num_epochs", "Passes over the input.",
            type=NON_NEGATIVE, default=1),
    Setting("shuffle_seed", "--shuffle-seed", "dataset.shuffle_seed",
            "Seed of each epoch's task order (the same seed deals the same order).",
            type=click.INT, default=0),
    Setting("start_epoch", "--start-epoch", "start_epoch",
            "Epoch to start at when etcd holds no state for the job (etcd wins when it does).",
            type=NON_NEGATIVE, default=0),
    Setting("resume_from", "--resume-from", None,
            "A checkpoint directory (local or fsspec URL): start at its TrainStatus.next() "
            "when etcd holds no state for the job.", metavar="PATH"),
), Section.POLICY: (
    Setting("session_ttl", "--session-ttl", "policy.session_ttl",
            "Trainer session lease: longer than a failover (--election-ttl plus the rebuild), "
            "so trainers keep their sessions when the leader dies.",
            type=DURATION, default="30s", rule=_lease),
    Setting("task_timeout", "--task-timeout", "policy.task_timeout", "0 turns it off.",
            type=DURATION, default="30m"),
    Setting("max_task_failures", "--max-task-failures", "policy.max_task_failures",
            "Failures of a task in an epoch past which it is failed for the rest of the epoch.",
            type=NON_NEGATIVE, default=3),
    Setting("max_tasks_per_trainer", "--max-tasks-per-trainer", "policy.max_tasks_per_trainer",
            "Tasks a trainer may hold at once (the one it reads and those it prefetched).",
            type=POSITIVE, default=2),
    Setting("work_stealing", "--work-stealing/--no-work-stealing", "policy.work_stealing",
            "At an epoch's end, cut the unread rest off a straggler's task (at the record its "
            "trainer reached, with its agreement) and hand it to an idle trainer; every record "
            "is still read once (docs/design.md section 5a).",
            default=True),
), Section.ELASTICITY: (
    Setting("deployer", "--deployer", "deployer",
            "kubernetes: the leader creates the job's pservers and trainers (needs --job-spec); "
            "local: `paddlecloud local train` runs them. With none, the job's end is final "
            "(RestartEpoch reopen=true is refused).",
            type=click.Choice(["none", "kubernetes", "local"]), default="none"),
    Setting("job_spec", "--job-spec", "job_spec",
            "The job spec YAML that `paddlecloud job submit` mounts (for --deployer kubernetes).",
            type=_EXISTING_FILE),
    Setting("trainers", "--trainers", "trainers",
            "The trainer group's size at start (the job's desired size; etcd wins once written).",
            type=_AT_LEAST_ONE),
    Setting("min_trainers", "--min-trainers", "min_trainers",
            "The fewest trainers the job may be scaled to [default: --trainers].", type=_AT_LEAST_ONE),
    Setting("max_trainers", "--max-trainers", "max_trainers",
            "The most trainers the job may be scaled to [default: --trainers].", type=_AT_LEAST_ONE),
)}
SETTINGS: tuple[Setting, ...] = tuple(s for settings in SECTIONS.values() for s in settings)
SETTING: Mapping[str, Setting] = {s.name: s for s in SETTINGS}
SECTION_OF: Mapping[str, Section] = {s.name: section for section, settings in SECTIONS.items() for s in settings}


def default_of(name: str) -> Any:
    """The default of a setting as the master runs with it (`"10s"` -> 10.0)."""
    return SETTING[name].parsed_default()


def in_part(part: str) -> Iterator[Setting]:
    """The settings whose value lands in `part` of a MasterConfig ('' for its own fields)."""
    return (s for s in SETTINGS if s.field is not None and s.part == part)


def check_fields(target: object, part: str) -> None:
    """Checks every field of `target` that a setting fills, as the flag would: a config built
    in code is held to the command line's rules."""
    for setting in in_part(part):
        setting.check(getattr(target, setting.attribute))


def by_part(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Parsed values by the part of a MasterConfig they land in, keyed by field there."""
    parts: dict[str, dict[str, Any]] = {}
    for setting in SETTINGS:
        if setting.field is not None:
            parts.setdefault(setting.part, {})[setting.attribute] = values[setting.name]
    return parts


def master_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Adds every setting's option to `command`, in the table's order."""
    for setting in reversed(SETTINGS):
        command = setting.option()(command)
    return command


class MasterCommand(click.Command):
    """`paddlecloud master`: its --help lists the options under their sections."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                section = SECTION_OF.get(param.name or "")
                rows.setdefault(section.value if section else "Options", []).append(record)
        for title, records in rows.items():
            with formatter.section(title):
                formatter.write_dl(records)
