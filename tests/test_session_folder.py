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
"""The suite writes its caches only under its session's temporary folder (tests/conftest.py; issue 34, item 7)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from monai.utils.triton_support import kernel_cache_dir
from tests.subprocess_env import child_env


class TestSessionFolder(unittest.TestCase):
    def test_caches_under_the_session_folder(self):
        home = Path(os.path.expanduser("~")).resolve()
        tmp = Path(tempfile.gettempdir()).resolve()
        for where in (kernel_cache_dir(), os.environ["MONAI_TRITON_CACHE"], os.environ["TRITON_HOME"]):
            path = Path(where).resolve()
            self.assertTrue(path.is_relative_to(tmp), path)
            self.assertNotEqual(path, home)
        # the tests' child processes inherit it
        out = subprocess.run([sys.executable, "-c", "import os; print(os.environ['TRITON_CACHE_DIR'])"],
                             env=child_env(), capture_output=True, text=True, check=True).stdout.strip()
        self.assertEqual(out, kernel_cache_dir())


if __name__ == "__main__":
    unittest.main()
