"""Each job's own etcd user: read and write on the job's prefix, nothing else.

A job's master and pserver agents write only under `/paddlecloud/<namespace>/<job>/`
(`paddlecloud.keys`), so that is all their etcd user may touch: whoever creates the
job (`job submit` and the Job Server through `paddlecloud.backends.k8s.jobs.create_job`, the
operator) calls `provision_job_user` with the etcd credentials it holds, which must
carry etcd's `root` role (only root may add users and roles). It makes the user and a
role of one name, `paddlecloud.<namespace>.<job>`, with a READWRITE permission on the
job's key range and a new random password, and hands back the password for the job's
own Secret (`manifests.etcd_user_secret`). `forget_job` (`job delete`, the Job Server's
delete, the operator on `kubectl delete pdj`) clears the job's keys and removes the
user and the role.

A creator that holds no etcd user (its etcd runs without auth) makes none: the job's
pods then connect as nobody, and etcd isolates nothing (docs/kubernetes.md, "etcd").
The creator's credentials are root's: they are sent to `https://` endpoints only (a
job's endpoints may be its submitter's choice).

What this does NOT guarantee: that a job's certificate-only connection is confined
(with `--client-cert-auth` etcd treats a request without a token as the certificate's
CN: issue the shared client certificate for a CN that is no etcd user).
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

import grpc
from aetcd import rpc

from paddlecloud.etcd import (
    EtcdAuthError,
    EtcdCredentials,
    connect,
    refuse_plaintext_password,
)
from paddlecloud.keys import JobKeys, prefix_range_end

logger = logging.getLogger(__name__)

_EXISTS = "already exists"
_NOT_FOUND = "not found"


@dataclass(frozen=True)
class JobEtcdUser:
    """A job's etcd user name and its password (made at the job's creation)."""

    name: str
    password: str = field(repr=False)


def job_user_name(namespace: str, job: str) -> str:
    """The etcd user, and the role, of one job (namespaces and job names hold no dots)."""
    return f"paddlecloud.{namespace}.{job}"


async def create_job_user(client: Any, *, namespace: str, job: str) -> JobEtcdUser:
    """Makes (or renews the password of) the job's user and role on `client`'s etcd."""
    auth = rpc.AuthStub(client.channel)
    name = job_user_name(namespace, job)
    prefix = JobKeys(namespace, job).prefix
    password = secrets.token_urlsafe(32)
    meta = {"metadata": client.metadata, "timeout": 10}
    await _tolerating(_EXISTS, auth.RoleAdd(rpc.AuthRoleAddRequest(name=name), **meta))
    permission = rpc.Permission(permType=rpc.Permission.READWRITE, key=prefix,
                                range_end=prefix_range_end(prefix))
    await auth.RoleGrantPermission(rpc.AuthRoleGrantPermissionRequest(name=name, perm=permission),
                                   **meta)
    if not await _tolerating(_EXISTS, auth.UserAdd(rpc.AuthUserAddRequest(name=name, password=password),
                                                   **meta)):
        await auth.UserChangePassword(rpc.AuthUserChangePasswordRequest(name=name, password=password),
                                      **meta)
    await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user=name, role=name), **meta)
    return JobEtcdUser(name=name, password=password)


async def delete_job_user(client: Any, *, namespace: str, job: str) -> bool:
    """Removes the job's user and role; whether there was a user to remove."""
    auth = rpc.AuthStub(client.channel)
    name = job_user_name(namespace, job)
    meta = {"metadata": client.metadata, "timeout": 10}
    removed = await _tolerating(_NOT_FOUND, auth.UserDelete(rpc.AuthUserDeleteRequest(name=name), **meta))
    await _tolerating(_NOT_FOUND, auth.RoleDelete(rpc.AuthRoleDeleteRequest(role=name), **meta))
    return removed


async def _tolerating(fragment: str, call: Any) -> bool:
    """Runs `call`; False when etcd answers an error containing `fragment` (already there,
    or already gone), True when it succeeds."""
    try:
        await call
    except grpc.aio.AioRpcError as error:
        if fragment in (error.details() or ""):
            return False
        if error.code() == grpc.StatusCode.PERMISSION_DENIED:
            raise EtcdAuthError(f"etcd refused to manage job users: {error.details()} (the "
                                "creator's etcd user needs etcd's root role)") from None
        raise
    return True


def _only_over_tls(endpoints: str, creds: EtcdCredentials) -> None:
    """The creator's etcd credentials are root's: they go to `https://` endpoints only (a
    job's endpoints may come from its submitter: plain text would hand root to whoever
    listens there)."""
    refuse_plaintext_password(endpoints, creds, root=True)


async def provision_job_user(endpoints: str, *, namespace: str, job: str, timeout: float,
                             credentials: EtcdCredentials | None = None) -> JobEtcdUser | None:
    """The job's new etcd user, made with the creator's `credentials` (default: its
    environment's); None when the creator logs in as no etcd user (etcd without auth)."""
    creds = credentials if credentials is not None else EtcdCredentials.from_env()
    if not creds.user:
        return None
    _only_over_tls(endpoints, creds)
    client = await connect(endpoints, timeout=timeout, credentials=creds)
    try:
        return await create_job_user(client, namespace=namespace, job=job)
    finally:
        await client.close()


async def forget_job(endpoints: str, *, namespace: str, job: str, timeout: float,
                     credentials: EtcdCredentials | None = None) -> int:
    """Clears the job's keys and, where the caller logs in as an etcd user, removes the
    job's user and role; returns how many keys went."""
    creds = credentials if credentials is not None else EtcdCredentials.from_env()
    if creds.user:
        _only_over_tls(endpoints, creds)
    client = await connect(endpoints, timeout=timeout, credentials=creds)
    try:
        result = await client.delete_prefix(JobKeys(namespace, job).prefix)
        if creds.user:
            try:
                if await delete_job_user(client, namespace=namespace, job=job):
                    logger.info("removed the etcd user of %s/%s", namespace, job)
            except EtcdAuthError as error:  # the keys are gone; the user stays until root removes it
                logger.warning("could not remove the etcd user of %s/%s: %s", namespace, job, error)
        return int(getattr(result, "deleted", 0) or 0)
    finally:
        await client.close()
