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
"""``vista3d serve``: the flags, turned into :class:`~.settings.ServerSettings` once, and uvicorn started.

The command line of the app calls :func:`add_serve_command` once to get the subcommand; nothing here imports
FastAPI or uvicorn until the command runs, so the core install (without the ``serve`` extra) keeps its CLI.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

__all__ = ["add_serve_command", "run_serve", "settings_from_args"]

_MIB = 1 << 20


def add_serve_command(subparsers: Any, prog: str = "vista3d") -> argparse.ArgumentParser:
    """Add ``serve`` to the app's subcommands; ``args.run(args)`` then runs it and returns the exit status."""
    p = subparsers.add_parser(
        "serve", help="an HTTP server with the VISTA-3D NIM's API and click sessions (needs the 'serve' extra)",
        description="Serve VISTA3D over HTTP: the NVIDIA VISTA-3D NIM's endpoints (/v1/health/live, /v1/health/ready, "
                    "/v1/vista3d/info, /v1/vista3d/inference) and click sessions (/v1/vista3d/sessions). Listens on "
                    "127.0.0.1 unless told otherwise.",
        usage=f"{prog} serve --weights model.pt [--host 127.0.0.1] [--port 8000] [options]",
    )
    p.add_argument("--weights", default=None, help="the VISTA3D bundle's models/model.pt (without: random weights)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000, the NIM's)")
    p.add_argument("--token", default=None,
                   help="bearer token every request but the health checks must send (or set VISTA3D_SERVE_TOKEN); "
                        "required for a --host other machines can reach, unless --insecure")
    p.add_argument("--insecure", action="store_true", help="serve a non-loopback --host without a token")
    p.add_argument("--data-dir", default=None,
                   help="folder whose files requests may name as 'image' (and as 'local_working_dir'); none: no "
                        "server-side paths")
    p.add_argument("--work-dir", default=None, help="folder for uploads, downloads and answers in flight "
                                                    "(default: a temporary folder)")
    p.add_argument("--allow-url-host", action="append", default=[], metavar="HOST",
                   help="a host image URLs may name (host, host:port or *.domain; repeat for more); none: no URLs")
    p.add_argument("--allow-private-urls", action="store_true",
                   help="let image URLs reach private, loopback and link-local addresses")
    p.add_argument("--max-body-mb", type=float, default=1024, help="largest request body, uploads included (1024)")
    p.add_argument("--max-download-mb", type=float, default=1024, help="largest image fetched from a URL (1024)")
    p.add_argument("--max-voxels", type=int, default=1 << 30, help="largest image in voxels, read from its header "
                                                                   "before it is inflated (2^30)")
    p.add_argument("--queue-size", type=int, default=8,
                   help="requests that may wait behind the running one; more get 429 with Retry-After (8)")
    p.add_argument("--request-timeout", type=float, default=600, help="seconds a request may take (600)")
    p.add_argument("--session-ttl", type=float, default=1800, help="seconds a click session lives unused (1800)")
    p.add_argument("--max-sessions", type=int, default=8, help="click sessions held at once; the least recently "
                                                              "used is evicted for a new one (8)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--embed-dim", type=int, default=48, help="vista3d132 encoder width (48, the published network)")
    p.add_argument("--roi-size", default="128", help="sliding-window size, one number or x,y,z (128)")
    p.add_argument("--overlap", type=float, default=0.25, help="sliding-window overlap (0.25)")
    p.add_argument("--sw-batch-size", default="1", help="windows per network call, or 'auto' (1)")
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                   help="float16 autocast on CUDA (default: on for CUDA)")
    p.add_argument("--no-fuse", dest="fuse", action="store_false", help="run the network's module path")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(run=run_serve)
    return p


def _roi(text: str) -> tuple[int, int, int]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"--roi-size must be integers, got {text!r}") from None
    values = values * 3 if len(values) == 1 else values
    if len(values) != 3 or min(values) < 16 or any(v % 16 for v in values):
        raise ValueError(f"--roi-size must be 1 or 3 multiples of 16, got {text!r}")
    return values


def settings_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~.settings.ServerSettings` of parsed ``serve`` flags (``ValueError`` naming a bad flag)."""
    from pathlib import Path

    from .settings import Limits, ModelSettings, ServerSettings

    batch: Any = args.sw_batch_size
    if batch != "auto":
        if not batch.isdigit() or int(batch) < 1:
            raise ValueError(f"--sw-batch-size must be a positive integer or 'auto', got {batch!r}")
        batch = int(batch)
    model = ModelSettings(weights=args.weights, device=args.device, embed_dim=args.embed_dim,
                          roi_size=_roi(args.roi_size), overlap=args.overlap, sw_batch_size=batch, amp=args.amp,
                          fuse=args.fuse)
    limits = Limits(max_body_bytes=int(args.max_body_mb * _MIB), max_download_bytes=int(args.max_download_mb * _MIB),
                    max_voxels=args.max_voxels, queue_size=args.queue_size, request_timeout=args.request_timeout,
                    session_ttl=args.session_ttl, max_sessions=args.max_sessions)
    return ServerSettings.create(
        host=args.host, port=args.port, token=args.token, insecure=args.insecure,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        work_dir=Path(args.work_dir) if args.work_dir else None,
        allow_url_hosts=args.allow_url_host, allow_private_urls=args.allow_private_urls, model=model, limits=limits,
    )


def run_serve(args: argparse.Namespace) -> int:
    """Run the server until SIGINT/SIGTERM; 1 when the model failed to load, 2 for bad flags.

    On a signal uvicorn shuts down gracefully (queued jobs dropped, the scratch folder removed) and then raises the
    signal again, so the process ends as the command line's handler says (130, 143); 0 when it stopped otherwise.
    """
    try:
        settings = settings_from_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        import uvicorn

        from .app import create_app
        from .protocol import uvicorn_config
    except ImportError as e:
        print(f"error: vista3d serve needs FastAPI and uvicorn ({e}); pip install 'monai[serve]'", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    failed: list[BaseException] = []
    server: Any = None

    def stop(e: BaseException) -> None:  # the model did not load: there is nothing to serve
        failed.append(e)
        if server is not None:
            server.should_exit = True

    app = create_app(settings, on_failure=stop)
    config = uvicorn_config(app, host=settings.host, port=settings.port, log_level=args.log_level, workers=1,
                            timeout_graceful_shutdown=10)
    server = uvicorn.Server(config)
    print(f"vista3d serve: http://{settings.host}:{settings.port}/v1/health/ready turns ready once the model has "
          "loaded", file=sys.stderr, flush=True)
    server.run()
    if failed:
        print(f"error: the model failed to load: {' '.join(str(failed[0]).split())}", file=sys.stderr)
        return 1
    return 0
