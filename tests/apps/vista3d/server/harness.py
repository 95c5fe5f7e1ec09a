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
"""The servers the server tests talk to: the VISTA3D server itself (uvicorn on a free loopback port, in a thread
of the test process, so that a test can hold the model with an event) and a plain file host for image URLs."""

from __future__ import annotations

import functools
import http.server
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import torch
import uvicorn

from monai.apps.vista3d import PipelineOptions, SegmentJob
from monai.apps.vista3d.core.pipeline import Vista3DPipeline
from monai.apps.vista3d.server.app import begin_shutdown, create_app
from monai.apps.vista3d.server.protocol import DrainingServer, uvicorn_config
from monai.apps.vista3d.server.settings import Limits, ServerSettings
from tests.apps.vista3d.stub_vista import phantom
from tests.networks.tiny_vista3d import tiny_vista3d_with_recorded_weights

__all__ = ["LiveServer", "ImageHost", "Gate", "ManualClock", "tiny_pipeline", "write_phantom", "PHANTOM_SHAPE",
           "settings"]

PHANTOM_SHAPE = (40, 40, 36)


def tiny_pipeline(network: torch.nn.Module | None = None) -> Vista3DPipeline:
    """The tiny recorded VISTA3D on the CPU with 16^3 windows: what every server test serves."""
    network = network if network is not None else tiny_vista3d_with_recorded_weights()
    return Vista3DPipeline(network=network, device="cpu", roi_size=16)


def write_phantom(path: Path, spacing=(1.0, 1.0, 1.0), shape=PHANTOM_SHAPE) -> Path:
    """The test phantom (liver and spleen boxes; 40 x 40 x 36 unless told) as int16 NIfTI."""
    img, aff, _ = phantom(shape, np.eye(3), spacing)
    nib.save(nib.Nifti1Image(img.astype(np.int16), aff), str(path))
    return path


def settings(**kwargs: Any) -> ServerSettings:
    """Server settings for the tests: loopback, no GPU, small limits where a test does not give its own."""
    limits = kwargs.pop("limits", Limits(request_timeout=120.0))
    model = SegmentJob(options=PipelineOptions(roi_size=16), device="cpu", network=tiny_vista3d_with_recorded_weights())
    return ServerSettings(model=model, limits=limits, **kwargs)


class ManualClock:
    """A clock that stands still until a test moves ``now`` (the session stores' expiry without waiting)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Gate:
    """A forward pre-hook that holds the network until released: the tests' way to keep a job running.

    ``entered`` is set each time a forward starts waiting; ``open()`` lets every waiting and later forward pass.
    """

    def __init__(self, network: torch.nn.Module):
        self.entered = threading.Event()
        self._open = threading.Event()
        self.calls = 0
        self._handle = network.register_forward_pre_hook(self._hook)

    def _hook(self, module: Any, args: Any) -> None:
        self.calls += 1
        self.entered.set()
        if not self._open.wait(timeout=60):
            raise RuntimeError("the test never opened the gate")

    def open(self) -> None:
        self._open.set()

    def remove(self) -> None:
        self._open.set()
        self._handle.remove()


class _Server(DrainingServer):
    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None]):
        super().__init__(config, on_shutdown)
        self.up = threading.Event()

    async def startup(self, sockets: list | None = None) -> None:
        await super().startup(sockets)
        self.up.set()


class LiveServer:
    """A real uvicorn server on ``127.0.0.1:<free port>`` running the app, in a thread; a context manager.

    Args:
        server_settings: what the app runs with.
        factory: builds the pipeline (default: :func:`tiny_pipeline`).
        kwargs: more :func:`~monai.apps.vista3d.server.app.create_app` arguments (``clock``, ``warm_up``).
    """

    def __init__(self, server_settings: ServerSettings | None = None, factory: Callable[[], Any] | None = None,
                 **kwargs: Any):
        self.app = create_app(server_settings or settings(), factory or tiny_pipeline, **kwargs)
        self.state = self.app.state.vista3d
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        limits = self.state.settings.limits
        self._server = _Server(uvicorn_config(self.app, limits, log_level="warning", lifespan="on"),
                               lambda: begin_shutdown(self.app))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def worker(self) -> Any:
        return self.state.worker

    def __enter__(self) -> LiveServer:
        self._thread.start()
        if not self._server.up.wait(timeout=60):
            raise RuntimeError("the server did not start")
        return self

    def wait_ready(self, timeout: float = 120) -> None:
        if not self.worker.wait_for(lambda w: w.state != "loading", timeout) or self.worker.state != "ready":
            raise RuntimeError(f"the model did not load: {self.worker.error}")

    def __exit__(self, *exc: Any) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=60)
        self._sock.close()


def phantom_folder_for_class(test_class: Any, shape=(24, 24, 24)) -> Path:
    """A temporary folder holding ``ct.nii.gz`` (a phantom of ``shape``) for ``test_class``'s tests; removed after
    them."""
    tmp = tempfile.TemporaryDirectory()
    test_class.addClassCleanup(tmp.cleanup)
    folder = Path(tmp.name)
    write_phantom(folder / "ct.nii.gz", shape=shape)
    return folder


def start_for_class(test_class: type, server_settings: ServerSettings, **kwargs: Any) -> LiveServer:
    """A :class:`LiveServer` shared by ``test_class``'s tests, ready to serve; it stops after them (also when the
    rest of ``setUpClass`` fails)."""
    server = LiveServer(server_settings, **kwargs).__enter__()
    test_class.addClassCleanup(server.__exit__, None, None, None)
    server.wait_ready()
    return server


class _Files(http.server.SimpleHTTPRequestHandler):
    """Serves a folder, plus ``/to/<path>`` (a redirect to ``/<path>`` on the same host), ``/away/<path>`` (a
    redirect to the other loopback name of this host, i.e. another host) and ``/unsized/<path>`` (the file without
    a Content-Length: its end is the connection's)."""

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        for prefix, host in (("/to/", f"127.0.0.1:{self.server.server_port}"),
                             ("/away/", f"localhost:{self.server.server_port}")):
            if self.path.startswith(prefix):
                self.send_response(302)
                self.send_header("Location", f"http://{host}/{self.path[len(prefix):]}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        if self.path.startswith("/unsized/"):
            data = (Path(self.directory) / self.path[len("/unsized/"):]).read_bytes()
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True
            return
        super().do_GET()


class ImageHost:
    """``http.server`` serving a temporary folder on a free loopback port (the image URLs of the tests)."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory()
        self.folder = Path(self._tmp.name)
        handler = functools.partial(_Files, directory=str(self.folder))
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self._httpd.server_port
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def url(self, name: str, via: str = "") -> str:
        return f"http://127.0.0.1:{self.port}/{via}{name}"

    def __enter__(self) -> ImageHost:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._tmp.cleanup()
