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
"""Gluon's names across Triton releases: they import wherever the installed Triton should ship them (a broken import
fails here instead of skipping every Gluon test), and a machine without Triton is told so."""

from __future__ import annotations

import importlib.util
import sys
import unittest
from unittest import mock

from parameterized import parameterized

import monai.utils.triton_support as triton_support
from monai.networks.kernels import conv3d_resident, gluon_compat
from monai.networks.kernels.gluon_compat import GLUON_EXPECTED_FROM, triton_release


def _load_fresh(name: str = "gluon_compat_fresh"):
    """gluon_compat imported again under another name (the real module is left as it is)."""
    spec = importlib.util.spec_from_file_location(name, gluon_compat.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TestGluonImports(unittest.TestCase):
    def test_gluon_imports_where_triton_ships_it(self):
        release = triton_release()
        if release is None:
            self.skipTest("Triton is not installed (an optional extra): the Gluon kernels are not offered")
        if release < GLUON_EXPECTED_FROM:
            self.skipTest(f"Triton {release} is older than the Gluon kernels ({GLUON_EXPECTED_FROM})")
        self.assertIsNone(gluon_compat.GLUON_MISSING, f"Triton {release} ships Gluon's Hopper API: the import broke")
        self.assertIsNone(conv3d_resident._GLUON_MISSING)
        tma = gluon_compat.tma
        for name in ("tma_load", "tma_store", "TensorDescriptor", "mbarrier", "warpgroup_mma", "NEW_REINTERPRET"):
            self.assertTrue(hasattr(conv3d_resident, name), name)
        self.assertTrue(callable(gluon_compat.ast_source()))
        if release >= (3, 9):  # the new names; the old ones raise there
            self.assertIs(gluon_compat.tma_load, tma.async_load)
            self.assertIs(gluon_compat.tma_store, tma.async_store)
            self.assertTrue(gluon_compat.NEW_REINTERPRET.value)
        else:
            self.assertFalse(gluon_compat.NEW_REINTERPRET.value)

    def test_broken_gluon_is_named(self):
        if triton_release() is None:
            self.skipTest("Triton is not installed (an optional extra)")
        with mock.patch.dict(sys.modules, {"triton.experimental.gluon.language.nvidia.hopper": None}):  # fails
            fresh = _load_fresh()
        self.assertRegex(fresh.GLUON_MISSING, r"^Triton \S+ has no usable Gluon \((ModuleNotFound|Import)Error: ")
        self.assertFalse(hasattr(fresh, "tma_load"))

    def test_without_triton(self):
        with mock.patch.object(triton_support, "triton", None):
            fresh = _load_fresh()
        self.assertEqual(fresh.GLUON_MISSING, "Triton is not installed (it ships with the CUDA builds of PyTorch)")
        self.assertIsNone(fresh.triton_release())

    @parameterized.expand([("3.9.0", (3, 9)), ("3.6.0+git4ab2b1c", (3, 6)), ("4.0.0rc1", (4, 0)), ("3.10.1", (3, 10))])
    def test_release(self, version, release):
        self.assertEqual(triton_release(version), release)


if __name__ == "__main__":
    unittest.main()
