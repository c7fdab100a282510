"""Who may talk to a job's master: the job's tokens, the roles they map to, client credentials.

A job has three random bearer tokens, made once at submit (`JobTokens.generate()`;
on Kubernetes the Secret `<job>-tokens`, locally files under the job's state
directory, mode 0600), one per role:

* **trainer** — mounted into every trainer (and pserver) pod: it may register a
  trainer and read the job's status and listings (without session ids);
* **operator** — the master and the submitter: `RestartEpoch`, `SetDataset`,
  session ids and attempts in `ListTasks`/`ListTrainers`, and all a viewer may;
* **viewer** — `GetStatus`, the listings without session ids, the status page.

A fourth role, **scaler**, is not one of a job's tokens (`JOB_ROLES` are; `JobTokens`
never makes or loads a scaler token): it is the cluster autoscaler's, one per namespace.
The autoscaler holds one secret key and derives the token of each namespace from it
(`scaler_token`: `scaler.<namespace>.<HMAC(key, namespace)>`); the admin puts that token
in the namespace's optional Secret `paddlecloud-scaler` (`paddlecloud autoscaler
--print-token NS`). A master reads it from `--scaler-token-file` through `ScalerToken`,
which accepts only a token that names the master's own namespace, and takes it for
`GetStatus` and `ScaleTrainers` only: it can resize a job within its range and read its
status, never register, finish, restart, or see a session id. A namespace's token is no
use against another namespace's masters: whoever can read one namespace's Secrets (its
tenants) holds nothing that moves another tenant's jobs.

**Sessions are bound to a credential.** Every trainer pod mounts the same Secret, so
the trainer token says "a pod of this job", not "trainer 3". A per-session
secret closes that gap: `RegisterTrainer` (authenticated with the trainer token)
answers with `session_token = "s.<session id>.<HMAC(operator token, job, session id)>"`,
and every call that names a session (KeepAlive, GetTask, TaskFinished, TaskFailed,
ReturnTask, LeaveTrainer, RequestSaveModel, SplitTask) must present *that* token, whose
session must be the request's `session_id`. Session ids and attempts are visible in
listings and etcd lease ids are guessable, but without the operator token nobody can
compute another session's HMAC: a forged finish is PERMISSION_DENIED. The token
is derived, not stored, so a standby that takes over verifies the sessions it
inherits from etcd with no extra state, and it dies with its session (a new session,
a new token).

`TokenRoles` is the one place a bearer token becomes a `Principal`; the master's
interceptor and the status page both ask it. `ClientCredentials` is the client side:
TLS from `PADDLE_MASTER_CA_FILE` (mTLS with `PADDLE_MASTER_CERT_FILE` and
`PADDLE_MASTER_KEY_FILE`) and the token from `PADDLE_JOB_TOKEN_FILE`, sent as gRPC
metadata `authorization: Bearer <token>`. Metadata rather than grpc call credentials:
those refuse a plaintext channel, and a local job on loopback uses tokens without TLS.

What this does NOT guarantee: anything against a holder of the trainer token
registering a trainer id it does not own (that supersedes the owner's session: the
Secret is shared by the job's own pods, which are trusted with their ids), nor
against a holder of a namespace's scaler token resizing, within its range, every job of
that namespace, nor secrecy of tokens sent over a plaintext channel off loopback (use TLS).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from paddlecloud.wire import CLIENT_KEEPALIVE

logger = logging.getLogger(__name__)

ENV_TOKEN_FILE = "PADDLE_JOB_TOKEN_FILE"
ENV_CA_FILE = "PADDLE_MASTER_CA_FILE"
ENV_CERT_FILE = "PADDLE_MASTER_CERT_FILE"
ENV_KEY_FILE = "PADDLE_MASTER_KEY_FILE"
SESSION_PREFIX = "s."
_BEARER = "bearer "


class Role(enum.Enum):
    TRAINER = "trainer"
    OPERATOR = "operator"
    VIEWER = "viewer"
    SCALER = "scaler"  # the cluster's autoscaler, not a job's: see JOB_ROLES


# The roles of a job's own tokens: what `JobTokens` generates, writes, loads and maps.
JOB_ROLES: tuple[Role, ...] = (Role.TRAINER, Role.OPERATOR, Role.VIEWER)


class CredentialError(ValueError):
    """A token or certificate file is missing, empty or unreadable; the message names it."""


@dataclass(frozen=True)
class Principal:
    """Who a call comes from: a role, and for a trainer's session token the session it is bound to."""

    role: Role
    session: int | None = None

    @property
    def is_operator(self) -> bool:
        return self.role is Role.OPERATOR


