"""A stub trainer: reads its tasks' records and logs each one, training nothing.

`python -m trainer_agent.stub --log records.tsv` (or `paddlecloud local train --module
trainer_agent.stub`) runs the whole data path of a real trainer — sessions, prefetch,
acknowledgements, failover — without a model, for tests, chaos runs and smoke checks
of a cluster. Each record read is appended to the log as `epoch<TAB>trainer<TAB>task<TAB>record`,
one write per line, so a log survives a SIGKILL up to its last whole line. SIGTERM
(a scale-down, a stop) ends it as a graceful exit: held tasks given back, the
master left, exit 143.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time

from trainer_agent.client import TaskClient, TrainerSuperseded

POISON = "POISON"


def parse_record(raw):
    """Records containing POISON fail to parse: their task counts a failure."""
    text = raw if isinstance(raw, str) else raw.decode(errors="replace")
    if POISON in text:
        raise ValueError(f"poisoned record {text[:40]!r}")
    return text


class BrokenTrainer(Exception):
    """This trainer's own fault, not the data's."""


def fail_every_task(epoch) -> None:
    """Takes tasks and fails each one for a reason of its own: the task goes back (ReturnTask,
    no failure counted) and the others finish it. Backs off so it does not hog the queue."""
    while not epoch.ended:
        try:
            for _ in epoch.records():
                raise BrokenTrainer("this trainer is broken")
        except BrokenTrainer:
            time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_agent.stub", description=__doc__)
    parser.add_argument("--log", default=os.environ.get("PADDLECLOUD_RECORD_LOG"),
                        help="append every record read here [$PADDLECLOUD_RECORD_LOG]")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to 'train' on each record")
    parser.add_argument("--slow-ids", default=os.environ.get("PADDLECLOUD_STUB_SLOW_IDS", ""),
                        help="comma-separated trainer ids that train --slowdown times slower: a straggler "
                             "[$PADDLECLOUD_STUB_SLOW_IDS]")
    parser.add_argument("--slowdown", type=float, default=5.0, help="the --slow-ids' factor on --delay")
    parser.add_argument("--broken", action="store_true",
                        help="fail every task it takes for reasons of its own (not the data's): each "
                             "is given back and the trainer goes on")
    parser.add_argument("--broken-ids", default=os.environ.get("PADDLECLOUD_STUB_BROKEN_IDS", ""),
                        help="comma-separated trainer ids that are --broken [$PADDLECLOUD_STUB_BROKEN_IDS]")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if args.log else None
    client = TaskClient.from_env(parse=parse_record)
    broken = args.broken or client.trainer_id in args.broken_ids.split(",")
    delay = args.delay * (args.slowdown if client.trainer_id in args.slow_ids.split(",") else 1)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # `with` leaves
    try:
        with client:
            for epoch in client.epochs():
                if broken:
                    fail_every_task(epoch)
                    continue
                for record in epoch.records():
                    if fd is not None:
                        line = f"{epoch.number}\t{client.trainer_id}\t{epoch.current_task.id}\t{record}\n"
                        os.write(fd, line.encode())
                    if delay:
                        time.sleep(delay)
                logging.info("epoch %d done: %d tasks read; %s", epoch.number, epoch.tasks_read, client.stats)
    except TrainerSuperseded as error:
        print(f"error: {error}", file=sys.stderr)
        return 4
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
