# Copyright (c) MONAI Consortium
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#     http://www.apache.org/licenses/LICENSE-2.0
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Progress on a terminal: a text bar, and the window counter of one image's inference; and the check a caller may
run between windows (:func:`stop_between_windows`), the seam through which a server stops a job it gave up on."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["text_bar", "WindowProgress", "stop_between_windows", "between_windows"]

_CHECKS = threading.local()  # per thread: a server's model thread runs one job at a time


@contextmanager
def stop_between_windows(check: Callable[[], None]) -> Iterator[None]:
    """Run the block with ``check`` called before each batch of windows this thread gives the network; ``check``
    stops the pass by raising. The inferers know nothing of it: the pipeline's window wrapper calls
    :func:`between_windows` (a job is cancelled between windows, not only between images)."""
    previous = getattr(_CHECKS, "check", None)
    _CHECKS.check = check
    try:
        yield
    finally:
        _CHECKS.check = previous


def between_windows() -> None:
    """Run this thread's check of :func:`stop_between_windows`, if any (called before each window batch)."""
    check = getattr(_CHECKS, "check", None)
    if check is not None:
        check()


def text_bar(done: int, total: int, width: int = 20) -> str:
    """``done`` of ``total`` as a fixed-width text bar, e.g. ``[#####---------------]``."""
    filled = width * min(done, total) // max(total, 1)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


class WindowProgress:
    """Counts windows; tqdm on a terminal when installed, else a one-line text bar on stderr. ``total`` may come
    later, from the pass's plan (:meth:`planned`)."""

    def __init__(self, total: int | None, enabled: bool, desc: str = "windows"):
        self.total, self.n, self.enabled, self.desc = total, 0, enabled, desc
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=desc, unit="win", leave=False, file=sys.stderr)
            except ImportError:
                self.bar = None

    def planned(self, plan: Any) -> None:
        """Take the window count of ``plan`` (a :class:`~monai.inferers.windows.SlidingWindowPlan`) as the total:
        the inferer's ``on_plan``, so that the windows are planned once, by the pass that runs them."""
        self.total = int(plan.total_windows)
        if self.enabled and self.bar is not None:
            self.bar.total = self.total
            self.bar.refresh()

    def update(self, k: int) -> None:
        self.n += k
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(k)
        else:
            total = self.total or self.n
            sys.stderr.write(f"\r{self.desc} {text_bar(self.n, total)} {min(self.n, total)}/{total}")
            sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        else:
            sys.stderr.write("\r" + " " * (len(self.desc) + 48) + "\r")
            sys.stderr.flush()