def read_token(path: Path) -> str:
    """The token in a file (surrounding blanks stripped); CredentialError names a missing,
    unreadable or empty file."""
    try:
        token = path.read_text().strip()
    except OSError as error:
        raise CredentialError(f"cannot read token file {path}: {error.strerror}") from None
    if not token:
        raise CredentialError(f"token file {path} is empty")
    return token


@dataclass(frozen=True)
class JobTokens:
    """The job's three role tokens; files `trainer`, `operator`, `viewer` in one directory."""

    trainer: str
    operator: str
    viewer: str

    @classmethod
    def generate(cls) -> JobTokens:
        return cls(*(secrets.token_urlsafe(32) for _ in JOB_ROLES))

    def of(self, role: Role) -> str:
        return getattr(self, role.value)

    def as_mapping(self) -> dict[str, str]:
        """{role name: token}: the data of the Kubernetes Secret, the files of `write()`."""
        return {role.value: self.of(role) for role in JOB_ROLES}

    def write(self, directory: Path) -> Path:
        """Writes one file per role (mode 0600) into `directory` (mode 0700); returns it."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        for name, token in self.as_mapping().items():
            path = directory / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")
            os.chmod(path, 0o600)
        return directory

    @classmethod
    def load(cls, directory: Path) -> JobTokens:
        if not directory.is_dir():
            raise CredentialError(f"tokens directory {directory} does not exist")
        return cls(**{role.value: read_token(directory / role.value) for role in JOB_ROLES})


SCALER_PREFIX = "scaler."


def scaler_token(key: str, namespace: str) -> str:
    """The scaler token the masters of `namespace` accept, derived from the autoscaler's key."""
    mac = hmac.new(key.encode(), f"paddlecloud-scaler|{namespace}".encode(), hashlib.sha256).hexdigest()
    return f"{SCALER_PREFIX}{namespace}.{mac}"


def scaler_token_namespace(token: str) -> str | None:
    """The namespace a scaler token names; None for a token that names none."""
    if not token.startswith(SCALER_PREFIX):
        return None
    namespace, dot, mac = token[len(SCALER_PREFIX):].rpartition(".")
    return namespace if dot and namespace and mac else None


class ScalerToken:
    """The autoscaler's token as a master of `namespace` accepts it: the file at `path`, read
    again whenever it changes (inode, mtime or size: a Secret created or rotated after the
    master started reaches the mounted file through the kubelet, and takes effect without a
    restart), and only when it names `namespace` (`scaler_token`).

    An absent, empty or unreadable file, or a token of another namespace (one copied from
    another namespace's Secret): no scaler token is accepted. The master says so in its log
    once at start and once at each change, never per call. What this does NOT guarantee:
    that a call racing a rotation sees the new token (the next one does).
    """

    def __init__(self, path: Path, *, namespace: str) -> None:
        self.path = path
        self.namespace = namespace
        self._seen: tuple[int, ...] | None = None  # the file's identity and times when last read
        self._token: str | None = None
        self._said = ""
        self.current()

    def current(self) -> str | None:
        """The token now in the file; None when there is none (one stat per call)."""
        try:
            stat = self.path.stat()
        except OSError as error:
            self._seen, self._token = None, None
            absent = isinstance(error, FileNotFoundError)
            self._say(f"no scaler token in {self.path} ({'absent' if absent else error.strerror}): "
                      "the autoscaler is refused", level=logging.INFO if absent else logging.WARNING)
            return None
        seen = (stat.st_ino, stat.st_ctime_ns, stat.st_mtime_ns, stat.st_size)
        if seen != self._seen:
            self._seen = seen
            try:
                self._token = self.path.read_text().strip() or None
                why = "empty"
            except OSError as error:
                self._token, why = None, error.strerror
            if self._token and scaler_token_namespace(self._token) != self.namespace:
                named = scaler_token_namespace(self._token)
                self._token = None
                why = (f"its token is for namespace {named}, not {self.namespace}" if named else
                       f"its token names no namespace: make it with `paddlecloud autoscaler "
                       f"--print-token {self.namespace}`")
            if self._token:
                self._say(f"scaler token read from {self.path}: the autoscaler may call GetStatus "
                          "and ScaleTrainers")
            else:
                self._say(f"no scaler token in {self.path} ({why}): the autoscaler is refused",
                          level=logging.WARNING)
        return self._token

    def _say(self, message: str, *, level: int = logging.INFO) -> None:
        """Logs `message` unless it is what was said last: once per change, never per call."""
        if message != self._said:
            self._said = message
            logger.log(level, "%s", message)


