"""`paddlecloud operator`: run the PaddleJob controller (Kopf) in a namespace or cluster-wide.

It serves EDL's TrainingJobs too, each converted into the PaddleJob that runs it
(`pdj_operator.trainingjobs`); without their CRD (deploy/crd-trainingjob.yaml) Kopf warns
that the resource is unresolved and the PaddleJobs are served alone.

Deployed by deploy/operator.yaml (two replicas with Kopf peering: the one of the
higher priority acts, the other waits). Each replica picks a random priority
unless --priority is given, so two replicas never tie (a tie pauses both, as
Kopf's peering does: restart one).

What this does NOT guarantee: that the CRD is installed (kubectl apply -f
deploy/crd-paddlejob.yaml) or that the peering object exists (deploy/operator.yaml
creates it); Kopf says so and stops when they are missing.
"""

from __future__ import annotations

import logging
import random
import sys

import click

from paddlecloud.clitypes import DURATION, log_level_option
from paddlecloud.jobspec import DEFAULT_ETCD_ENDPOINTS, DEFAULT_IMAGE

logger = logging.getLogger(__name__)

DEFAULT_PEERING = "paddlecloud-operator"


@click.command("operator")
@click.option("-n", "--namespace", "namespaces", multiple=True,
              help="Watch PaddleJobs in this namespace (repeatable; globs as Kopf takes them).")
@click.option("-A", "--all-namespaces", is_flag=True, help="Watch PaddleJobs in every namespace.")
@click.option("--etcd-endpoints", default=DEFAULT_ETCD_ENDPOINTS, show_default=True,
              help="etcd URLs every job's master, pservers and trainers use.")
@click.option("--image", default=DEFAULT_IMAGE, show_default=True,
              help="The paddlecloud image: masters (never a PaddleJob's own images), and "
              "paddlecloud's containers beside the programs.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False),
              help="Kubeconfig file (default: in-cluster, then ~/.kube/config).")
@click.option("--interval", type=DURATION, default="10s", show_default=True,
              help="How often each PaddleJob's status is refreshed.")
@click.option("--peering", default=DEFAULT_PEERING, show_default=True,
              help="Kopf peering object: of several operators, the highest priority acts.")
@click.option("--priority", type=int, default=None,
              help="Peering priority [default: random, so replicas never tie].")
@click.option("--standalone", is_flag=True, help="No peering: this operator acts alone.")
@click.option("--keep-etcd", is_flag=True,
              help="On `kubectl delete pdj`, keep the job's etcd keys (default: clear them).")
@click.option("--liveness", metavar="URL", default=None,
              help="Kopf's liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
@log_level_option
def operator_command(namespaces: tuple[str, ...], all_namespaces: bool, etcd_endpoints: str,
                     image: str, kubeconfig: str | None, interval: float,
                     peering: str, priority: int | None, standalone: bool, keep_etcd: bool,
                     liveness: str | None, log_level: str) -> None:
    """Run PaddleJobs (kubectl apply -f job.yaml): each gets its master, which deploys the rest.

    EDL's TrainingJobs (paddlepaddle.org/v1) are run as the PaddleJob each converts to.
    """
    if bool(namespaces) == all_namespaces:
        raise click.UsageError("give --namespace NS (repeatable) or --all-namespaces")
    try:
        import kopf

        from pdj_operator.handlers import OperatorConfig, make_registry, make_settings
    except ImportError as error:
        raise click.ClickException(
            f"`paddlecloud operator` needs Kopf: pip install 'paddlecloud[operator]' ({error})"
        ) from None
    try:
        config = OperatorConfig(etcd_endpoints=etcd_endpoints, image=image, kubeconfig=kubeconfig,
                                interval=interval,
                                clear_etcd=not keep_etcd)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if priority is None:
        priority = random.SystemRandom().randint(1, 2**31 - 1)
    logger.info("paddlecloud operator: %s, peering %s, priority %d",
                "all namespaces" if all_namespaces else "namespaces " + ", ".join(namespaces),
                "off" if standalone else peering, priority)
    kopf.run(registry=make_registry(config), settings=make_settings(), clusterwide=all_namespaces,
             namespaces=list(namespaces), standalone=standalone,
             peering_name=None if standalone else peering, priority=priority,
             liveness_endpoint=liveness)
