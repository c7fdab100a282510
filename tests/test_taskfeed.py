"""The task feed's program end (paddlecloud.taskfeed) against a scripted feed on a Unix socket."""

from __future__ import annotations

import socket
import threading

import pytest

from paddlecloud.taskfeed import FEED_ENV, FeedError, TaskFeed


def _serve(path: str, answers: list[str], asked: list[str]) -> threading.Thread:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def run() -> None:
        connection, _ = listener.accept()
        with connection, connection.makefile("rwb") as stream:
            for answer in answers:
                line = stream.readline()
                if not line:
                    return
                asked.append(line.decode().strip())
                stream.write(answer.encode() + b"\n")
                stream.flush()
        listener.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_epochs_yield_each_epochs_tasks_in_order_and_empty_epochs_too(tmp_path):
    path = str(tmp_path / "feed.sock")
    asked: list[str] = []
    _serve(path, ["TASK 0 3 /a b", "TASK 0 1 /c", "EPOCH_END 0", "EPOCH_END 1", "TASK 2 0 /d",
                  "EPOCH_END 2", "JOB_DONE"], asked)
    with TaskFeed(path, timeout=10) as feed:
        seen = [(epoch.number, [(t.task_id, t.path) for t in epoch]) for epoch in feed.epochs()]
    assert seen == [(0, [(3, "/a b"), (1, "/c")]), (1, []), (2, [(0, "/d")])]
    assert asked == ["NEXT"] * 7  # one NEXT per item: asking past a task acknowledges it


def test_leaving_an_epoch_early_asks_for_nothing_more(tmp_path):
    path = str(tmp_path / "feed.sock")
    asked: list[str] = []
    _serve(path, ["TASK 0 0 /a", "TASK 0 1 /b", "EPOCH_END 0", "JOB_DONE"], asked)
    with TaskFeed(path, timeout=10) as feed:
        for epoch in feed.epochs():
            for _ in epoch:
                break  # the rest is the launcher's to give back
    assert asked == ["NEXT"]  # the task taken was never acknowledged


def test_an_error_from_the_feed_is_raised_with_its_words(tmp_path):
    path = str(tmp_path / "feed.sock")
    _serve(path, ["ERROR AllTasksFailed: every task of epoch 0 failed"], [])
    with TaskFeed(path, timeout=10) as feed, pytest.raises(FeedError, match="AllTasksFailed"):
        list(feed.epochs())


def test_from_env_without_a_socket_says_how_to_get_one(monkeypatch):
    monkeypatch.setenv(FEED_ENV, "1")
    with pytest.raises(FeedError, match="PADDLECLOUD_TASK_FEED=1"):
        TaskFeed.from_env()
