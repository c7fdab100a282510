"""What `paddlecloud local train` shows: children's log lines, prefixed, and a live progress panel.

On a terminal the panel (epoch, tasks done/total, trainers alive, re-queues, and
the status page's URL) stays at the bottom and log lines scroll above it; elsewhere (CI, a pipe) a plain
progress line is printed whenever the numbers change, at most every two seconds.
"""

from __future__ import annotations

import time

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from paddlecloud.backends.local.job import Progress
from paddlecloud.epoch_text import epoch_of

STYLES = {"master": "magenta", "pserver": "yellow", "trainer": "cyan", "local": "bold green"}


class ConsoleView:
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self.live: Live | None = None
        self._last_plain = ""
        self._last_plain_at = 0.0
        self._latest_plain = ""  # the last progress line, printed or held back by the two seconds

    def __enter__(self) -> ConsoleView:
        if self.console.is_terminal:
            self.live = Live(console=self.console, auto_refresh=False, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def line(self, who: str, text: str) -> None:
        role = who.split()[0]
        prefix = Text(f"[{who}] ", style=STYLES.get(role, "white"))
        self.console.print(prefix + Text(text), soft_wrap=True, highlight=False)

    def progress(self, p: Progress) -> None:
        if self.live is not None:
            self.live.update(self.render(p), refresh=True)
            return
        self._latest_plain = plain = self.plain(p)
        now = time.monotonic()
        if plain != self._last_plain and now - self._last_plain_at >= 2:
            self._print_plain(plain, now)

    def finish(self) -> None:
        """Prints the last progress line if the two seconds held it back: without a terminal
        the output ends with how the job ended, not with the line before."""
        if self.live is None and self._latest_plain != self._last_plain:
            self._print_plain(self._latest_plain, time.monotonic())

    def _print_plain(self, plain: str, now: float) -> None:
        self.console.print(Text(plain, style="bold"), highlight=False, soft_wrap=True)
        self._last_plain, self._last_plain_at = plain, now

    @staticmethod
    def plain(p: Progress) -> str:
        return (f"[progress] {p.phase}, {epoch_of(p.epoch, p.num_epochs)}, tasks {p.done}/{p.num_tasks},"
                f" trainers alive {p.trainers_alive}{ConsoleView.size(p)}, re-queued {p.requeued},"
                f" restarts {p.restarts}")

    @staticmethod
    def size(p: Progress) -> str:
        """` (desired D, range MIN..MAX)` once the master told the trainer range."""
        if not p.desired_trainers:
            return ""
        return f" (desired {p.desired_trainers}, range {p.min_trainers}..{p.max_trainers})"

    @staticmethod
    def render(p: Progress) -> Group:
        table = Table.grid(padding=(0, 2))
        table.add_row(Text(p.phase, style="bold"), epoch_of(p.epoch, p.num_epochs),
                      f"tasks {p.done}/{p.num_tasks}", f"trainers alive {p.trainers_alive}{ConsoleView.size(p)}",
                      f"re-queued {p.requeued}", f"restarts {p.restarts}")
        bar = ProgressBar(total=max(p.num_tasks, 1), completed=p.done, width=60)
        if p.page:
            return Group(table, Text(f"status page: {p.page}", style="dim"), bar)
        return Group(table, bar)
