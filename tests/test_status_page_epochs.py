"""The status page's epochs tell the truth and stay few: a past epoch with failed tasks is
drawn failed, epochs another master ended are said to be unknown, and at 500 epochs the
page shows a handful of bars, so its plots and trainers are on the first screen.

Against a real leading Dispatcher on a real etcd (in this process), its tasks dealt and
finished or failed through the same calls the gRPC servicer makes."""

from __future__ import annotations

import pytest
from browser import chromium_tab, require_browser
from waiting import wait_for

from master import inspection
from master.state import Outcome
from master.tasks import TaskRef
from master.web import StatusPage

PAGE_WAIT_MS = 60_000


async def run_epoch(leader, session: int, *, fail: frozenset[int] = frozenset()) -> None:
    """Deals every task of the current epoch to `session`: those in `fail` fail (for good:
    the job allows no retry), the others finish; returns once the next epoch began."""
    epoch = leader.core.state.epoch
    while leader.core.state.epoch == epoch:
        result = await leader.tasks.get_task(session, epoch, [], max_tasks=1)
        if result.outcome is not Outcome.TASK:
            await wait_for(lambda: leader.core.state.epoch != epoch or not leader.core.state.epoch_ending,
                           timeout=30, message=f"epoch {epoch} did not end")
            continue
        ref = TaskRef(result.task.task, epoch, result.task.attempt)
        if ref.task in fail:
            assert await leader.tasks.task_failed(session, ref, "a bad record")
        else:
            assert await leader.tasks.task_finished(session, ref)


def shape(bars) -> list[tuple]:
    return [(b.epoch, b.epochs, b.stage, b.done, b.failed, b.unknown) for b in bars]


@pytest.mark.parametrize("leader", [{"epochs": 3, "max_task_failures": 0}], indirect=True)
async def test_a_past_epoch_with_a_failed_task_is_drawn_with_it_failed(leader):
    session = (await leader.trainers.register("t0")).session
    tasks = leader.core.state.num_tasks
    await run_epoch(leader, session, fail=frozenset({1}))
    assert shape(inspection.epoch_bars(leader)) == [
        (0, 1, "past", tasks - 1, 1, 0), (1, 1, "current", 0, 0, 0), (2, 1, "future", 0, 0, 0)]
    await run_epoch(leader, session)
    await run_epoch(leader, session, fail=frozenset({0, 2}))
    assert leader.core.state.phase.value == "Succeeded"
    assert shape(inspection.epoch_bars(leader)) == [
        (0, 1, "past", tasks - 1, 1, 0), (1, 1, "past", tasks, 0, 0), (2, 1, "past", tasks - 2, 2, 0)]


@pytest.mark.parametrize("leader", [{"epochs": 4}], indirect=True)
async def test_a_restarted_epoch_is_no_longer_past(leader):
    session = (await leader.trainers.register("t0")).session
    await run_epoch(leader, session)
    await run_epoch(leader, session)
    await leader.epochs.restart(1)
    assert [(b.epoch, b.stage) for b in inspection.epoch_bars(leader)] == [
        (0, "past"), (1, "current"), (2, "future")]
    assert set(leader.epochs.ended) == {0}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("leader", [{"epochs": 500, "start_epoch": 30, "max_task_failures": 0}],
                         indirect=True)
async def test_at_500_epochs_the_page_sums_the_rest_and_keeps_plots_and_trainers_on_screen(leader):
    """Epochs 0..29 ended before this master (it starts at 30: their counts are unknown); it
    runs 30..34 itself, 30 with a failed task; the page at epoch 35 of 0..499."""
    require_browser()
    session = (await leader.trainers.register("t0")).session
    tasks = leader.core.state.num_tasks
    await run_epoch(leader, session, fail=frozenset({1}))
    for _ in range(4):
        await run_epoch(leader, session)
    assert shape(inspection.epoch_bars(leader)) == [
        (0, 32, "past", 2 * tasks - 1, 1, 30), (32, 1, "past", tasks, 0, 0), (33, 1, "past", tasks, 0, 0),
        (34, 1, "past", tasks, 0, 0), (35, 1, "current", 0, 0, 0), (36, 464, "future", 0, 0, 0)]
    status = StatusPage(job="j", namespace="local", advertise="me:1", dispatcher=lambda: leader,
                        leader_hint=lambda: None)
    await status.start(host="127.0.0.1", port=0)
    height = 800  # a laptop's screen
    try:
        async with chromium_tab(width=1280, height=height) as tab:
            await tab.goto(f"http://127.0.0.1:{status.port}/")
            await tab.locator("#trainers tr[data-trainer='t0']").wait_for(timeout=PAGE_WAIT_MS)
            assert await tab.get_by_test_id("epoch").inner_text() == "35"
            assert await tab.locator("#num-epochs").inner_text() == "0..499"
            rows = tab.locator("#epochs .epoch")
            assert await rows.count() == 6
            summary = rows.first
            assert await summary.locator(".label").inner_text() == "epochs 0..31"
            assert "1 failed" in await summary.locator(".numbers").inner_text()
            assert "30 ended under another master" in await summary.inner_text()
            assert await rows.last.locator(".label").inner_text() == "epochs 36..499"
            for part in ("#plot-finished", "#plot-restarts", "#trainers tr[data-trainer='t0']"):
                box = await tab.locator(part).bounding_box()
                assert box is not None and box["y"] + box["height"] <= height, (part, box)
    finally:
        await status.stop()
