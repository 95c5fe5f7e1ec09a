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
"""``batch_scaling.py`` refuses a row whose command failed or left inputs unsegmented, and builds the README's
commands (its whole run on the CPU is in ``test_benchmark_scripts.py``)."""

from __future__ import annotations

import json
import sys
import tempfile
import unittest
from pathlib import Path

from parameterized import parameterized

from tests.benchmarks.batch_scaling import command, percent_of_linear, run_row


def _fake_cli(out: Path, exit_code: int, done: int) -> list[str]:
    """A command that writes ``out/summary.json`` with ``done`` images done, then exits with ``exit_code``."""
    script = (f"import json, pathlib, sys; p = pathlib.Path({str(out)!r}); p.mkdir(parents=True); "
              f"(p / 'summary.json').write_text(json.dumps({{'done': {done}}})); sys.exit({exit_code})")
    return [sys.executable, "-c", script]


class TestBatchScaling(unittest.TestCase):
    @parameterized.expand([("failed", 1, 4, "exited 1"), ("short", 0, 3, "segmented 3 of 4 inputs")])
    def test_row_refused(self, _, exit_code, done, message):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out"
            with self.assertRaisesRegex(RuntimeError, message):
                run_row(_fake_cli(out, exit_code, done), out, volumes=4)

    def test_row_timed(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out"
            out.mkdir()
            (out / "stale.txt").write_text("from an earlier row")  # a row starts from an empty output folder
            self.assertGreater(run_row(_fake_cli(out, 0, 4), out, volumes=4), 0.0)
            self.assertEqual(json.loads((out / "summary.json").read_text()), {"done": 4})
            self.assertFalse((out / "stale.txt").exists())

    def test_commands(self):
        one = command(1, Path("in"), Path("out"), "cuda", ["--weights", "m.pt"])
        self.assertEqual(one[1:], ["-m", "monai.apps.vista3d", "-i", "in", "-o", "out", "--device", "cuda",
                                   "--overwrite", "--weights", "m.pt"])
        four = command(4, Path("in"), Path("out"), "cuda", [])
        self.assertEqual(four[1:6], ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "-m"])

    def test_percent_of_linear(self):
        self.assertEqual(percent_of_linear({1: 10.0, 2: 18.0, 4: 40.0}), {1: 100.0, 2: 90.0, 4: 100.0})


if __name__ == "__main__":
    unittest.main()
