"""The Kubernetes Pod Security Standards' *restricted* profile, as checks over a pod spec.

Written from the profile's list (kubernetes.io/docs/concepts/security/pod-security-standards):
the baseline controls (host namespaces, privileged, capabilities, hostPath, host ports,
AppArmor, SELinux, /proc mount, seccomp, sysctls) and the restricted ones (volume
types, privilege escalation, running as non-root, non-root user, seccomp, capabilities).
Stricter than the admission controller in one way: a field the profile only *allows*
to be unset (runAsNonRoot on every container when the pod sets it, seccomp, dropped
capabilities) must be set explicitly somewhere, so a missing field fails.

What this does NOT check: the image's own user (an image running as root passes here
when the pod asks for a non-root user: the kubelet then refuses to start it).
"""

from __future__ import annotations

from typing import Any

RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {None, "", "container_t", "container_init_t", "container_kvm_t",
                 "container_engine_t"}


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*(pod.get("initContainers") or []), *(pod.get("ephemeralContainers") or []),
            *pod["containers"]]


def violations(pod: dict[str, Any]) -> list[str]:
    """Every restricted-profile control the pod spec breaks or leaves unset, as `control: where`."""
    out: list[str] = []
    pod_context = pod.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            out.append(f"{field}: pod")
    if (pod_context.get("windowsOptions") or {}).get("hostProcess"):
        out.append("hostProcess: pod")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if "hostPath" in kinds:
            out.append(f"hostPath: volume {volume['name']}")
        elif not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volumeType: volume {volume['name']} ({sorted(kinds)})")
    for sysctl in pod_context.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"sysctls: {sysctl.get('name')}")
    out += _selinux(pod_context, where="pod")
    if _apparmor_unconfined(pod_context):
        out.append("appArmorProfile: pod")
    if pod_context.get("runAsUser") == 0:
        out.append("runAsUser: pod")
    if pod_context.get("runAsGroup") == 0 or pod_context.get("fsGroup") == 0:
        out.append("runAsGroup/fsGroup 0: pod")
    pod_seccomp = (pod_context.get("seccompProfile") or {}).get("type")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        out.append(f"seccompProfile: pod ({pod_seccomp})")
    for c in containers(pod):
        where = f"container {c['name']}"
        context = c.get("securityContext") or {}
        if context.get("privileged"):
            out.append(f"privileged: {where}")
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"hostProcess: {where}")
        if context.get("procMount") not in (None, "Default"):
            out.append(f"procMount: {where}")
        out += _selinux(context, where=where)
        if _apparmor_unconfined(context):
            out.append(f"appArmorProfile: {where}")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                out.append(f"hostPort: {where} ({port['hostPort']})")
        if context.get("allowPrivilegeEscalation") is not False:
            out.append(f"allowPrivilegeEscalation: {where} (must be false)")
        non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"runAsNonRoot: {where} (must be true)")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            out.append(f"runAsUser: {where} (0)")
        seccomp = (context.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"seccompProfile: {where} ({seccomp})")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            out.append(f"capabilities.drop ALL: {where}")
        added = set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            out.append(f"capabilities.add: {where} ({sorted(added)})")
    return out


def _selinux(context: dict[str, Any], *, where: str) -> list[str]:
    options = context.get("seLinuxOptions") or {}
    if options.get("type") not in SELINUX_TYPES or options.get("user") or options.get("role"):
        return [f"seLinuxOptions: {where}"]
    return []


def _apparmor_unconfined(context: dict[str, Any]) -> bool:
    return (context.get("appArmorProfile") or {}).get("type") == "Unconfined"
