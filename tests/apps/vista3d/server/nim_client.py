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
"""A client of the NVIDIA VISTA-3D NIM, written from its documentation only, used unchanged against this server.

From the NIM's "API Reference" (docs.nvidia.com/nim/medical/vista3d): ``GET /v1/health/live``, ``GET
/v1/health/ready``, ``GET /v1/vista3d/info``, ``POST /v1/vista3d/inference`` with the JSON payload ``{"image": URL,
"prompts": {"classes": [...], "points": {"spleen": [[x, y, z], ...]}}, "local_working_dir": ...}``; from its
deployment page (build.nvidia.com/nvidia/vista-3d/deploy): wait until ``/v1/health/ready`` answers
``{"status": "ready"}``, post the payload as JSON, and on status 200 write the body to ``output.zip`` and extract
it. Nothing here knows this server's own additions.
"""

from __future__ import annotations

import io
import zipfile
from typing import Any

import httpx

__all__ = ["NimClient"]


class NimClient:
    """The NIM's endpoints over HTTP.

    Args:
        base_url: ``http://host:port`` (the NIM's default port is 8000).
        timeout: seconds per request.
        headers: extra headers (an ``Authorization`` for a server that wants a token).
    """

    def __init__(self, base_url: str, timeout: float = 120.0, headers: dict[str, str] | None = None):
        self.http = httpx.Client(base_url=base_url, timeout=timeout, headers=headers)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> NimClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def live(self) -> httpx.Response:
        return self.http.get("/v1/health/live", headers={"accept": "application/json"})

    def ready(self) -> httpx.Response:
        return self.http.get("/v1/health/ready", headers={"accept": "application/json"})

    def info(self) -> dict[str, Any]:
        response = self.http.get("/v1/vista3d/info")
        response.raise_for_status()
        return response.json()

    def inference(self, image: str, classes: list | None = None, points: dict | None = None,
                  local_working_dir: str | None = None) -> httpx.Response:
        """POST the documented payload; ``classes`` and ``points`` go under ``prompts`` when given."""
        data: dict[str, Any] = {"image": image}
        prompts: dict[str, Any] = {}
        if classes is not None:
            prompts["classes"] = classes
        if points is not None:
            prompts["points"] = points
        if prompts:
            data["prompts"] = prompts
        if local_working_dir is not None:
            data["local_working_dir"] = local_working_dir
        return self.http.post("/v1/vista3d/inference", json=data)

    @staticmethod
    def unzip(response: httpx.Response) -> dict[str, bytes]:
        """The files of a 200 answer (the deployment page's unzip step): name -> bytes."""
        with zipfile.ZipFile(io.BytesIO(response.content)) as z:
            return {name: z.read(name) for name in z.namelist()}
