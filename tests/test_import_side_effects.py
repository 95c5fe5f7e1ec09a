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
"""Importing ``monai`` and the fork's modules leaves the process as it found it: no import finder or path hook, no
handler, flag, random state, thread or environment variable changed (``tests.process_state``). Each case imports in
a fresh child process, so that the import really is the first."""

from __future__ import annotations

import json
import subprocess
import sys
import unittest

import pytest
from parameterized import parameterized

from tests.subprocess_env import ROOT, child_env

CHILD = """
import json
import sys

import nibabel  # noqa: F401  # the core dependencies (and torch, numpy below): their own import effects are theirs

from tests.process_state import process_state

before = process_state()
{imports}
after = process_state()
fork = sorted(name for name in sys.modules if name == "monai" or name.startswith("monai."))
print(json.dumps({{
    "before": {{k: repr(v) for k, v in before.items()}},
    "after": {{k: repr(v) for k, v in after.items()}},
    "modules": fork,
}}))
"""

# every module of the fork but the command line (run, not imported); the stubs of the upstream modules the fork
# lacks refuse with their own not-carried error, and only they may
IMPORT_EVERY_MODULE = """
import importlib
import pkgutil

import monai

for info in pkgutil.walk_packages(monai.__path__, "monai."):
    if info.name.rpartition(".")[2] == "__main__":
        continue
    try:
        importlib.import_module(info.name)
    except ImportError as e:
        if e.name != info.name or isinstance(e, ModuleNotFoundError) or "is not part of this fork" not in str(e):
            raise
"""


def _first_import(imports: str) -> dict:
    """The process state before and after ``imports`` in a fresh interpreter, and the monai modules it loaded."""
    done = subprocess.run([sys.executable, "-c", CHILD.format(imports=imports)], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"the child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
class TestImportSideEffects(unittest.TestCase):
    @parameterized.expand([
        ["monai", "import monai", "monai.utils.module"],
        # rooms imported by name from the package, as the first import of each (its __getattr__ imports them)
        ["vista3d_rooms", "from monai.apps.vista3d import batch, cli, config, core, io", "monai.apps.vista3d.core"],
        ["every_module", IMPORT_EVERY_MODULE, "monai.apps.vista3d.server"],
    ])
    def test_first_import(self, _, imports, loaded):
        state = _first_import(imports)
        self.assertIn(loaded, state["modules"])  # the import did happen
        for key, before in state["before"].items():
            self.assertEqual(state["after"][key], before, f"importing changed the process's {key}")


if __name__ == "__main__":
    unittest.main()
