"""A stand-in pserver: listens where a pserver would and says what it was told.

A fake process, not a pserver: tests and smoke checks of the pserver agent's own mechanics
(slots, endpoints, restarts, stops), where no model is the point, run this instead of a real
fleet pserver (examples/wide_deep_ps on Paddle 2.6.2 is the real one):

    paddlecloud pserver -- python -m pserver_agent.stub [--crash-after S] [--crash-file F]

It listens on `POD_IP:PADDLE_PORT` (TCP) and answers every line it receives with one
JSON line `{"pid": ..., "env": {...}}` (its PaddlePaddle environment). It appends
one JSON line per event to the file named by `$PADDLECLOUD_STUB_LOG`, if set:
`{"event": "start", "pid", "env"}` once it listens, `{"event": "crash"}` before it
crashes, `{"event": "stop", "signal"}` on SIGTERM/SIGINT. It crashes (exit code 3)
after `--crash-after` seconds, or as soon as the `--crash-file` exists (checked every
50 ms). `--ignore-sigterm` makes it ignore SIGTERM, to exercise the SIGKILL after a
grace period.

What this does NOT do: serve parameters, or read a checkpoint (it only reports
PADDLECLOUD_PSERVER_RESTORE in its environment).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path

CRASH_CODE = 3
_REPORTED = ("TRAINING_ROLE", "POD_IP", "POD_NAME")


def reported_env() -> dict[str, str]:
    """The part of the environment a test cares about: PADDLE_*, PADDLECLOUD_*, POD_*, the role."""
    return {k: v for k, v in os.environ.items()
            if k.startswith(("PADDLE_", "PADDLECLOUD_")) or k in _REPORTED}


def log_event(event: str, **fields: object) -> None:
    path = os.environ.get("PADDLECLOUD_STUB_LOG")
    if not path:
        return
    line = json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def serve(*, crash_after: float | None, crash_file: Path | None, term_code: int) -> int:
    host = os.environ.get("POD_IP", "127.0.0.1")
    port = int(os.environ["PADDLE_PORT"])

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readline():
                writer.write(json.dumps({"pid": os.getpid(), "env": reported_env()}).encode() + b"\n")
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, host.strip("[]"), port)
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[int] = loop.create_future()

    def on_signal(sig: signal.Signals) -> None:
        log_event("stop", signal=sig.name)
        if not ended.done():
            ended.set_result(term_code)

    for sig in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            loop.add_signal_handler(sig, on_signal, sig)
    log_event("start", env=reported_env())

    def crash(why: str) -> None:
        log_event("crash", why=why)
        if not ended.done():
            ended.set_result(CRASH_CODE)

    if crash_after is not None:
        loop.call_later(crash_after, crash, f"--crash-after {crash_after:g}")
    def check_file() -> None:
        if crash_file is None or ended.done():
            return
        if crash_file.exists():
            crash(f"{crash_file} exists")
        else:
            loop.call_later(0.05, check_file)

    check_file()
    try:
        return await ended
    finally:
        server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pserver_agent.stub",
                                     description="A stand-in pserver for tests of the pserver agent.")
    parser.add_argument("--crash-after", type=float, default=None, metavar="SECONDS",
                        help=f"exit with {CRASH_CODE} this long after listening")
    parser.add_argument("--crash-file", type=Path, default=None, metavar="PATH",
                        help=f"exit with {CRASH_CODE} as soon as this file exists")
    parser.add_argument("--ignore-sigterm", action="store_true", help="ignore SIGTERM (SIGKILL ends it)")
    parser.add_argument("--term-exit-code", type=int, default=0,
                        help="exit code on SIGTERM/SIGINT [0]")
    args = parser.parse_args(argv)
    if not os.environ.get("PADDLE_PORT", "").isdigit():
        print(f"error: PADDLE_PORT={os.environ.get('PADDLE_PORT')!r} is not a port", file=sys.stderr)
        return 2
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return asyncio.run(serve(crash_after=args.crash_after, crash_file=args.crash_file,
                             term_code=args.term_exit_code))


if __name__ == "__main__":
    sys.exit(main())