class TokenRoles:
    """Maps a bearer token to a `Principal` (None: not one of this job's tokens, nor the scaler's).

    Comparisons are constant-time. A session token is valid only for the session it
    names, and only for this job (the job name is in its HMAC). `scaler`, when given, is
    the autoscaler's token file (`ScalerToken`).
    """

    def __init__(self, tokens: JobTokens, *, job: str, scaler: ScalerToken | None = None) -> None:
        self._tokens = tokens
        self._job = job
        self._scaler = scaler
        self._key = hashlib.sha256(b"paddlecloud-session-key|" + tokens.operator.encode()).digest()

    def session_token(self, session: int) -> str:
        return f"{SESSION_PREFIX}{session}.{self._mac(session)}"

    def _mac(self, session: int) -> str:
        return hmac.new(self._key, f"{self._job}|{session}".encode(), hashlib.sha256).hexdigest()

    def principal_of(self, token: str | None) -> Principal | None:
        if not token:
            return None
        if token.startswith(SESSION_PREFIX):
            return self._session_principal(token)
        found = None
        for role in JOB_ROLES:  # no early exit: the time taken does not say which role matched
            if hmac.compare_digest(token.encode(), self._tokens.of(role).encode()):
                found = Principal(role)
        scaler = self._scaler.current() if self._scaler is not None else None
        if scaler is not None and hmac.compare_digest(token.encode(), scaler.encode()) and found is None:
            found = Principal(Role.SCALER)
        return found

    def _session_principal(self, token: str) -> Principal | None:
        session_text, _, mac = token[len(SESSION_PREFIX):].partition(".")
        if not (session_text.isascii() and session_text.isdigit()) or len(session_text) > 20:
            return None
        session = int(session_text)
        if session_text != str(session):  # one spelling per session: no leading zeros
            return None
        if not hmac.compare_digest(mac.encode(), self._mac(session).encode()):
            return None
        return Principal(Role.TRAINER, session=session)


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The token of an `authorization: Bearer <token>` entry, if there is one."""
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str) and value.lower().startswith(_BEARER):
            return value[len(_BEARER):].strip()
    return None


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The gRPC metadata that carries `token` (none without one)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def _read_bytes(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise CredentialError(f"cannot read {what} {path}: {error.strerror}") from None


@dataclass(frozen=True)
class ClientCredentials:
    """What a client of a master presents: a token, and TLS when it has the master's CA."""

    token: str | None = None
    ca: bytes | None = None
    cert: bytes | None = None   # mTLS: this client's certificate chain ...
    key: bytes | None = None    # ... and its private key

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientCredentials:
        env = os.environ if env is None else env
        token_file = env.get(ENV_TOKEN_FILE)
        ca, cert, key = (env.get(name) for name in (ENV_CA_FILE, ENV_CERT_FILE, ENV_KEY_FILE))
        if bool(cert) != bool(key):
            raise CredentialError(f"{ENV_CERT_FILE} and {ENV_KEY_FILE} go together")
        return cls(
            token=read_token(Path(token_file)) if token_file else None,
            ca=_read_bytes(ca, ENV_CA_FILE) if ca else None,
            cert=_read_bytes(cert, ENV_CERT_FILE) if cert else None,
            key=_read_bytes(key, ENV_KEY_FILE) if key else None,
        )

    @property
    def tls(self) -> bool:
        return self.ca is not None

    def _channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)

    def channel(self, address: str) -> grpc.Channel:
        """A blocking channel to `address`: TLS with the CA when given, else plaintext."""
        if self.tls:
            return grpc.secure_channel(address, self._channel_credentials(), options=CLIENT_KEEPALIVE)
        return grpc.insecure_channel(address, options=CLIENT_KEEPALIVE)

    def aio_channel(self, address: str) -> grpc.aio.Channel:
        if self.tls:
            return grpc.aio.secure_channel(address, self._channel_credentials(), options=CLIENT_KEEPALIVE)
        return grpc.aio.insecure_channel(address, options=CLIENT_KEEPALIVE)

    def metadata(self, token: str | None = None) -> tuple[tuple[str, str], ...]:
        """The call metadata: `token` (a session token) when given, else the job token."""
        return auth_metadata(token or self.token)


def master_credentials(token: str | None = None, *, ca: bytes | None = None) -> ClientCredentials:
    """How a CLI or controller speaks to a job's master: the job's operator or viewer token in
    PADDLE_JOB_TOKEN_FILE, the master's CA in PADDLE_MASTER_CA_FILE; `token` and `ca` (the
    job's CA published on its master Deployment) are used where the environment names none."""
    import dataclasses

    credentials = ClientCredentials.from_env()
    if credentials.token is None and token:
        credentials = dataclasses.replace(credentials, token=token)
    if credentials.ca is None and ca:
        credentials = dataclasses.replace(credentials, ca=ca)
    return credentials
