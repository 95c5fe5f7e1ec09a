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
"""The benchmark scripts that run on a CPU, run end to end at tiny sizes: their own checks (files written and read
back, label maps compared) pass and they print their tables. Nothing is timed here; the numbers are the scripts'.

``nifti_io.py`` compared every header field of a written label map with the input's and failed once outputs were
marked as this program's; nothing ran it for days. A script a GPU session depends on should not break unseen.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import unittest

from parameterized import parameterized

from tests.subprocess_env import ROOT, child_env

# (name, arguments after the script, a line its output must contain)
SCRIPTS = [
    ("nifti_io", ["tests/benchmarks/nifti_io.py", "--cases", "48x40x24@1x1x2", "--repeat", "1"], "save_label_map"),
    ("nifti_load_stages", ["tests/benchmarks/nifti_load_stages.py", "--cases", "48x40x24@1x1x2", "--repeat", "1"],
     "load_image cpu float32 C order"),
    ("batch_throughput", ["tests/benchmarks/batch_throughput.py", "--volumes", "2", "--size", "40,40,32",
                          "--device", "cpu", "--embed-dim", "8"], "2/2 volumes"),
    ("streaming", ["tests/benchmarks/vista3d_streaming.py", "--device", "cpu", "--tiny", "--sizes", "48x48x48",
                   "--classes", "3", "--repeats", "1", "--full-repeats", "1"], "fork streamed, float32 acc"),
    ("class_head", ["tests/benchmarks/vista3d_class_head.py", "--device", "cpu", "--size", "16", "--classes", "3",
                    "--windows", "1", "--repeats", "1"], "loop/bcast"),
    ("batch_agreement", ["tests/benchmarks/vista3d_batch_agreement.py", "--device", "cpu", "--sizes", "48x48x48",
                         "--sw-batch-sizes", "1,2", "--classes", "3"], "labels = sw_batch_size 1"),
    ("dicom_read", ["-m", "tests.benchmarks.dicom_read", "--size", "24,20,8", "--repeats", "1"], "load_dicom_s"),
    ("cli_benchmark", ["-m", "monai.apps.vista3d", "benchmark", "--device", "cpu", "--size", "48,48,40",
                       "--roi-size", "32", "--embed-dim", "8", "--sw-batch-sizes", "1,2", "--repeats", "1"],
     "sw_batch_size"),
    ("batch_scaling", ["tests/benchmarks/batch_scaling.py", "--device", "cpu", "--ranks", "1,2", "--volumes", "2",
                       "--size", "40,40,32", "--", "--embed-dim", "8", "--roi-size", "32"], "% of linear"),
]


class TestBenchmarkScriptsRun(unittest.TestCase):
    @parameterized.expand(SCRIPTS)
    def test_runs(self, name, args, expected):
        with tempfile.TemporaryDirectory() as tmp:  # the scripts' temporary folders go in it, and go with it
            proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=child_env(OMP_NUM_THREADS="1", TMPDIR=tmp),
                                  capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, f"{name}:\n{out[-3000:]}")
        self.assertIn(expected, out, f"{name}:\n{out[-3000:]}")


if __name__ == "__main__":
    unittest.main()
