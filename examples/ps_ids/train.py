"""ps-ids: a parameter-server job whose "model" is the records its pservers were pushed.

    paddlecloud local train --module examples.ps_ids.train --pservers 2 --trainers 2 \\
        --input DATA --epochs 2 [-- --delay 0.01]

One module for both roles (``TRAINING_ROLE``). A pserver listens on ``POD_IP:PADDLE_PORT``
and keeps, as its parameters, every ``(epoch, record)`` pushed to it; asked, it answers
them all. A trainer reads its tasks from the master (``TaskClient``) and pushes each
record, synchronously, to the pserver its hash picks. The real Paddle PS core is not
in the CPU wheel; this is the smallest program with the same shape: state that lives
in the pservers only, and a preemption that must save it together with the master's
count (``trainer_agent.ps``).

On SIGTERM the trainers drain (``PsStop``): trainer 0 saves every pserver's records as one
checkpoint with the tasks the master counts done, in ``$PADDLECLOUD_OUTPUT/checkpoints``.
A pserver started with ``PADDLECLOUD_PSERVER_RESTORE=1`` loads its part of the newest
checkpoint there; a trainer resumes with its ``TrainStatus``. A pserver stopped (the job's
end, or a stop) writes its records to ``$PADDLECLOUD_OUTPUT/model-<index>.json``
(``{"records": [[epoch, record], ...]}``): in an exactly-once run, their union holds each
record of the data once per epoch. With ``$PADDLECLOUD_RECORD_LOG`` a trainer appends each record it
pushed there, as ``epoch<TAB>trainer<TAB>record``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
import time
import zlib
from pathlib import Path

from paddlecloud.checkpoints import checkpoints_dir

MODEL_FILE = "model-{index}.json"  # a pserver's parameters once it stopped
logger = logging.getLogger("ps_ids")


# ---- the pserver --------------------------------------------------------------------------


def restored_records(index: int) -> list[list]:
    """This pserver's part of the newest checkpoint, when told to restore (else none)."""
    from trainer_agent.checkpoint import load_checkpoint

    if os.environ.get("PADDLECLOUD_PSERVER_RESTORE") != "1":
        return []
    found = load_checkpoint(checkpoints_dir(os.environ["PADDLECLOUD_OUTPUT"]))
    if found is None:
        return []  # told to restore, but nothing was saved: start fresh (the contract)
    state, status = found
    records = state["pservers"].get(index, [])
    print(f"pserver {index}: restored {len(records)} records (checkpoint of epoch {status.epoch})",
          flush=True)
    return records


def run_pserver() -> int:
    index = int(os.environ["PADDLE_PSERVER_ID"])
    records = restored_records(index)
    asyncio.run(serve(index, records))
    # stopped (the job's end, or a stop): its parameters as they are, for whoever reads them
    path = Path(os.environ["PADDLECLOUD_OUTPUT"], MODEL_FILE.format(index=index))
    path.write_text(json.dumps({"records": records}))
    return 0


async def serve(index: int, records: list[list]) -> None:
    """Serves PUSH and STATE until SIGTERM or SIGINT; ``records`` holds what was pushed."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                command, _, rest = line.decode().rstrip("\n").partition(" ")
                if command == "PUSH":
                    epoch, _, record = rest.partition(" ")
                    records.append([int(epoch), record])
                    writer.write(b"OK\n")
                elif command == "STATE":
                    writer.write(json.dumps(records).encode() + b"\n")
                else:
                    writer.write(b"ERROR unknown command\n")
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, os.environ.get("POD_IP", "127.0.0.1"),
                                        int(os.environ["PADDLE_PORT"]))
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    print(f"pserver {index}: serving", flush=True)
    async with server:
        await stopped.wait()


# ---- the trainer --------------------------------------------------------------------------


class Pservers:
    """Line connections to every pserver of the job, in ``PADDLE_PSERVERS_IP_PORT_LIST`` order."""

    def __init__(self, endpoints: list[str]) -> None:
        self.files = []
        for endpoint in endpoints:
            host, _, port = endpoint.rpartition(":")
            self.files.append(socket.create_connection((host, int(port)), timeout=30).makefile("rwb"))

    def ask(self, index: int, line: str) -> str:
        f = self.files[index]
        f.write(line.encode() + b"\n")
        f.flush()
        return f.readline().decode().rstrip("\n")

    def push(self, epoch: int, record: str) -> None:
        index = zlib.crc32(record.encode()) % len(self.files)
        if self.ask(index, f"PUSH {epoch} {record}") != "OK":
            raise RuntimeError(f"pserver {index} refused a push")

    def state(self) -> dict[int, list]:
        return {i: json.loads(self.ask(i, "STATE")) for i in range(len(self.files))}


def train(delay: float) -> int:
    from trainer_agent.checkpoint import load_checkpoint, save_checkpoint
    from trainer_agent.client import TaskClient
    from trainer_agent.ps import PsStop

    output = os.environ["PADDLECLOUD_OUTPUT"]
    found = load_checkpoint(checkpoints_dir(output))
    pservers = Pservers(os.environ["PADDLE_PSERVERS_IP_PORT_LIST"].split(","))
    client = TaskClient.from_env(parse=lambda raw: raw.rstrip("\n"))
    stop = PsStop(client, resumed=found[1] if found is not None else None)

    def save_model(status) -> None:
        save_checkpoint(checkpoints_dir(output), {"pservers": pservers.state()}, status)
        print(f"trainer {client.trainer_id}: saved the pservers' model at epoch {status.epoch} "
              f"with {len(status.tasks_done or ())} tasks done", flush=True)

    log = os.environ.get("PADDLECLOUD_RECORD_LOG")
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if log else None
    with client:
        for epoch in stop.epochs():
            for record in epoch.records():
                pservers.push(epoch.number, record)
                if fd is not None:  # one write per line: a log killed mid-way ends with a whole line
                    os.write(fd, f"{epoch.number}\t{client.trainer_id}\t{record}\n".encode())
                if delay:
                    time.sleep(delay)
        if stop.requested:
            print(f"trainer {client.trainer_id}: stopped", flush=True)
            return stop.stop(save=save_model)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.ps_ids.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds a trainer takes per record")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    role = os.environ.get("TRAINING_ROLE", "TRAINER").upper()
    if role == "PSERVER":
        return run_pserver()
    return train(args.delay)


if __name__ == "__main__":
    sys.exit(main())
