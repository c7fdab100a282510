"""`paddlecloud autoscaler`: the cluster autoscaler's controller (deploy/components/autoscaler/autoscaler.yaml).

Replicas elect one leader with a Lease in `--lease-namespace` (the pod's own namespace in the
cluster: $POD_NAMESPACE); only the leader plans and scales. `--dry-run` prints the plan each round
and changes nothing (it takes no Lease either: it never displaces the replica that acts);
`--once` runs one round and exits (with --dry-run: "what would it do now?").

A master with tokens answers the autoscaler only when it carries the scaler token of the
master's namespace (`paddlecloud.auth`: GetStatus and ScaleTrainers, nothing else), which the
autoscaler derives from its key: `--scaler-key-file` names the file holding it
(deploy/components/autoscaler/autoscaler.yaml mounts the Secret `paddlecloud-scaler-key` there), read once at start;
each call carries the token of its job's namespace as `authorization: Bearer` metadata.
`--print-token NS` prints the token of namespace NS, for its Secret `paddlecloud-scaler`
(which every job's master there mounts), and exits. Without a key no token is sent (masters
without tokens, `--dry-run` against a local cluster). What this does NOT guarantee: that the
masters' Services resolve where it runs (they do in the cluster; from outside pass
`--master-address` with a port-forward); that a rotated key is seen before a restart.
"""

from __future__ import annotations

import logging
import re
import signal
import socket
import sys
import threading
import uuid
from pathlib import Path

import click

from paddlecloud.auth import CredentialError, read_token, scaler_token
from paddlecloud.clitypes import DURATION, log_level_option

logger = logging.getLogger(__name__)

DEFAULT_LEASE = "paddlecloud-autoscaler"
NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a DNS label


@click.command("autoscaler")
@click.option("--kubeconfig", type=click.Path(dir_okay=False),
              help="Kubeconfig file (default: in-cluster, then ~/.kube/config).")
@click.option("--dry-run", is_flag=True,
              help="Print the plan each round; change nothing (no scale, no Event, no Lease).")
@click.option("--once", is_flag=True, help="One round, then exit (no Lease: for --dry-run by hand).")
@click.option("--interval", type=DURATION, default="5s", show_default=True,
              help="Seconds between rounds (a watch event on nodes or pods starts one sooner).")
@click.option("--max-load-desired", type=click.FloatRange(0, 1, min_open=True), default=0.97,
              show_default=True, help="The share of CPU, memory and GPUs the plan may commit.")
@click.option("--master-address", default="{name}-master.{namespace}.svc:8080", show_default=True,
              help="Where a job's master answers GetStatus and ScaleTrainers ({name}, {namespace}).")
@click.option("--scaler-key-file", envvar="PADDLECLOUD_SCALER_KEY_FILE", show_envvar=True, default=None,
              type=click.Path(dir_okay=False),
              help="The key each namespace's scaler token is derived from (the Secret "
                   "paddlecloud-scaler-key).")
@click.option("--print-token", "print_token_of", metavar="NAMESPACE", default=None,
              help="Print the scaler token of NAMESPACE (for its Secret paddlecloud-scaler, key "
                   "token) from --scaler-key-file, and exit.")
@click.option("--lease-name", default=DEFAULT_LEASE, show_default=True, help="The Lease of the election.")
@click.option("--lease-namespace", envvar="POD_NAMESPACE", show_envvar=True, default="default",
              show_default=True, help="The Lease's namespace.")
@click.option("--lease-duration", type=click.IntRange(min=1), default=15, show_default=True,
              help="Seconds a leader that stopped renewing keeps the Lease.")
@click.option("--identity", envvar="POD_NAME", show_envvar=True, default=None,
              help="This replica's name in the Lease [default: host name + random].")
@log_level_option
def autoscaler_command(*, kubeconfig: str | None, dry_run: bool, once: bool, interval: float,
                       max_load_desired: float, master_address: str, scaler_key_file: str | None,
                       print_token_of: str | None,
                       lease_name: str, lease_namespace: str, lease_duration: int,
                       identity: str | None, log_level: str) -> None:
    """Move each elastic job's trainers within its min..max so the cluster stays busy."""
    try:
        key = read_token(Path(scaler_key_file)) if scaler_key_file else None
    except CredentialError as error:
        raise click.BadParameter(str(error), param_hint="--scaler-key-file") from None
    if print_token_of is not None:
        if key is None:
            raise click.UsageError("--print-token needs --scaler-key-file")
        if not NAMESPACE_NAME.fullmatch(print_token_of):
            raise click.BadParameter(f"{print_token_of[:64]!r} is not a namespace name",
                                     param_hint="--print-token")
        click.echo(scaler_token(key, print_token_of))
        return
    try:
        from autoscaler.controller import COMPONENT, Controller, Settings
        from autoscaler.lease import LeaseElector
        from paddlecloud.backends.k8s.client import KubernetesApiError, load_api_client
    except ImportError as error:
        raise click.ClickException(
            f"`paddlecloud autoscaler` needs the Kubernetes client: pip install 'paddlecloud[k8s]' ({error})"
        ) from None
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if key is None:
        logger.warning("no --scaler-key-file: a master with tokens refuses our GetStatus and "
                       "ScaleTrainers (its jobs are not planned)")
    try:
        api = load_api_client(kubeconfig)
    except KubernetesApiError as error:
        raise click.ClickException(str(error)) from None
    api.user_agent = COMPONENT  # its requests, told apart in the API server's audit log
    settings = Settings(dry_run=dry_run, interval_s=interval, max_load_desired=max_load_desired,
                        scaler_key=key)
    controller = Controller(api, settings=settings,
                            master_address=lambda name, ns: master_address.format(name=name, namespace=ns))
    if once:
        controller.step()
        return
    identity = identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    # a dry run only watches: it must not take the Lease from the replicas that act
    elector = None if dry_run else LeaseElector(api, name=lease_name, namespace=lease_namespace,
                                                identity=identity, lease_duration_s=lease_duration)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    logger.info("paddlecloud autoscaler %s: lease %s/%s, every %.1f s%s", identity, lease_namespace,
                lease_name, interval, " (dry run)" if dry_run else "")
    controller.start_watches(stop)
    controller.run(stop, elector=elector)
