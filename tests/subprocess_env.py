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
"""The environment of a child process that must import this checkout's ``monai``, and its Ctrl-C."""

from __future__ import annotations

import os
import signal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the checkout first on ``PYTHONPATH``, plus ``extra``.

    The caller's own ``PYTHONPATH`` entries are kept after the checkout: where the dependencies were installed
    with ``pip install --target`` (as on a machine with no registry), replacing the variable would hide them.
    """
    paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), **extra)


def default_sigint() -> None:
    """``preexec_fn`` of a child that a test stops with SIGINT: Ctrl-C as in a terminal. A child inherits an ignored
    SIGINT (the suite run as a background job, as ``nohup ... &`` or some CI runners do), and Python then never
    raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
