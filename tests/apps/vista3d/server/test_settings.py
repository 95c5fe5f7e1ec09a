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
"""``vista3d serve``'s flags: loopback unless told, a token for any other address unless --insecure, and every
bad flag refused at start with a line that names it (exit status 2, no server started)."""

from __future__ import annotations

import contextlib
import io
import os
import unittest
from unittest import mock

from parameterized import parameterized

from monai.apps.vista3d.cli.main import main
from monai.apps.vista3d.cli.parser import build_parser
from monai.apps.vista3d.cli.serve import settings_from_args
from monai.apps.vista3d.server.settings import TOKEN_ENV, is_loopback

TOKEN = "a-token-of-sixteen-or-more"


def _settings(*flags: str):
    return settings_from_args(build_parser().parse_args(["serve", *flags]))


class TestServeSettings(unittest.TestCase):
    def setUp(self):
        patcher = mock.patch.dict(os.environ)
        patcher.start()
        os.environ.pop(TOKEN_ENV, None)
        self.addCleanup(patcher.stop)

    def test_loopback_by_default(self):
        s = _settings()
        self.assertEqual((s.host, s.port, s.token, s.insecure), ("127.0.0.1", 8000, None, False))
        self.assertEqual((s.allow_url_hosts, s.allow_private_urls, s.data_dir), ((), False, None))

    def test_client_shares_default_to_fractions(self):
        limits = _settings().limits
        self.assertEqual((limits.max_queue_per_client, limits.max_sessions_per_client,
                          limits.max_connections_per_client), (5, 4, 25))
        limits = _settings("--queue-size", "0", "--max-sessions", "1", "--max-connections", "2").limits
        self.assertEqual((limits.max_queue_per_client, limits.max_sessions_per_client,
                          limits.max_connections_per_client), (1, 1, 1))
        self.assertEqual(_settings("--max-queue-per-client", "3").limits.max_queue_per_client, 3)

    @parameterized.expand([("localhost", True), ("127.0.0.1", True), ("127.8.9.1", True), ("::1", True),
                           ("[::1]", True), ("0.0.0.0", False), ("::", False), ("10.0.0.5", False),
                           ("myhost.example", False)])
    def test_is_loopback(self, host, expected):
        self.assertEqual(is_loopback(host), expected)

    @parameterized.expand([("any", "0.0.0.0"), ("lan", "192.168.1.20"), ("name", "server.example.org")])
    def test_other_address_needs_a_token(self, _, host):
        with self.assertRaisesRegex(ValueError, "--token"):
            _settings("--host", host)
        self.assertEqual(_settings("--host", host, "--token", TOKEN).token, TOKEN)
        self.assertTrue(_settings("--host", host, "--insecure").insecure)
        os.environ[TOKEN_ENV] = TOKEN  # the token from the environment (a flag shows in ps)
        self.assertEqual(_settings("--host", host).token, TOKEN)

    @parameterized.expand([
        ("short_token", ("--token", "short"), "--token"),
        ("port", ("--port", "70000"), "--port"),
        ("url_rule", ("--allow-url-host", "http://example.org"), "--allow-url-host"),
        ("data_dir", ("--data-dir", "/no/such/folder"), "--data-dir"),
        ("weights", ("--weights", "/no/such/model.pt"), "--weights"),
        ("roi", ("--roi-size", "100"), "--roi-size"),
        ("queue", ("--queue-size", "-1"), "--queue-size"),
        ("ttl", ("--session-ttl", "0"), "--session-ttl"),
        ("body", ("--max-body-mb", "0"), "--max-body-mb"),
        ("points", ("--max-points", "0"), "--max-points"),
        ("classes", ("--max-classes", "0"), "--max-classes"),
        ("body_timeout", ("--body-timeout", "0"), "--body-timeout"),
        ("keep_alive", ("--keep-alive", "-1"), "--keep-alive"),
        ("connections", ("--max-connections", "0"), "--max-connections"),
        ("shutdown", ("--shutdown-timeout", "0"), "--shutdown-timeout"),
        ("queue_share", ("--max-queue-per-client", "0"), "--max-queue-per-client"),
        ("session_share", ("--max-sessions-per-client", "0"), "--max-sessions-per-client"),
        ("batch", ("--sw-batch-size", "many"), "--sw-batch-size"),
        ("embed", ("--embed-dim", "12"), "--embed-dim"),
        ("overlap", ("--overlap", "1"), "--overlap"),
    ])
    def test_bad_flag_exits_2_naming_it(self, _, flags, named):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            status = main(["serve", *flags])
        self.assertEqual(status, 2)
        self.assertIn(named, err.getvalue())
        self.assertEqual(len(err.getvalue().strip().splitlines()), 1, err.getvalue())

    def test_non_loopback_without_token_exits_2(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            status = main(["serve", "--host", "0.0.0.0"])
        self.assertEqual(status, 2)
        self.assertIn("--insecure", err.getvalue())


if __name__ == "__main__":
    unittest.main()
