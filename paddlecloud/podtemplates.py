"""The pod templates of a PaddleJob, checked against what paddlecloud's own pods get.

paddlecloud's pods run under the restricted Pod Security Standard with no service account
(docs/kubernetes.md, "Pod security"). A PaddleJob's templates are the submitter's own
pods: `check_template` refuses one asking for more (host namespaces, privileged, hostPath,
root, escalation, added capabilities, no seccomp, a service account's API rights), naming
the field, unless the submitter allowed it (`job submit --allow-privileged`).

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


def unsafe_template_fields(template: Mapping[str, Any], *, where: str) -> list[str]:
    """The fields of a pod template beyond the restricted Pod Security Standard (host
    namespaces, privileged, hostPath, root, escalation, added capabilities, no seccomp) or
    giving it a service account's API rights, as paths under `where`."""
    pod = template.get("spec") or {}
    found = [f"{where}.spec.{k}" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]
    if pod.get("serviceAccountName") or pod.get("serviceAccount"):
        found.append(f"{where}.spec.serviceAccountName")
    if pod.get("automountServiceAccountToken"):
        found.append(f"{where}.spec.automountServiceAccountToken")
    for i, volume in enumerate(pod.get("volumes") or []):
        if isinstance(volume, Mapping) and "hostPath" in volume:
            found.append(f"{where}.spec.volumes[{i}].hostPath")
    found += _unsafe_context(pod.get("securityContext") or {}, where=f"{where}.spec.securityContext")
    for field in ("initContainers", "containers"):
        for i, container in enumerate(pod.get(field) or []):
            context = (container.get("securityContext") or {}) if isinstance(container, Mapping) else {}
            at = f"{where}.spec.{field}[{i}].securityContext"
            found += [f"{at}.{k}" for k in ("privileged", "allowPrivilegeEscalation") if context.get(k)]
            added = set((context.get("capabilities") or {}).get("add") or []) - ALLOWED_CAPABILITIES
            if added:
                found.append(f"{at}.capabilities.add ({', '.join(sorted(map(str, added)))})")
            found += _unsafe_context(context, where=at)
    return found


def _unsafe_context(context: Mapping[str, Any], *, where: str) -> list[str]:
    found = []
    if context.get("runAsUser") == 0:
        found.append(f"{where}.runAsUser (0)")
    if context.get("runAsNonRoot") is False:
        found.append(f"{where}.runAsNonRoot (false)")
    if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
        found.append(f"{where}.seccompProfile (Unconfined)")
    return found


def check_template(template: Mapping[str, Any], *, where: str, allow_privileged: bool) -> None:
    """Refuses a pod template asking for more than the restricted profile, naming the field,
    unless the submitter allowed it (`job submit --allow-privileged`)."""
    found = unsafe_template_fields(template, where=where)
    if found and not allow_privileged:
        raise JobSpecError(
            f"{found[0]} asks for more than paddlecloud's pods get (the restricted Pod Security "
            "Standard, no service account): remove it, or submit with --allow-privileged "
            "(allow_privileged: true) if the job needs it"
            + (f" (also: {', '.join(found[1:4])})" if len(found) > 1 else "")
        )
