"""The master pod's readiness probe over TLS: `python -m paddlecloud.k8s.master_probe`.

Why: the kubelet's own gRPC probe speaks plaintext only, and a job's master on
Kubernetes serves TLS (the certificate `job submit` issues), so its readiness probe
runs this instead: the standard gRPC health check (`grpc.health.v1`, the empty
service name, SERVING only on the leader) over TLS, trusting the job's CA and
checking the certificate against the master Service's name. Exit status 0 when the
master serves; 1 otherwise, with one line saying why (the kubelet shows it in the
pod's events).

What this does NOT guarantee: anything beyond the health answer (a leader that
answers SERVING may still fail a call); it costs a Python start per probe, hence
the probe's longer period than the kubelet's plaintext gRPC probe would need.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

logger = logging.getLogger(__name__)


def check(address: str, *, ca: bytes, server_name: str, timeout: float) -> str | None:
    """None when the master at `address` answers SERVING over TLS; else why not."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    credentials = grpc.ssl_channel_credentials(root_certificates=ca)
    options = [("grpc.ssl_target_name_override", server_name)]
    with grpc.secure_channel(address, credentials, options=options) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError as error:
            return f"{error.code().name}: {error.details()}"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paddlecloud.k8s.master_probe",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", required=True, help="HOST:PORT of the master")
    parser.add_argument("--ca", required=True, help="the job's CA certificate (PEM file)")
    parser.add_argument("--server-name", required=True,
                        help="the name the master's certificate was issued for")
    parser.add_argument("--timeout", type=float, default=1.5, help="seconds")
    args = parser.parse_args(argv)
    try:
        ca = Path(args.ca).read_bytes()
    except OSError as error:
        print(f"not ready: cannot read the CA {args.ca}: {error.strerror}")
        return 1
    why = check(args.address, ca=ca, server_name=args.server_name, timeout=args.timeout)
    if why is not None:
        print(f"not ready: the master at {args.address} answered {why}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
