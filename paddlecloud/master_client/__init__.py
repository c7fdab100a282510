"""The one client of the master API, asyncio end to end (docs/design.md, the master's API).

`MasterConnection` makes the calls (retries, leader following, credentials, task
streams); `Session` keeps a trainer's session on one; `MasterLocator` finds the master.
The trainer's library wraps them in a synchronous facade (`trainer_agent.client`) whose
calls travel over gRPC's synchronous stack (`threaded_channel`: a trainer's DataLoader
forks, and grpc.aio does not survive a fork); the CLI, the backends, the autoscaler and
the benchmarks use them as they are, on grpc.aio.
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
