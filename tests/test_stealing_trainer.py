"""The trainer's side of work stealing (trainer_agent.stealing): between a split request
and the master's word the reader hands out no record past the position it named; an
unknown word gives the task back rather than finishing it. Real readers on a real file;
the master's SplitTask is the callable `Steals` is given."""

from __future__ import annotations

import threading

import pytest

from paddlecloud.api import pb
from trainer_agent.stealing import Steals

pytestmark = pytest.mark.unit


def a_task(tmp_path, records: list[str]) -> pb.Task:
    path = tmp_path / "data.csv"
    path.write_text("".join(f"{r}\n" for r in records))
    return pb.Task(id=0, epoch=0, attempt=7, format="lines",
                   chunks=[pb.Chunk(path=str(path), begin=0, end=path.stat().st_size)])


def test_the_reader_waits_at_the_position_until_the_master_answers(tmp_path):
    records = [f"r{i:02d}" for i in range(10)]
    task = a_task(tmp_path, records)
    answered, asked_at = threading.Event(), []

    def split(ref: pb.TaskRef, position: int) -> int:
        asked_at.append(position)
        answered.wait(timeout=60)
        return pb.CONTINUE

    steals = Steals(held=lambda: [task], split=split)
    records_out = steals.cursor(task).read("lines")
    read = [next(records_out) for _ in range(3)]
    asker = threading.Thread(target=steals.answer, args=([pb.TaskRef(task_id=0, epoch=0, attempt=7)],))
    asker.start()
    reader_done = threading.Event()
    rest: list[str] = []

    def read_on() -> None:
        rest.extend(records_out)
        reader_done.set()

    threading.Thread(target=read_on, daemon=True).start()
    assert not reader_done.wait(timeout=1.0)  # held at the position: the master has not answered
    assert rest == [] and asked_at == [4 * 3]  # three records of 4 bytes each handed out
    answered.set()
    asker.join(timeout=60)
    assert reader_done.wait(timeout=60)
    assert read + rest == records  # CONTINUE: it read on to the end


def test_a_split_with_no_known_answer_stops_there_and_gives_the_task_back(tmp_path):
    records = [f"r{i:02d}" for i in range(10)]
    task = a_task(tmp_path, records)

    def split(ref: pb.TaskRef, position: int) -> int:
        raise RuntimeError("the master did not answer")

    steals = Steals(held=lambda: [task], split=split)
    cursor = steals.cursor(task)
    records_out = cursor.read("lines")
    read = [next(records_out) for _ in range(4)]
    steals.answer([pb.TaskRef(task_id=0, epoch=0, attempt=7)])
    assert read + list(records_out) == records[:4]
    assert cursor.give_back


def test_stop_ends_the_task_at_the_position_and_counts_the_split(tmp_path):
    records = [f"r{i:02d}" for i in range(10)]
    task = a_task(tmp_path, records)
    steals = Steals(held=lambda: [task], split=lambda ref, position: pb.STOP)
    cursor = steals.cursor(task)
    records_out = cursor.read("lines")
    read = [next(records_out) for _ in range(6)]
    steals.answer([pb.TaskRef(task_id=0, epoch=0, attempt=7)])
    assert read + list(records_out) == records[:6]
    assert not cursor.give_back and steals.splits == 1
