"""Every public name of upstream MONAI 1.6.1's carried modules either imports from the fork as the same kind of
object, or raises the fork's one-line "not part of this fork" ImportError; so does every upstream module.

The names are recorded from the 1.6.1 wheel by tests/testing_data/record_upstream_names.py.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import unittest

import pytest
from parameterized import parameterized

from tests.subprocess_env import ROOT, child_env
from tests.testing_data.record_upstream_names import (
    kind_of,  # the recorder's kinds, by the same rule
)

TESTING_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testing_data")
with open(os.path.join(TESTING_DATA, "upstream_public_names.json")) as _f:
    RECORD = json.load(_f)
NAMES = [[f"{m}.{n}", m, n, kind] for m, names in sorted(RECORD["modules"].items()) for n, kind in sorted(names.items())]
NOT_CARRIED = re.compile(r"^'(monai(?:\.\w+)*)' is not part of this fork\. [^\n]*upstream MONAI[^\n]*$")


def import_name(module: str, name: str):
    """``from module import name``, as a user writes it."""
    scope: dict = {}
    exec(f"from {module} import {name} as imported", scope)
    return scope["imported"]


class TestUpstreamNames(unittest.TestCase):
    def test_record(self):
        self.assertEqual(RECORD["monai_version"], "1.6.1")
        self.assertGreater(len(NAMES), 500)

    @parameterized.expand(NAMES)
    def test_name(self, qualified, module, name, kind):
        try:
            obj = import_name(module, name)
        except ImportError as e:
            message = str(e)
            self.assertIn(f"'{qualified}' is not part of this fork", message)
            self.assertNotIn("\n", message)
            return
        self.assertEqual(kind_of(obj), kind, f"{qualified} is a {kind} in MONAI 1.6.1")

    def test_carried_names_are_carried(self):
        """The VISTA3D names this fork exists for are not among the refused ones."""
        for module, name in [("monai.networks.nets", "VISTA3D"), ("monai.networks.nets", "vista3d132"),
                             ("monai.inferers", "SlidingWindowInfererAdapt"), ("monai.apps.vista3d", "inferer"),
                             ("monai.utils", "optional_import"), ("monai.networks.blocks", "UnetrBasicBlock")]:
            self.assertIn(name, RECORD["modules"][module])
            import_name(module, name)

    def test_upstream_only_profiler_is_refused(self):
        with self.assertRaisesRegex(ImportError, r"^'monai.utils.profiling.PerfContext' is not part of this fork"):
            import_name("monai.utils.profiling", "PerfContext")

    def test_unknown_name_is_not_called_upstream(self):
        with self.assertRaisesRegex(ImportError, "cannot import name 'no_such_name'"):
            import_name("monai.utils.profiling", "no_such_name")


class TestUpstreamModules(unittest.TestCase):
    @parameterized.expand([[m] for m in RECORD["submodules"]])
    def test_module(self, module):
        """An upstream module imports, or raises the one-line error naming the first package or module (itself or
        one above it) that the fork lacks: ``import monai.data.meta_tensor`` names ``monai.data``."""
        try:
            importlib.import_module(module)
        except ImportError as e:
            found = NOT_CARRIED.match(str(e))
            self.assertIsNotNone(found, str(e))
            missing = found.group(1)
            self.assertTrue(module == missing or module.startswith(f"{missing}."), missing)
            importlib.import_module(missing.rpartition(".")[0])  # the package above it is carried

    @pytest.mark.slow
    def test_run_as_main(self):
        """``python -m monai.bundle run`` (upstream's bundle command line) names the module, not ``__main__``."""
        done = subprocess.run([sys.executable, "-m", "monai.bundle", "run"], cwd=ROOT, env=child_env(),
                              capture_output=True, text=True, timeout=300)
        self.assertNotEqual(done.returncode, 0)
        self.assertRegex(done.stderr.splitlines()[-1], r"^ImportError: 'monai\.bundle' is not part of this fork\. ")

    def test_record(self):
        self.assertIn("monai.networks.nets.vista3d", RECORD["submodules"])
        self.assertGreater(len(RECORD["submodules"]), 400)


class TestVista3dPackageNames(unittest.TestCase):
    """``monai.apps.vista3d`` lists the names users call; each is the object its room defines."""

    def test_public_names(self):
        import monai.apps.vista3d as app

        self.assertEqual(set(app.__all__), {"point_based_window_inferer", *app._ROOMS})
        self.assertEqual(len(app.__all__), len(set(app.__all__)))
        for name, room in app._ROOMS.items():
            self.assertIs(import_name("monai.apps.vista3d", name),
                          getattr(importlib.import_module(f"monai.apps.vista3d.{room}"), name), name)

    def test_no_names_of_other_rooms(self):
        with self.assertRaises(ImportError):  # a room's own name is imported from the room
            import_name("monai.apps.vista3d", "check_roi_size")

    def test_unknown_name(self):
        with self.assertRaisesRegex(ImportError, r"'monai.apps.vista3d.NoSuchThing' is not part of this fork"):
            import_name("monai.apps.vista3d", "NoSuchThing")


if __name__ == "__main__":
    unittest.main()
