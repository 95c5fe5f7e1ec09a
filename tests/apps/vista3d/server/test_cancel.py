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
"""Long jobs over a real socket: one whose client leaves or whose time runs out frees the model at its next window;
a server told to stop (what uvicorn does on SIGTERM) answers the waiting requests 503 at once and the running one
503 once --shutdown-timeout has passed (200 if it finishes before), never 500.

Each window is slowed to a known time by a forward pre-hook, so that a long job is long on any machine; the tests
count windows, never wall time against a fixed budget."""

from __future__ import annotations

import json
import socket
import threading
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

import httpx
from parameterized import parameterized

from monai.apps.vista3d.server.settings import Limits
from tests.apps.vista3d.server.harness import (
    LiveServer,
    phantom_folder_for_class,
    settings,
    tiny_pipeline,
)

WAIT = 60
WINDOW = 0.3  # seconds each window is held
POINTS = [[x, y, 12] for x in (4, 8, 12, 16, 20) for y in (4, 10, 16, 20)]  # 20 windows: at least 6 s


class _SlowWindows:
    """A forward pre-hook holding every window ``WINDOW`` seconds, recording when each began."""

    def __init__(self, network) -> None:
        self.started: list[float] = []
        self.event = threading.Condition()
        network.register_forward_pre_hook(self)

    def __call__(self, module, args) -> None:
        with self.event:
            self.started.append(time.monotonic())
            self.event.notify_all()
        time.sleep(WINDOW)

    def wait_for(self, n: int) -> bool:
        with self.event:
            return self.event.wait_for(lambda: len(self.started) >= n, WAIT)


def _points_body(points) -> dict:
    return {"image": "ct.nii.gz", "prompts": {"points": {"spleen": points}}}


class TestLongJobs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.data = phantom_folder_for_class(cls)

    def _server(self, **limits) -> tuple[LiveServer, _SlowWindows]:
        pipe = tiny_pipeline()
        limits = Limits(**{"request_timeout": 120.0, "max_points": 40, **limits})
        server = LiveServer(settings(data_dir=self.data, limits=limits), factory=lambda: pipe, warm_up=False)
        server.__enter__()
        self.addCleanup(server.__exit__, None, None, None)
        server.wait_ready()
        return server, _SlowWindows(pipe.network)

    @parameterized.expand([("client_leaves",), ("time_runs_out",)])
    def test_a_cancelled_job_frees_the_model_at_its_next_window(self, how):
        server, slow = self._server(request_timeout=2.0 if how == "time_runs_out" else 120.0)
        body = json.dumps(_points_body(POINTS)).encode()
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
        self.addCleanup(sock.close)
        sock.sendall(b"POST /v1/vista3d/inference HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        self.assertTrue(slow.wait_for(3))
        if how == "client_leaves":
            given_up = time.monotonic()
            sock.close()
        else:
            answer = sock.recv(65536)  # the 504 comes at the request's deadline
            given_up = time.monotonic()
            self.assertTrue(answer.startswith(b"HTTP/1.1 504"), answer)
        self.assertTrue(server.worker.wait_for(lambda w: not w.running and w.counts["cancelled"] == 1, WAIT))
        late = [t for t in slow.started if t > given_up]
        self.assertLessEqual(len(late), 1)  # at most the window that had already begun when it was given up
        self.assertLess(len(slow.started), len(POINTS) // 2)  # far from the job's end
        self.assertEqual(server.worker.held, 0)

    @parameterized.expand([("job_cut_short", 1.0, POINTS, 503), ("job_finishes_in_time", 30.0, POINTS[:2], 200)])
    def test_stopping_answers_every_request(self, _, timeout, points, running_status):
        server, slow = self._server(shutdown_timeout=timeout, queue_size=2, max_queue_per_client=3)
        with ThreadPoolExecutor(2) as pool, httpx.Client(base_url=server.url, timeout=WAIT) as http:
            running = pool.submit(http.post, "/v1/vista3d/inference", json=_points_body(points))
            self.assertTrue(slow.wait_for(1))
            waiting = pool.submit(http.post, "/v1/vista3d/inference", json={"image": "ct.nii.gz"})
            self.assertTrue(server.worker.wait_for(lambda w: w.pending == 1, WAIT))
            told = time.monotonic()
            server._server.should_exit = True  # what uvicorn's SIGTERM handler does
            queued = waiting.result()
            self.assertEqual(queued.status_code, 503, queued.text)
            self.assertIn("stopping", queued.json()["detail"])
            self.assertEqual(queued.headers["retry-after"], "10")
            answer = running.result()
        self.assertEqual(answer.status_code, running_status, answer.text)
        if running_status == 503:
            self.assertGreaterEqual(time.monotonic() - told, timeout)  # it had its --shutdown-timeout
            self.assertLess(len(slow.started), len(POINTS))  # and was cut short, at a window
        server._thread.join(WAIT)
        self.assertFalse(server._thread.is_alive())  # the server has stopped


    def test_a_body_still_arriving_when_the_server_stops_gets_503(self):
        # a request whose body is still coming in when the graceful shutdown runs out is cut short by uvicorn: it
        # is answered 503 like the others, not uvicorn's plain 500
        server, _ = self._server(shutdown_timeout=0.5, body_timeout=60.0)
        with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as sock:
            sock.sendall(b"POST /v1/vista3d/inference HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{")
            tasks = server._server.server_state.tasks  # the request is in the app once uvicorn runs its task
            deadline = time.monotonic() + WAIT
            while not tasks and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertEqual(len(tasks), 1)
            server._server.should_exit = True
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        self.assertTrue(answer.startswith(b"HTTP/1.1 503"), answer)
        self.assertIn(b"stopping", answer)


if __name__ == "__main__":
    unittest.main()
