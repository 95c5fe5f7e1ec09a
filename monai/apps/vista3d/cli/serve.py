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
"""The ``serve`` command: its flags as :class:`~monai.apps.vista3d.server.settings.ServerSettings`, checked before
the server starts (the network's flags by the same :class:`~monai.apps.vista3d.core.job.SegmentJob` as ``segment``'s,
so a bad one gets the same message and exit status), then :func:`~monai.apps.vista3d.server.serve.serve`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from monai.apps.vista3d.server.settings import ServerSettings

__all__ = ["settings_from_args"]

_MIB = 1 << 20


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """The :class:`~monai.apps.vista3d.server.settings.ServerSettings` of parsed ``serve`` flags: the network's as the
    checked :class:`~monai.apps.vista3d.core.job.SegmentJob` of :func:`~.parser.job_from_flags` (a
    :class:`~monai.apps.vista3d.config.SettingError` naming the field), the server's own (``ValueError`` naming the
    flag). Nothing is loaded."""
    from monai.apps.vista3d.server.settings import Limits, ServerSettings

    from .parser import job_from_flags

    model = job_from_flags(args, progress=False)

    limits = Limits(max_body_bytes=int(args.max_body_mb * _MIB), max_download_bytes=int(args.max_download_mb * _MIB),
                    max_voxels=args.max_voxels, max_points=args.max_points, max_classes=args.max_classes,
                    queue_size=args.queue_size, request_timeout=args.request_timeout,
                    session_ttl=args.session_ttl, max_sessions=args.max_sessions, body_timeout=args.body_timeout,
                    shutdown_timeout=args.shutdown_timeout,
                    keep_alive=args.keep_alive, max_connections=args.max_connections,
                    max_connections_per_client=args.max_connections_per_client,
                    max_queue_per_client=args.max_queue_per_client,
                    max_sessions_per_client=args.max_sessions_per_client)
    return ServerSettings.create(
        host=args.host, port=args.port, token=args.token, insecure=args.insecure,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        work_dir=Path(args.work_dir) if args.work_dir else None,
        allow_url_hosts=args.allow_url_host, allow_private_urls=args.allow_private_urls, model=model, limits=limits,
    )
