"""The launcher's side of the task feed (`paddlecloud.taskfeed`): the master's tasks as files.

`paddlecloud trainer` started with `PADDLECLOUD_TASK_FEED=1` makes a `TaskFeedServer`: it holds
the trainer's session (a `TaskClient`, no prefetch, one task at a time), reads each task's records
into a file of a spool directory, and serves the program one line per item over a Unix socket.

Acknowledgement, the point of it all: a task read to its end is held in the client's ledger while
the program trains on its file (the `Epoch.stop` hook blocks between the read and the next
`GetTask`, which would carry the ack). Only the program's next `NEXT` releases the hook, so the ack
goes out after the program has trained on the task. When the program dies (its socket closes)
while it holds a task, the owed ack is dropped and the session left: the master returns the task
to todo at once, and it is dealt again.

What this does NOT guarantee: that the program's updates of a task reached the pservers when the
task is acknowledged (Paddle's async PS pushes in the background; `fleet.stop_worker()` flushes).
"""

from __future__ import annotations

import logging
import queue
import shutil
import socket
import tempfile
import threading
from pathlib import Path

from trainer_agent.client import Epoch, TaskClient

logger = logging.getLogger(__name__)


class FeedClosed(Exception):
    """The program went away: the feed stops between tasks."""


class TaskFeedServer:
    """Feeds one program the tasks of `client` (see the module docstring); `start()` once."""

    def __init__(self, client: TaskClient) -> None:
        self.client = client
        self.spool = Path(tempfile.mkdtemp(prefix="paddlecloud-feed-"))
        self.path = str(self.spool / "feed.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(1)
        self._items: queue.Queue[str] = queue.Queue()   # lines for the program, in order
        # NEXTs received, and the NEXT that fetched the task handed over last: the task is
        # trained once a later NEXT came
        self._asked = 0
        self._task_asked_at: int | None = None
        self._progress = threading.Condition()
        self._closed = threading.Event()
        self._records: list[str] = []
        self.error: BaseException | None = None
        self._threads = [threading.Thread(target=self._feed, name="task-feed", daemon=True),
                         threading.Thread(target=self._serve, name="task-feed-socket", daemon=True)]

    def start(self) -> TaskFeedServer:
        for thread in self._threads:
            thread.start()
        return self

    # ---- the master's side: the records loop ---------------------------------------------

    def _feed(self) -> None:
        try:
            for epoch in self.client.epochs():
                epoch.stop = lambda epoch=epoch: self._task_read(epoch)
                for record in epoch.records():
                    self._records.append(record if record.endswith("\n") else record + "\n")
                if not epoch.ended:
                    return
                self._items.put(f"EPOCH_END {epoch.number}")
            self._items.put("JOB_DONE")
        except FeedClosed:
            pass
        except BaseException as error:  # the master said the job failed, or is unreachable
            self.error = error
            self._items.put(f"ERROR {type(error).__name__}: {error}".replace("\n", " ")[:500])

    def _task_read(self, epoch: Epoch) -> bool:
        """`Epoch.stop`: a task was read to its end and its ack is owed; hand its file over and
        wait until the program asks past it (then the ack may go: False), or goes (FeedClosed)."""
        task, records, self._records = epoch.current_task, self._records, []
        if task is None or task.id in epoch.consumed:
            return False
        path = self.spool / f"task-{epoch.number}-{task.id}.txt"
        path.write_text("".join(records))
        with self._progress:
            self._task_asked_at = None
        self._items.put(f"TASK {epoch.number} {task.id} {path}")
        with self._progress:
            while not self._trained():
                if self._closed.is_set():
                    self.client.tasks.take_acks()  # not trained: the master must deal it again
                    raise FeedClosed
                self._progress.wait(0.2)
        path.unlink(missing_ok=True)
        return False

    def _trained(self) -> bool:
        return self._task_asked_at is not None and self._asked > self._task_asked_at

    # ---- the program's side: the socket --------------------------------------------------

    def _serve(self) -> None:
        try:
            connection, _ = self._listener.accept()
        except OSError:
            return  # closed before the program connected
        with connection, connection.makefile("rwb") as stream:
            try:
                while not self._closed.is_set():
                    line = stream.readline()
                    if not line:
                        break
                    if line.strip() != b"NEXT":
                        stream.write(b"ERROR unknown request\n")
                        stream.flush()
                        continue
                    with self._progress:  # asking for the next acknowledges the one before
                        self._asked += 1
                        asked = self._asked
                        self._progress.notify_all()
                    item = self._next_item()
                    if item is None:
                        break
                    if item.startswith("TASK "):
                        with self._progress:
                            self._task_asked_at = asked
                    stream.write(item.encode() + b"\n")
                    stream.flush()
            except OSError:
                pass
        self._closed.set()

    def _next_item(self) -> str | None:
        while not self._closed.is_set():
            try:
                return self._items.get(timeout=0.2)
            except queue.Empty:
                continue
        return None

    def close(self) -> None:
        """The program is gone: stops both threads, the unacknowledged task owed no ack; then
        the caller closes the client (which leaves the master: held tasks return at once)."""
        self._closed.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=10)
        if self._threads[0].is_alive():
            self.client.tasks.take_acks()  # a GetTask still under way: whatever it owes, drop
        shutil.rmtree(self.spool, ignore_errors=True)


def feed_env(server: TaskFeedServer, env: dict[str, str]) -> dict[str, str]:
    """The program's environment: the feed's socket in place of the `1` that asked for it."""
    from paddlecloud.taskfeed import FEED_ENV

    return {**env, FEED_ENV: server.path}

