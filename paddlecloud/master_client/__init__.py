"""The one client of the master API, asyncio end to end (docs/design.md, the master's API).

`MasterConnection` makes the calls (retries, leader following, credentials, task
streams); `Session` keeps a trainer's session on one; `MasterLocator` finds the master.
The CLI, the backends, the autoscaler and the benchmarks use them; the trainer's library
(`trainer_agent.client`) keeps a synchronous client of its own on gRPC's synchronous API
(a Paddle DataLoader forks its workers, and grpc.aio does not survive a fork: see
docs/architecture.md, "The master client"), sharing `MasterLocator` with this one.
"""

from paddlecloud.master_client.connection import (
    ConnectionClosed,
    MasterConnection,
    MasterUnavailable,
    ask_master,
    retry_delay,
)
from paddlecloud.master_client.discovery import DiscoveryError, MasterLocator
from paddlecloud.master_client.session import Session, TrainerSuperseded

__all__ = ["ConnectionClosed", "DiscoveryError", "MasterConnection", "MasterLocator", "MasterUnavailable",
           "Session", "TrainerSuperseded", "ask_master", "retry_delay"]
