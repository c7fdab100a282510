"""How a process proves who it is to etcd, and the one rule about where a password may go.

`https://` endpoints use TLS with `EtcdCredentials` (a CA, and a client certificate and key
for client-certificate auth), and a user and password log in. Credentials come from flags or
the environment: `PADDLE_ETCD_CA_FILE`, `PADDLE_ETCD_CERT_FILE`, `PADDLE_ETCD_KEY_FILE`,
`PADDLE_ETCD_USER` and `PADDLE_ETCD_PASSWORD_FILE` (a mounted Secret) or `PADDLE_ETCD_PASSWORD`.

A password travels only over TLS: a user and password with `http://` endpoints are refused
before anything is dialled (`refuse_plaintext_password`, in `paddlecloud.etcd.client.connect`,
so every process that would send them — the master, its lease process, the pserver agent,
`job delete`, the operator — stops with one error naming the endpoint), unless
`PADDLE_ETCD_ALLOW_PLAINTEXT_PASSWORD=1` says the link is trusted (a loopback etcd in a test).
Anyone on the path of a plaintext link (or an endpoint a submitter chose) would read it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from paddlecloud.etcd.endpoints import uses_tls
from paddlecloud.etcd.errors import EtcdAuthError


@dataclass(frozen=True)
class EtcdCredentials:
    """How to prove who we are to etcd; empty: plaintext, no auth."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("an etcd client certificate and its key go together "
                             "(PADDLE_ETCD_CERT_FILE, PADDLE_ETCD_KEY_FILE)")
        if bool(self.user) != (self.password is not None):
            raise ValueError("an etcd user and its password go together "
                             "(PADDLE_ETCD_USER, PADDLE_ETCD_PASSWORD_FILE)")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, password_file: str | None = None,
                 **given: str | None) -> EtcdCredentials:
        """From flags (`given`, non-empty wins) and else the PADDLE_ETCD_* variables."""
        env = os.environ if env is None else env
        names = {"ca_file": "PADDLE_ETCD_CA_FILE", "cert_file": "PADDLE_ETCD_CERT_FILE",
                 "key_file": "PADDLE_ETCD_KEY_FILE", "user": "PADDLE_ETCD_USER"}
        values = {k: given.get(k) or env.get(v) or None for k, v in names.items()}
        password = env.get("PADDLE_ETCD_PASSWORD")
        password_file = password_file or env.get("PADDLE_ETCD_PASSWORD_FILE")
        # read only for a user: a job whose Secret holds none (etcd without auth) mounts an
        # empty directory where the password file would be
        if password_file and values["user"]:
            try:
                password = Path(password_file).read_text().rstrip("\n")
            except OSError as error:
                raise ValueError(f"cannot read the etcd password file {password_file}: {error.strerror}") from None
        return cls(**values, password=password if values["user"] else None)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        def read(path: str | None) -> bytes | None:
            if not path:
                return None
            try:
                return Path(path).read_bytes()
            except OSError as error:
                raise ValueError(f"cannot read {path}: {error.strerror}") from None
        return grpc.ssl_channel_credentials(root_certificates=read(self.ca_file),
                                            private_key=read(self.key_file),
                                            certificate_chain=read(self.cert_file))


PLAINTEXT_PASSWORD_ENV = "PADDLE_ETCD_ALLOW_PLAINTEXT_PASSWORD"  # "1": send a password over http://


def refuse_plaintext_password(endpoints: str, credentials: EtcdCredentials,
                              env: Mapping[str, str] | None = None, *, root: bool = False) -> None:
    """Raises EtcdAuthError when `credentials` hold a password and `endpoints` are plaintext
    (`http://`), unless PADDLE_ETCD_ALLOW_PLAINTEXT_PASSWORD=1 in `env` (the process's).
    `root`: the credentials manage etcd's users (paddlecloud.etcd_users): no opt-in, since a
    job's endpoints may come from its submitter."""
    env = os.environ if env is None else env
    allowed = not root and env.get(PLAINTEXT_PASSWORD_ENV) == "1"
    if not credentials.user or uses_tls(endpoints) or allowed:
        return
    fix = ("use the cluster's https:// etcd endpoints (root's password never goes in plaintext)"
           if root else f"use https:// endpoints (PADDLE_ETCD_CA_FILE), or set "
           f"{PLAINTEXT_PASSWORD_ENV}=1 where that link is trusted (a loopback etcd)")
    raise EtcdAuthError(f"refusing to send the password of etcd user {credentials.user[:64]!r} "
                        f"in plaintext to {endpoints[:200]}: {fix}")
