"""`python -m paddlecloud.backends.k8s.portwatch`: wait for TCP endpoints, or hold while one listens.

The helper containers beside an image that does not contain paddlecloud use it
(`paddlecloud.backends.k8s.manifests`):

* `--wait HOST:PORT[,HOST:PORT...]`: the init container of a trainer (or heter
  trainer) returns 0 once every pserver accepts a connection: the start order
  paddle-operator's users expect, with no change to their image;
* `--hold HOST:PORT`: the program the pserver agent supervises in a pserver's
  sidecar: it waits for the pserver beside it to listen, then runs as long as it
  does, and exits 1 when it stops (the agent's registration in etcd lives exactly
  as long as this program).

What this does NOT guarantee: that a listening port is a healthy pserver; only
that something accepts TCP connections there. Names that do not resolve yet are
retried like refused connections (a headless Service publishes a pod's name only
once the pod exists).
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import time
from collections.abc import Callable, Sequence

logger = logging.getLogger(__name__)


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """`a:1,b:2` -> [("a", 1), ("b", 2)]; raises ValueError naming the bad endpoint."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"invalid endpoint {item!r}: expected HOST:PORT")
        out.append((host, int(port)))
    return out


def listens(host: str, port: int, *, timeout: float) -> bool:
    """Whether HOST:PORT accepts a TCP connection now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_all(endpoints: Sequence[tuple[str, int]], *, interval: float, deadline: float | None,
             clock: Callable[[], float] = time.monotonic) -> bool:
    """True once every endpoint has listened (each checked until it does); False past `deadline`."""
    waiting = list(endpoints)
    while waiting:
        waiting = [e for e in waiting if not listens(*e, timeout=interval)]
        if not waiting:
            break
        if deadline is not None and clock() > deadline:
            logger.error("still not listening: %s", ", ".join(f"{h}:{p}" for h, p in waiting))
            return False
        logger.info("waiting for %s", ", ".join(f"{h}:{p}" for h, p in waiting))
        time.sleep(interval)
    return True


def hold(endpoint: tuple[str, int], *, interval: float, failures: int) -> int:
    """Waits for `endpoint`, then returns 1 once it failed `failures` checks in a row."""
    wait_all([endpoint], interval=interval, deadline=None)
    logger.info("%s:%d listens; holding", *endpoint)
    missed = 0
    while missed < failures:
        time.sleep(interval)
        missed = 0 if listens(*endpoint, timeout=interval) else missed + 1
    logger.error("%s:%d stopped listening", *endpoint)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paddlecloud.backends.k8s.portwatch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--wait", metavar="HOST:PORT[,...]", help="return 0 once all listen")
    mode.add_argument("--hold", metavar="HOST:PORT", help="run while it listens")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between checks")
    parser.add_argument("--timeout", type=float, default=0.0,
                        help="--wait: give up (exit 1) after this many seconds; 0: never")
    parser.add_argument("--failures", type=int, default=3,
                        help="--hold: checks missed in a row before exiting 1")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s portwatch: %(message)s")
    try:
        endpoints = parse_endpoints(args.wait if args.wait is not None else args.hold)
    except ValueError as error:
        parser.error(str(error))
    if args.hold is not None:
        if len(endpoints) != 1:
            parser.error(f"--hold takes one HOST:PORT, not {args.hold!r}")
        return hold(endpoints[0], interval=args.interval, failures=args.failures)
    deadline = time.monotonic() + args.timeout if args.timeout > 0 else None
    return 0 if wait_all(endpoints, interval=args.interval, deadline=deadline) else 1


if __name__ == "__main__":
    sys.exit(main())
