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
"""``vista3d serve`` against the clients of issue 47, timed: the real server in a subprocess (``python -m
monai.apps.vista3d serve``, loopback, a ``vista3d132`` of width 8 with random weights saved to a file, the phantom
under ``--data-dir``), four scenes, each on a fresh server:

- ``slow_bodies``: nine clients send a JSON body at one byte per ``--slow-every`` seconds (3, as measured in the
  issue) into the nine queue places of the defaults, while one client sends normal requests back to back: its
  statuses, and when each slow client got its answer.
- ``half_open``: ``--connections`` connections opened at once, half silent, half with a partial request line:
  how many are still open one and two seconds past ``--body-timeout``.
- ``cancel``: a click request with ``--points`` points (one window each, every window seeing every point) whose
  client disconnects after ``--cancel-after`` seconds, then a one-class request: how long that request waited for
  the model (its latency less its own time, from ``Server-Timing``), against one window's time (the whole click
  job, run once before, over its windows).
- ``sigterm``: that click job running and a one-class request waiting when the server gets SIGTERM, with
  ``--shutdown-timeout``: each answer's status and time, and the process's exit status and time.

    python tests/benchmarks/vista3d_serve_reliability.py            # the CPU defaults
    python tests/benchmarks/vista3d_serve_reliability.py --device cuda --embed-dim 48 --roi 128 --shape 256,256,128
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``vista3d serve`` in a subprocess with the run's network and ``flags``; ready when constructed."""

    def __init__(self, args: argparse.Namespace, root: Path, *flags: str):
        import httpx

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "monai.apps.vista3d", "serve", "--weights", str(root / "model.pt"), "--port",
               str(self.port), "--device", args.device, "--embed-dim", str(args.embed_dim), "--roi-size",
               str(args.roi), "--data-dir", str(root / "data"), "--log-level", "warning", *flags]
        print("$", " ".join(cmd), flush=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
        self.log = (root / f"server-{self.port}.log").open("w")
        self.proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/v1/health/ready", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            time.sleep(0.2)  # polling another process: there is nothing to wait on
        raise RuntimeError("the server did not turn ready in 10 minutes")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        code = self.proc.wait(timeout=120)
        self.log.close()
        tail = Path(self.log.name).read_text().strip().splitlines()[-15:]
        print(f"server exit status {code}; its log ends:", *tail, sep="\n  ", flush=True)
        return code


def _status_of(sock: socket.socket) -> tuple[int, float]:
    """The status of the answer a socket gets (0: closed without one) and when it came (monotonic)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data:
                break
    except OSError:
        pass
    return (int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0), time.monotonic()


def _post(url: str, body: dict, timeout: float = 600) -> tuple[int, float, float]:
    """``(status, latency s, the server's own time s from Server-Timing)`` of one JSON inference request."""
    import httpx

    start = time.monotonic()
    response = httpx.post(f"{url}/v1/vista3d/inference", json=body, timeout=timeout)
    stages = [part.split(";dur=") for part in response.headers.get("server-timing", "").split(", ")]
    own = sum(float(d) for p in stages if len(p) == 2 for d in p[1:]) / 1000.0
    return response.status_code, time.monotonic() - start, own


def _click_body(n: int, shape: tuple[int, int, int]) -> dict:
    points = [[int(shape[0] * (0.3 + 0.4 * (k % 7) / 6)), int(shape[1] * (0.3 + 0.4 * (k // 7 % 7) / 6)),
               int(shape[2] * (0.3 + 0.4 * (k // 49 % 7) / 6))] for k in range(n)]
    return {"image": "ct.nii.gz", "prompts": {"points": {"liver": points}}}


ONE_CLASS = {"image": "ct.nii.gz", "prompts": {"classes": ["liver"]}}


def slow_bodies(args: argparse.Namespace, root: Path) -> dict:
    server = Server(args, root)
    try:
        body = json.dumps(ONE_CLASS).encode()
        head = (b"POST /v1/vista3d/inference HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        answers: list[tuple[int, float]] = []
        start = time.monotonic()

        def slow() -> None:
            with socket.create_connection(("127.0.0.1", server.port), timeout=600) as sock:
                sock.sendall(head)
                sock.settimeout(args.slow_every)
                for i in range(len(body)):
                    try:
                        got = sock.recv(65536)  # the server's answer, before the next byte is due
                    except socket.timeout:
                        sock.sendall(body[i:i + 1])
                        continue
                    status = int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/1.1 ") else 0
                    answers.append((status, time.monotonic() - start))
                    return
                answers.append((-1, time.monotonic() - start))  # the whole body went through

        threads = [threading.Thread(target=slow) for _ in range(9)]
        for t in threads:
            t.start()
        normal = []
        while any(t.is_alive() for t in threads):
            normal.append(_post(server.url, ONE_CLASS)[0])
        for t in threads:
            t.join()
    finally:
        server.stop()
    return {"normal_statuses": {str(s): normal.count(s) for s in sorted(set(normal))},
            "slow_statuses": sorted({str(s) for s, _ in answers}),
            "slow_answered_after_s": [round(t, 2) for _, t in answers]}


def half_open(args: argparse.Namespace, root: Path) -> dict:
    n = args.connections
    server = Server(args, root, "--max-connections", str(2 * n), "--max-connections-per-client", str(2 * n))
    try:
        socks = [socket.create_connection(("127.0.0.1", server.port), timeout=600) for _ in range(n)]
        opened = time.monotonic()
        for sock in socks[: n // 2]:
            sock.sendall(b"POST /v1/vista3d/inference HT")
        results = {}

        def still_open() -> int:
            count = 0
            for sock in socks:
                sock.setblocking(False)
                try:
                    count += sock.recv(65536, socket.MSG_PEEK) != b""  # data waiting, not closed yet: peek again
                except BlockingIOError:
                    count += 1  # nothing yet: still open
                except OSError:
                    pass
            return count

        for past in (1.0, 2.0):
            time.sleep(max(0.0, opened + args.body_timeout + past - time.monotonic()))
            for sock in socks:  # read what the server sent (its 408) so that a closed socket reads b""
                sock.setblocking(False)
                try:
                    while sock.recv(65536):
                        pass
                except (BlockingIOError, OSError):
                    pass
            results[f"open_{past:g}s_past_body_timeout"] = still_open()
        for sock in socks:
            sock.close()
    finally:
        server.stop()
    return {"connections": n, **results}


def cancel(args: argparse.Namespace, root: Path) -> dict:
    server = Server(args, root, "--max-points", str(args.points))
    click = _click_body(args.points, args.shape)
    try:
        status, whole, own = _post(server.url, click)
        window = own / args.points
        body = json.dumps(click).encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=600) as sock:
            sock.sendall(b"POST /v1/vista3d/inference HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            time.sleep(args.cancel_after)
        status_next, latency, own_next = _post(server.url, ONE_CLASS)
    finally:
        server.stop()
    return {"click_job_s": round(own, 3), "click_status": status, "window_s": round(window, 3),
            "next_status": status_next, "next_waited_for_the_model_s": round(latency - own_next, 3)}


def sigterm(args: argparse.Namespace, root: Path) -> dict:
    server = Server(args, root, "--max-points", str(args.points), "--shutdown-timeout", str(args.shutdown_timeout))
    out: dict[str, tuple[int, float]] = {}
    try:
        def send(key: str, body: dict) -> None:
            status, latency, _ = _post(server.url, body)
            out[key] = (status, time.monotonic())

        running = threading.Thread(target=send, args=("running", _click_body(args.points, args.shape)))
        running.start()
        time.sleep(1.0)
        waiting = threading.Thread(target=send, args=("waiting", ONE_CLASS))
        waiting.start()
        time.sleep(1.0)
        told = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(timeout=120)
        exited = time.monotonic()
        running.join()
        waiting.join()
    finally:
        server.stop()
    return {"shutdown_timeout_s": args.shutdown_timeout,
            **{f"{k}_status": v[0] for k, v in out.items()},
            **{f"{k}_answered_after_s": round(v[1] - told, 2) for k, v in out.items()},
            "exit_status": code, "exited_after_s": round(exited - told, 2)}


SCENES = {"slow_bodies": slow_bodies, "half_open": half_open, "cancel": cancel, "sigterm": sigterm}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--embed-dim", type=int, default=8)
    p.add_argument("--roi", type=int, default=32)
    p.add_argument("--shape", default="64,64,48", help="the phantom's voxels")
    p.add_argument("--scenes", default=",".join(SCENES))
    p.add_argument("--slow-every", type=float, default=3.0, help="seconds between a slow client's bytes")
    p.add_argument("--body-timeout", type=float, default=5.0, help="the server's default (for half_open's checks)")
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--points", type=int, default=64, help="points of the long click job (the --max-points default)")
    p.add_argument("--cancel-after", type=float, default=2.0)
    p.add_argument("--shutdown-timeout", type=float, default=3.0)
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    args.shape = tuple(int(v) for v in args.shape.split(","))
    return args


def main(argv=None) -> int:
    from monai.apps.vista3d.cli.phantom import write_phantom
    from monai.networks.nets import vista3d132

    args = parse_args(argv)
    results = {"torch": torch.__version__, "device": args.device, "embed_dim": args.embed_dim, "roi": args.roi,
               "shape": list(args.shape)}
    with tempfile.TemporaryDirectory(prefix="vista3d_reliability_") as tmp:
        root = Path(tmp)
        (root / "data").mkdir()
        write_phantom(root / "data" / "ct.nii.gz", args.shape, (1.0, 1.0, 1.5), 0)
        torch.manual_seed(0)
        torch.save(vista3d132(encoder_embed_dim=args.embed_dim).state_dict(), root / "model.pt")
        for name in args.scenes.split(","):
            results[name] = SCENES[name](args, root)
            print(name, json.dumps(results[name]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
