"""The pod templates of a PaddleJob, checked against what paddlecloud's own pods get.

paddlecloud's pods run under the restricted Pod Security Standard with no service account
(docs/kubernetes.md, "Pod security"). A PaddleJob's templates are the submitter's own
pods, which the operator creates for anyone who may create PaddleJobs: `check_template`
refuses one asking for more than the *baseline* Pod Security Standard allows (host
namespaces, privileged, hostPath, host ports, Windows hostProcess, added capabilities,
SELinux types and users, AppArmor and seccomp Unconfined, an unmasked procMount, unsafe
sysctls), a gitRepo volume, root, escalation, or a service account's API rights (its name,
its token mounted or projected), naming the field and its value, unless the submitter
allowed it (`job submit --allow-privileged`).

paddlecloud's own Secrets are refused whatever the flag (`own_secret`): the etcd admin's,
etcd's TLS, the autoscaler's, and every job's tokens (`NAME-tokens`) and etcd user
(`NAME-etcd`), by env, envFrom or a volume (plain or projected). A job reaches its own
through what paddlecloud mounts beside the user's program, never through its template.

What this does NOT check: the rest of a PodTemplateSpec — the API server does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from paddlecloud.jobfields import JobSpecError

logger = logging.getLogger(__name__)

TEMPLATE_ROLES = {"ps_template": "ps", "worker_template": "worker", "heter_template": "heter"}
ALLOWED_CAPABILITIES = {"NET_BIND_SERVICE"}  # the one the restricted profile lets a pod add
# The baseline standard's allowed values (kubernetes.io/docs/concepts/security/pod-security-standards)
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
CONTAINER_FIELDS = ("initContainers", "containers", "ephemeralContainers")
# paddlecloud's own Secrets: the cluster's (README, "Security") and each job's (`NAME-tokens`,
# `NAME-etcd`, paddlecloud.backends.k8s.manifests)
OWN_SECRETS = {"paddlecloud-etcd-admin", "paddlecloud-etcd-client-tls", "paddlecloud-etcd-tls",
               "paddlecloud-scaler"}
JOB_SECRET_SUFFIXES = ("-tokens", "-etcd")


def own_secret(name: object) -> bool:
    """A Secret paddlecloud made or reads: never for a user's template."""
    return isinstance(name, str) and (name in OWN_SECRETS or name.endswith(JOB_SECRET_SUFFIXES))


def _items(value: Any) -> list[tuple[int, Mapping[str, Any]]]:
    return [(i, v) for i, v in enumerate(value or []) if isinstance(v, Mapping)]


def unsafe_template_fields(template: Mapping[str, Any], *, where: str) -> list[str]:
    """The fields of a pod template beyond the baseline Pod Security Standard, root, escalation,
    seccomp Unconfined or giving it a service account's API rights, as paths under `where`
    with their values."""
    pod = template.get("spec") or {}
    found = [f"{where}.spec.{k} (true)" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]
    if pod.get("serviceAccountName") or pod.get("serviceAccount"):
        found.append(f"{where}.spec.serviceAccountName ({pod.get('serviceAccountName') or pod.get('serviceAccount')})")
    if pod.get("automountServiceAccountToken"):
        found.append(f"{where}.spec.automountServiceAccountToken (true)")
    for i, volume in _items(pod.get("volumes")):
        for kind in ("hostPath", "gitRepo"):
            if kind in volume:
                found.append(f"{where}.spec.volumes[{i}].{kind}")
        for j, source in _items((volume.get("projected") or {}).get("sources")):
            if "serviceAccountToken" in source:
                found.append(f"{where}.spec.volumes[{i}].projected.sources[{j}].serviceAccountToken")
    found += _annotations(template.get("metadata") or {}, where=f"{where}.metadata.annotations")
    found += _unsafe_context(pod.get("securityContext") or {}, where=f"{where}.spec.securityContext")
    for k, sysctl in _items((pod.get("securityContext") or {}).get("sysctls")):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            found.append(f"{where}.spec.securityContext.sysctls[{k}] ({sysctl.get('name')})")
    for field in CONTAINER_FIELDS:
        for i, container in _items(pod.get(field)):
            found += _unsafe_container(container, where=f"{where}.spec.{field}[{i}]")
    return found


def _annotations(metadata: Mapping[str, Any], *, where: str) -> list[str]:
    annotations = metadata.get("annotations") or {}
    return [f"{where}[{key}] ({value})" for key, value in annotations.items()
            if str(key).startswith(APPARMOR_ANNOTATION)
            and not (value == "runtime/default" or str(value).startswith("localhost/"))]


