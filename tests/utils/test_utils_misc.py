import importlib
import importlib.util
import unittest

import torch
from parameterized import parameterized

import monai
from monai.utils import (
    BlendMode,
    OptionalImportError,
    ensure_tuple,
    ensure_tuple_rep,
    fall_back_tuple,
    has_option,
    look_up_option,
    optional_import,
    unsqueeze_left,
    unsqueeze_right,
)


class TestMiscHelpers(unittest.TestCase):
    @parameterized.expand(
        [
            [(-1, 8, None), (32, 16, 4), (32, 8, 4)],
            [(0, 0, 5), (1, 2, 3), (1, 2, 5)],
            [7, (1, 2, 3), (7, 7, 7)],
        ]
    )
    def test_fall_back_tuple(self, user, default, expected):
        self.assertEqual(fall_back_tuple(user, default), expected)

    def test_ensure_tuple(self):
        self.assertEqual(ensure_tuple(3), (3,))
        self.assertEqual(ensure_tuple("ab"), ("ab",))
        self.assertEqual(ensure_tuple([1, 2]), (1, 2))
        self.assertEqual(ensure_tuple_rep(0.5, 3), (0.5, 0.5, 0.5))
        self.assertEqual(ensure_tuple_rep(torch.tensor([1, 2]), 2), (1, 2))
        with self.assertRaises(ValueError):
            ensure_tuple_rep((1, 2), 3)

    def test_look_up_option(self):
        self.assertIs(look_up_option("gaussian", BlendMode), BlendMode.GAUSSIAN)
        self.assertEqual(look_up_option(" a ", {"a": 1}), 1)
        self.assertEqual(look_up_option("x", ("a",), default="a"), "a")
        with self.assertRaisesRegex(ValueError, "Available options"):
            look_up_option("triangle", BlendMode)

    def test_has_option(self):
        def f(a, b=1):
            return a + b

        self.assertTrue(has_option(f, "b"))
        self.assertFalse(has_option(f, ["a", "c"]))

    def test_unsqueeze(self):
        x = torch.zeros(2, 3)
        self.assertEqual(unsqueeze_right(x, 4).shape, (2, 3, 1, 1))
        self.assertEqual(unsqueeze_left(x, 4).shape, (1, 1, 2, 3))


class TestModules(unittest.TestCase):
    def test_optional_import(self):
        mod, ok = optional_import("math")
        self.assertTrue(ok)
        self.assertEqual(mod.sqrt(4.0), 2.0)
        missing, ok = optional_import("a_module_that_does_not_exist")
        self.assertFalse(ok)
        with self.assertRaisesRegex(OptionalImportError, "a_module_that_does_not_exist"):
            missing.anything()
        _, ok = optional_import("math", name="not_there")
        self.assertFalse(ok)

    @parameterized.expand([["monai.bundle"], ["monai.data.meta_tensor"], ["monai.engines"]])
    def test_not_carried_module(self, name):
        with self.assertRaisesRegex(ImportError, "not part of this fork.*upstream MONAI"):
            __import__(name)

    def test_not_carried_name(self):
        with self.assertRaisesRegex(ImportError, "monai.transforms.Compose.*not part of this fork"):
            from monai.transforms import Compose  # noqa: F401

    @parameterized.expand([["monai.apps.vista3d.transforms"], ["monai.apps.vista3d.sampler"], ["monai.apps.detection"],
                           ["monai.networks.nets.swin_unetr"]])
    def test_any_missing_module_names_the_fork(self, name):
        with self.assertRaisesRegex(ImportError, f"'{name}' is not part of this fork.*upstream MONAI"):
            importlib.import_module(name)

    @parameterized.expand([["monai.networks.nets", "SegResNet"], ["monai.networks.nets", "SwinUNETR"],
                           ["monai.apps", "download_url"], ["monai.inferers", "DiffusionInferer"]])
    def test_any_missing_name_names_the_fork(self, module, name):
        with self.assertRaisesRegex(ImportError, f"'{module}.{name}' is not part of this fork.*upstream MONAI"):
            exec(f"from {module} import {name}", {})

    def test_package_getattr(self):
        """A carried package's ``__getattr__``: its submodules on first use, upstream's other public names refused,
        private and non-identifier names missing as usual (``getattr`` with a default answers it)."""
        import monai.networks

        self.assertIs(getattr(monai.networks, "nets"), importlib.import_module("monai.networks.nets"))
        self.assertEqual(monai.networks.nets.VISTA3D.__name__, "VISTA3D")
        for name in ("_private", "a.b", "nets.VISTA3D"):
            self.assertIsNone(getattr(monai.networks, name, None))
        with self.assertRaisesRegex(ImportError, r"^'monai.networks.eval_mode' is not part of this fork"):
            getattr(monai.networks, "eval_mode", None)  # one line that says why, not a silent None

    def test_carried_modules_still_import(self):
        from monai.networks.nets import VISTA3D, vista3d132  # noqa: F401
        from monai.transforms import utils  # noqa: F401

        self.assertIsNone(importlib.util.find_spec("not_monai_at_all"))

    def test_version(self):
        self.assertTrue(monai.__version__.startswith("1.6.1+"))


if __name__ == "__main__":
    unittest.main()
