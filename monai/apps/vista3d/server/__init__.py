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
"""``vista3d serve``: VISTA3D over HTTP, with the NVIDIA VISTA-3D NIM's API and click sessions.

Rooms: :mod:`.settings` (what the server runs with, checked once), :mod:`.app` (the ASGI application, its gates and
error shape), :mod:`.routes` (the endpoints), :mod:`.call` (one request's scratch folder, clock and disconnect
watch, on either protocol), :mod:`.schemas` (request bodies and their prompts), :mod:`.worker`
(one model thread, a bounded queue), :mod:`.jobs` (the library calls it runs), :mod:`.sessions` (click sessions,
TTL and LRU), :mod:`.fetch` (URLs, server paths, uploads and their rules), :mod:`.images` (NIfTI/NRRD checks and
answers), :mod:`.cli` (the subcommand); for 3D Slicer's MONAI Label module, :mod:`.monailabel` (its endpoints),
:mod:`.monailabel_jobs` (its requests as jobs, its answers) and :mod:`.monailabel_store` (uploads, click sessions).
FastAPI and uvicorn (the ``serve`` extra) are imported by :mod:`.app` and when the command runs, not by this package,
so the core install keeps its command line.
"""
