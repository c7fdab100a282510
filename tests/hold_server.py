"""A gRPC server, in a process of its own, that holds every GetTask: a busy master's queue.

    python tests/hold_server.py [--default-options]

Prints its port, then serves until killed: GetTask is answered WAIT after an hour (its
callers see their own deadline or connection end first); GetStatus at once. It runs
with the master's own server options (`master.server.SERVER_OPTIONS`), or with gRPC's
defaults (`--default-options`), so a test can tell what those options change. A real
process, so that a test can stop it (SIGSTOP) as a lost node would go silent.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc  # noqa: E402

from master.server import SERVER_OPTIONS  # noqa: E402
from paddlecloud.api import pb, pb_grpc  # noqa: E402

HOLD = 3600.0


class Holding(pb_grpc.MasterServicer):
    async def GetTask(self, request, context):
        await asyncio.sleep(HOLD)
        return pb.GetTaskResponse(outcome=pb.WAIT, current_epoch=request.epoch)

    async def GetStatus(self, request, context):
        return pb.GetStatusResponse(job="held")


async def serve(default_options: bool) -> None:
    server = grpc.aio.server(options=[] if default_options else SERVER_OPTIONS)
    pb_grpc.add_MasterServicer_to_server(Holding(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--default-options", action="store_true")
    asyncio.run(serve(parser.parse_args().default_options))