def _unsafe_container(container: Mapping[str, Any], *, where: str) -> list[str]:
    context = container.get("securityContext") or {}
    at = f"{where}.securityContext"
    found = [f"{at}.{k} (true)" for k in ("privileged", "allowPrivilegeEscalation") if context.get(k)]
    added = set((context.get("capabilities") or {}).get("add") or []) - ALLOWED_CAPABILITIES
    if added:
        found.append(f"{at}.capabilities.add ({', '.join(sorted(map(str, added)))})")
    if context.get("procMount") not in (None, "Default"):
        found.append(f"{at}.procMount ({context.get('procMount')})")
    found += _unsafe_context(context, where=at)
    for j, port in _items(container.get("ports")):
        if port.get("hostPort"):
            found.append(f"{where}.ports[{j}].hostPort ({port.get('hostPort')})")
    return found


def _unsafe_context(context: Mapping[str, Any], *, where: str) -> list[str]:
    found = []
    if context.get("runAsUser") == 0:
        found.append(f"{where}.runAsUser (0)")
    if context.get("runAsNonRoot") is False:
        found.append(f"{where}.runAsNonRoot (false)")
    if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
        found.append(f"{where}.seccompProfile (Unconfined)")
    if (context.get("appArmorProfile") or {}).get("type") == "Unconfined":
        found.append(f"{where}.appArmorProfile (Unconfined)")
    if (context.get("windowsOptions") or {}).get("hostProcess"):
        found.append(f"{where}.windowsOptions.hostProcess (true)")
    selinux = context.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES:
        found.append(f"{where}.seLinuxOptions.type ({selinux.get('type')})")
    found += [f"{where}.seLinuxOptions.{k} ({selinux[k]})" for k in ("user", "role") if selinux.get(k)]
    return found


def own_secret_fields(template: Mapping[str, Any], *, where: str) -> list[str]:
    """Where a pod template names one of paddlecloud's own Secrets (`own_secret`), with the name."""
    pod = template.get("spec") or {}
    found = []
    for i, volume in _items(pod.get("volumes")):
        name = (volume.get("secret") or {}).get("secretName")
        if own_secret(name):
            found.append(f"{where}.spec.volumes[{i}].secret.secretName ({name})")
        for j, source in _items((volume.get("projected") or {}).get("sources")):
            name = (source.get("secret") or {}).get("name")
            if own_secret(name):
                found.append(f"{where}.spec.volumes[{i}].projected.sources[{j}].secret.name ({name})")
    for field in CONTAINER_FIELDS:
        for i, container in _items(pod.get(field)):
            at = f"{where}.spec.{field}[{i}]"
            for j, source in _items(container.get("envFrom")):
                name = (source.get("secretRef") or {}).get("name")
                if own_secret(name):
                    found.append(f"{at}.envFrom[{j}].secretRef.name ({name})")
            for j, variable in _items(container.get("env")):
                name = ((variable.get("valueFrom") or {}).get("secretKeyRef") or {}).get("name")
                if own_secret(name):
                    found.append(f"{at}.env[{j}].valueFrom.secretKeyRef.name ({name})")
    return found


def check_template(template: Mapping[str, Any], *, where: str, allow_privileged: bool) -> None:
    """Refuses a pod template asking for more than the baseline profile (and root, escalation, a
    service account), naming the field and its value, unless the submitter allowed it (`job
    submit --allow-privileged`); one naming paddlecloud's own Secrets, whatever the flag."""
    secrets = own_secret_fields(template, where=where)
    if secrets:
        raise JobSpecError(
            f"{secrets[0]} names a Secret of paddlecloud's own (the etcd admin's, etcd's TLS, the "
            "autoscaler's, or a job's NAME-tokens / NAME-etcd): a template may not reach it, even "
            "with --allow-privileged; rename your Secret if it is yours"
            + (f" (also: {', '.join(secrets[1:4])})" if len(secrets) > 1 else ""))
    found = unsafe_template_fields(template, where=where)
    if found and not allow_privileged:
        raise JobSpecError(
            f"{found[0]} asks for more than paddlecloud allows a job's pods (the baseline Pod Security "
            "Standard, no root, no escalation, no service account): remove it, or submit with --allow-privileged "
            "(allow_privileged: true) if the job needs it"
            + (f" (also: {', '.join(found[1:4])})" if len(found) > 1 else "")
        )
