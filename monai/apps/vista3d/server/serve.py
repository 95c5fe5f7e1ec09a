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
"""Running ``vista3d serve``: uvicorn with the app of :mod:`.app`, until SIGINT/SIGTERM. The command's flags are
the command line's (:mod:`monai.apps.vista3d.cli.serve`), checked there before anything here runs."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from .settings import ServerSettings

__all__ = ["serve", "weights_problem"]


def weights_problem(settings: ServerSettings) -> str | None:
    """What is wrong with the checkpoint of ``settings`` for the network it builds (None: nothing, or no checkpoint
    to read). Its keys and shapes are read memory-mapped (about a second for the published checkpoint), so that a
    file that cannot load is refused before the port opens, not once the server has started."""
    from monai.apps.vista3d.core.checkpoint import network_from_checkpoint
    from monai.apps.vista3d.errors import CheckpointError

    model = settings.model
    if model.weights is None or model.network is not None:
        return None
    try:
        network_from_checkpoint(model.weights, dict(model.network_kwargs))
    except CheckpointError as e:
        return " ".join(str(e).split())
    return None


def serve(settings: ServerSettings, log_level: str = "info") -> int:
    """Serve until SIGINT/SIGTERM; 1 when the model failed to load, 2 without the ``serve`` extra or when the
    checkpoint cannot load (:func:`weights_problem`, before the port opens).

    On a signal the server drains (waiting requests answered 503 at once, the running job given --shutdown-timeout
    seconds, then cancelled and answered 503), removes its scratch folder and raises the signal again, so the
    process ends as the command line's handler says (130, 143); 0 when it stopped otherwise.
    """
    try:
        import uvicorn  # noqa: F401 - the serve extra: refused below with a line when missing

        from .app import begin_shutdown, create_app
        from .protocol import DrainingServer, uvicorn_config
    except ImportError as e:
        print(f"error: vista3d serve needs FastAPI and uvicorn ({e}); pip install 'monai[serve]'", file=sys.stderr)
        return 2
    problem = weights_problem(settings)
    if problem is not None:
        print(f"error: --weights: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    failed: list[BaseException] = []
    server: Any = None

    def stop(e: BaseException) -> None:  # the model did not load: there is nothing to serve
        failed.append(e)
        if server is not None:
            server.should_exit = True

    app = create_app(settings, on_failure=stop)
    config = uvicorn_config(app, settings.limits, host=settings.host, port=settings.port, log_level=log_level,
                            workers=1)
    server = DrainingServer(config, lambda: begin_shutdown(app))
    print(f"vista3d serve: http://{settings.host}:{settings.port}/v1/health/ready turns ready once the model has "
          "loaded", file=sys.stderr, flush=True)
    try:
        server.run()
    finally:
        if app.state.vista3d.worker.alive:  # a forward that never ends: torch would abort the exit; end it here
            print("error: the model's thread did not stop (a window still running); exiting without it",
                  file=sys.stderr, flush=True)
            os._exit(1)
    if failed:
        print(f"error: the model failed to load: {' '.join(str(failed[0]).split())}", file=sys.stderr)
        return 1
    return 0
