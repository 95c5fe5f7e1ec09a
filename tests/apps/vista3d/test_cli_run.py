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
"""``cli.main.run``, the program's way out: main's exit status, the exit handlers run, Python's teardown skipped;
in fresh processes, as the ``vista3d`` console script and ``python -m monai.apps.vista3d`` run it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from parameterized import parameterized

REPO = Path(__file__).resolve().parents[3]

# a process that marks what ran on its way out: an exit handler, a thread still at work when main returns (with
# "worker" as its first argument), and the teardown of an object that only a module holds
_PROGRAM = """
import atexit, sys, threading, time, types
folder = sys.argv[1]
if sys.argv[2] == "worker":
    del sys.argv[2]
    threading.Thread(target=lambda: (time.sleep(0.5), open(folder + "/thread", "w").close())).start()
class Teardown:
    def __del__(self):
        open(folder + "/teardown", "w").close()
holder = types.ModuleType("holder")
holder.kept = Teardown()
sys.modules["holder"] = holder
del holder
atexit.register(lambda: open(folder + "/atexit", "w").close())
sys.argv = ["vista3d", *sys.argv[2:]]
from monai.apps.vista3d.cli.main import main, run
{end}
"""


def _program(folder: str, end: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", _PROGRAM.format(end=end), folder, *args], capture_output=True,
                          text=True, env=env, timeout=120, cwd=folder)


class TestRun(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.folder = tmp.name

    @parameterized.expand([("version", ["--version"], 0), ("bad setting", ["-i", "x.nii.gz", "-o", "out", "--roi-size", "8"], 2)])
    def test_status_handlers_and_no_teardown(self, _, args, status):
        proc = _program(self.folder, "run()", *args)
        self.assertEqual(proc.returncode, status, proc.stderr)
        if status == 0:
            self.assertIn("vista3d 1.6.1", proc.stdout)  # the output flushed before the process ended
        else:
            self.assertIn("error: --roi-size", proc.stderr)
        self.assertTrue(Path(self.folder, "atexit").exists())  # exit handlers (logging, temporary folders) ran
        self.assertFalse(Path(self.folder, "teardown").exists())  # the interpreter's teardown did not run

    def test_a_thread_at_work_is_waited_for(self):
        proc = _program(self.folder, "run()", "worker", "--version")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue(Path(self.folder, "thread").exists())
        self.assertTrue(Path(self.folder, "atexit").exists())

    def test_the_usual_exit_tears_down(self):
        # what run() skips: the same program leaving through sys.exit tears its objects down
        proc = _program(self.folder, "sys.exit(main())", "--version")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue(Path(self.folder, "teardown").exists())

    @parameterized.expand([("run", "run()", True), ("main alone", "sys.exit(main())", False)])
    def test_the_program_freezes_its_imports_for_the_collector(self, _, end, frozen):
        # what the process made before main (torch's objects) is out of the cyclic collector's walks in the
        # program only; main alone (as tests and callers run it in their process) leaves the collector as it was
        probe = ("import gc, monai.apps.vista3d.cli.main as cli\n"
                 "made, before = len(gc.get_objects()), gc.get_freeze_count()\n"
                 "cli.main = main = lambda: print(gc.get_freeze_count(), made, before, flush=True) or 0\n")
        proc = _program(self.folder, probe + end, "--version")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        count, made, before = (int(n) for n in proc.stdout.split())
        self.assertGreater(made, 50_000)  # torch's imports
        if frozen:
            self.assertGreaterEqual(count - before, made)
        else:  # (an interpreter may start with a few objects frozen: 375 on the GPU image's Python 3.12)
            self.assertEqual(count, before)

    def test_module_entry_uses_run(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run([sys.executable, "-m", "monai.apps.vista3d", "--version"], capture_output=True,
                              text=True, env=env, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("vista3d 1.6.1", proc.stdout)
        main_py = (REPO / "monai" / "apps" / "vista3d" / "__main__.py").read_text()
        self.assertIn("run()", main_py)
        self.assertIn("vista3d=monai.apps.vista3d.cli.main:run", (REPO / "setup.py").read_text())


if __name__ == "__main__":
    unittest.main()
