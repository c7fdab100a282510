"""The status page's memory: failed tasks' reasons and the sampled series stay bounded and right."""

from __future__ import annotations

import browser
import pytest

from master import metrics
from master.web import Recorder

pytestmark = pytest.mark.unit


def test_failure_reasons_keep_the_last_few_of_the_most_recent_tasks():
    reasons = metrics.FailureReasons(per_task=2, tasks=3, reason_chars=10)
    for attempt in range(5):
        reasons.record(1, epoch=0, attempt=attempt, trainer="t", reason=f"r{attempt}", at=0.0)
    assert [r.reason for r in reasons.of(1)] == ["r3", "r4"]
    for task in (2, 3, 4):
        reasons.record(task, epoch=0, attempt=1, trainer="t", reason="x" * 50, at=0.0)
    assert reasons.tasks_seen() == [2, 3, 4] and reasons.of(1) == []
    assert reasons.of(4)[0].reason == "x" * 10 + "..."
    reasons.record(2, epoch=1, attempt=1, trainer="u", reason="again", at=0.0)
    assert reasons.tasks_seen() == [3, 4, 2]  # the most recent failure last


def test_the_recorder_samples_counter_increases_and_sees_restarted_trainers():
    recorder = Recorder(history=4)
    recorder.sample({"a": 1})
    metrics.FINISHES.inc(3)
    metrics.REQUEUES.labels("a-new-cause").inc(2)
    metrics.RESIZES.labels("up").inc()
    metrics.RESIZES.labels("down").inc(2)
    recorder.sample({"a": 2, "b": 5})
    series = recorder.series()
    assert series.finished_per_s == [0.0, 3.0]
    assert series.resizes == [0.0, 3.0]  # up and down alike
    assert series.requeues["a-new-cause"] == [0.0, 2.0]  # a cause first seen now, padded
    assert series.trainers_alive == [1, 2] and series.trainer_restarts == [0, 1]
    assert recorder.restarts == {"a": 1} and set(recorder.first_seen) == {2, 5}
    for _ in range(10):
        recorder.sample({})
    assert len(recorder.series().finished_per_s) == 4  # an hour at most: bounded
    assert recorder.series().resizes == [0.0] * 4
    assert recorder.first_seen == {} and recorder.restarts == {"a": 1}


def test_ci_fails_rather_than_skips_without_a_browser(monkeypatch, tmp_path):
    monkeypatch.setattr(browser, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no-chromium is missing"):
        browser.require_browser()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        browser.require_browser()


def test_the_local_progress_panel_keeps_the_status_page_url_in_view():
    from rich.console import Console

    from paddlecloud.backends.local.job import Progress
    from paddlecloud.backends.local.view import ConsoleView

    console = Console(width=120, record=True)
    console.print(ConsoleView.render(Progress(phase="Running", num_tasks=4, page="http://127.0.0.1:9/")))
    assert "status page: http://127.0.0.1:9/" in console.export_text()
