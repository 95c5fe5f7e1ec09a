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
"""Clients that send slowly, or never, over real sockets: a body must arrive within --body-timeout before its
request takes a queue place, headers too, idle connections are closed, and connections are bounded in all and per
address. Each waits on the server's answer or its closing the socket, never on a fixed sleep."""

from __future__ import annotations

import json
import socket
import threading
import time
import unittest

import httpx
from parameterized import parameterized

from monai.apps.vista3d.server.settings import Limits
from tests.apps.vista3d.server.harness import LiveServer, phantom_folder_for_class, settings
from tests.apps.vista3d.server.monailabel_client import hand_built_multipart

WAIT = 60  # seconds a socket waits for the server before the test fails


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=WAIT, source_address=(source, 0))


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the socket (a socket it never closes times out: a failure)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:  # closed with our unread bytes still in its buffer
        pass
    return data


def _status(data: bytes) -> int:
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0


def _detail(data: bytes) -> str:
    return json.loads(data.partition(b"\r\n\r\n")[2])["detail"]


class _Trickle(threading.Thread):
    """Sends ``head`` and then ``body`` one byte every ``every`` seconds, until the server closes the socket."""

    def __init__(self, sock: socket.socket, head: bytes, body: bytes, every: float = 0.3):
        super().__init__(daemon=True)
        self.sock, self.head, self.body, self.every = sock, head, body, every
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            self.sock.sendall(self.head)
            for i in range(len(self.body)):
                if self.stop.wait(self.every):
                    return
                self.sock.sendall(self.body[i:i + 1])
        except OSError:  # the server closed the connection
            pass


class TestSlowClients(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.data = phantom_folder_for_class(cls)

    def _server(self, **limits) -> LiveServer:
        server = LiveServer(settings(data_dir=self.data, limits=Limits(request_timeout=120.0, **limits)))
        server.__enter__()
        self.addCleanup(server.__exit__, None, None, None)
        server.wait_ready()
        return server

    def _slow_body(self, protocol: str) -> tuple[str, str, bytes]:
        """``(request line, content type, body)`` of a request that needs the queue, on either protocol."""
        if protocol == "nim":
            body = json.dumps({"image": "ct.nii.gz", "prompts": {"classes": ["liver"]}}).encode()
            return "POST /v1/vista3d/inference", "application/json", body
        # 3D Slicer's upload of the image it shows: its hand-built multipart form
        params = json.dumps({"client_id": "slow"})
        ctype, body = hand_built_multipart({"params": params}, {"file": self.data / "ct.nii.gz"})
        return "PUT /datastore/?image=ct", ctype, body

    @parameterized.expand([("nim",), ("monailabel",)])
    def test_slow_bodies_take_no_place_and_get_408(self, protocol):
        # nine clients send a body (the NIM's JSON, or MONAI Label's upload) at a byte per 0.3 s into a queue of
        # nine places: a normal request is still served (not 429), and each slow one gets 408 once --body-timeout
        # has passed, then its socket is closed
        server = self._server(body_timeout=1.0, queue_size=8)
        line, ctype, body = self._slow_body(protocol)
        head = (f"{line} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
                ).encode()
        slow = [_Trickle(_connect(server.port), head, body) for _ in range(9)]
        for t in slow:
            t.start()
        start = time.monotonic()
        with httpx.Client(base_url=server.url, timeout=WAIT) as http:
            response = http.post("/v1/vista3d/inference", json={"image": "ct.nii.gz", "prompts": {"classes": [1]}})
        self.assertEqual(response.status_code, 200, response.text)
        for t in slow:
            data = _answer(t.sock)  # the 408, then the server closes the socket
            t.stop.set()
            t.sock.close()
            self.assertEqual(_status(data), 408, data)
            self.assertIn("--body-timeout", _detail(data))
        self.assertLess(time.monotonic() - start, WAIT)
        self.assertEqual(server.worker.held, 0)
        self.assertEqual(server.worker.counts["done"], 1)  # no slow request ever reached the model

    def test_half_open_connections_are_closed(self):
        # connections that send nothing, or their headers a byte at a time, are answered 408 and closed after
        # --body-timeout; the server then holds none of them
        server = self._server(body_timeout=1.0)
        silent = [_connect(server.port) for _ in range(5)]
        head = b"POST /v1/vista3d/inference HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        dribbling = [_Trickle(_connect(server.port), b"", head) for _ in range(5)]
        for t in dribbling:
            t.start()
        for sock in silent + [t.sock for t in dribbling]:
            data = _answer(sock)
            self.assertEqual(_status(data), 408, data)
            self.assertIn("no whole request arrived within 1 s", _detail(data))
            sock.close()
        for t in dribbling:
            t.stop.set()
        connections = server._server.server_state.connections
        deadline = time.monotonic() + WAIT
        while connections and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(len(connections), 0)

    def test_idle_connection_closed_after_keep_alive(self):
        server = self._server(keep_alive=0.5)
        with _connect(server.port) as sock:
            sock.sendall(b"GET /v1/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            data = _answer(sock)  # the answer, then the server closes the idle connection
        self.assertEqual(_status(data), 200)
        self.assertEqual(json.loads(data.partition(b"\r\n\r\n")[2]), {"status": "live"})

    def test_connections_bounded_in_all_and_per_address(self):
        server = self._server(body_timeout=60.0, max_connections=6, max_connections_per_client=3)
        held = [_connect(server.port, "127.0.0.1") for _ in range(3)]
        with _connect(server.port, "127.0.0.1") as fourth:
            data = _answer(fourth)
        self.assertEqual(_status(data), 503)
        self.assertIn("3 from one address", _detail(data))
        held += [_connect(server.port, "127.0.0.2") for _ in range(3)]  # another address has its own share
        with _connect(server.port, "127.0.0.3") as seventh:
            data = _answer(seventh)
        self.assertEqual(_status(data), 503)
        self.assertIn("--max-connections 6", _detail(data))
        for sock in held[:2]:  # the held ones are served
            sock.sendall(b"GET /v1/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = _answer(sock)
            self.assertEqual(_status(data), 200)
        for sock in held:
            sock.close()


if __name__ == "__main__":
    unittest.main()
