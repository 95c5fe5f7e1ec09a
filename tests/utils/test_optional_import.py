"""optional_import with MONAI 1.6.1's arguments: version checks, an attribute, the stand-in's forms."""

from __future__ import annotations

import sys
import tempfile
import types
import unittest
from pathlib import Path

from parameterized import parameterized

from monai.utils import OptionalImportError, exact_version, min_version, optional_import


def _module(version: str) -> types.ModuleType:
    mod = types.ModuleType("fake")
    mod.__version__ = version
    return mod


class TestMinVersion(unittest.TestCase):
    @parameterized.expand(
        [
            ["newer_minor", "2.13.0", "2.4", True],
            ["older", "1.9.1", "2.0", False],
            ["local_suffix", "2.13.0+cpu", "2.13", True],
            ["patch_ignored", "2.4.0", "2.4.9", True],  # as in MONAI 1.6.1: major and minor only
            ["pre_release", "2.5.0rc1", "2.5", True],
            ["empty_requirement", "0.1", "", True],
        ]
    )
    def test_compare(self, _, have, need, expected):
        self.assertEqual(min_version(_module(have), need), expected)

    @parameterized.expand([["word", "test"], ["letters", "1.x"]])
    def test_malformed_requirement(self, _, need):
        with self.assertRaises(ValueError):
            min_version(_module("1.0"), need)

    def test_exact_version(self):
        self.assertTrue(exact_version(_module("1.2.3"), "1.2.3"))
        self.assertFalse(exact_version(_module("1.2.3"), "1.2"))
        self.assertFalse(exact_version(types.ModuleType("no_version"), "1.2"))


class TestOptionalImport(unittest.TestCase):
    def test_found_with_attribute(self):
        sqrt, ok = optional_import("math", name="sqrt")
        self.assertTrue(ok)
        self.assertEqual(sqrt(9.0), 3.0)

    @parameterized.expand([["no_module", "not_a_module_here", ""], ["attribute_path", "math.sqrt", ""],
                           ["no_attribute", "math", "not_there"]])
    def test_missing(self, _, module, name):
        obj, ok = optional_import(module, name=name)
        self.assertFalse(ok)
        with self.assertRaisesRegex(OptionalImportError, module):
            obj.anything

    def test_version_too_new(self):
        torch_, ok = optional_import("torch", "99.0")
        self.assertFalse(ok)
        with self.assertRaisesRegex(OptionalImportError, r"requires 'torch 99.0' by 'min_version'"):
            torch_.nn

    def test_exact_version_checker_positional(self):
        # the third positional argument is the version checker, as upstream
        _, ok = optional_import("torch", "0", exact_version)
        self.assertFalse(ok)

    def test_malformed_version_raises(self):
        with self.assertRaises(ValueError):
            optional_import("torch", "test")

    def test_version_args(self):
        seen = []

        def checker(module, version, extra):
            seen.append((module.__name__, version, extra))
            return True

        nn, ok = optional_import("torch", "1.1", checker, "nn", version_args={"k": 1})
        self.assertTrue(ok)
        self.assertEqual(seen, [("torch", "1.1", {"k": 1})])
        self.assertTrue(hasattr(nn, "Module"))

    def test_descriptor(self):
        obj, _ = optional_import("not_a_module_here", descriptor="Install it for {}")
        with self.assertRaisesRegex(OptionalImportError, "^Install it for import not_a_module_here"):
            obj()

    def test_as_base_class(self):
        base, ok = optional_import("not_a_module_here", name="Base", as_type="base")
        self.assertFalse(ok)

        class Child(base):
            pass

        with self.assertRaises(OptionalImportError):
            Child()

    def test_as_decorator(self):
        deco, ok = optional_import("not_a_module_here", name="wrap", as_type="decorator")
        self.assertFalse(ok)
        made = deco()  # building the decorator works; applying it raises
        with self.assertRaises(OptionalImportError):
            made(lambda: None)

    def test_namespace_package(self):
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "ns_pkg_for_test").mkdir()
            sys.path.insert(0, tmp)
            try:
                _, ok = optional_import("ns_pkg_for_test")
                self.assertFalse(ok)
                mod, ok = optional_import("ns_pkg_for_test", allow_namespace_pkg=True)
                self.assertTrue(ok)
            finally:
                sys.path.remove(tmp)
                sys.modules.pop("ns_pkg_for_test", None)


if __name__ == "__main__":
    unittest.main()
