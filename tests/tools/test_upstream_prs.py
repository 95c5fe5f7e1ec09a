"""tools/upstream_prs: the edits on a small tree shaped like the touched upstream files, the branches, the write-ups.

The tree below is written here (not upstream's code): it has the classes, functions and statements the edits look
for, so that the edits can be applied, run and diffed without an upstream checkout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import shutil
import sys
import tempfile
import textwrap
import types
import unittest
from pathlib import Path
from unittest import mock

import torch
from parameterized import parameterized

from tools.upstream_prs import build, edits, pr05, prs, writeups

VISTA3D_PY = '''
import numpy as np
import torch
from torch import nn


class VISTA3D(nn.Module):
    """A stand-in shaped like the upstream network.

    Args:
        image_encoder: the encoder.
        class_head: the class head.
        point_head: the point head.
    """

    def __init__(self, image_encoder: nn.Module, class_head: nn.Module, point_head: nn.Module):
        super().__init__()
        self.image_encoder = image_encoder
        self.class_head = class_head
        self.point_head = point_head

    def forward(self, x, class_vector=None, point_coords=None):
        out, out_auto = self.image_encoder(x)
        x = None
        # hand the cache back
        torch.cuda.empty_cache()
        if class_vector is not None:
            return self.class_head(out_auto, class_vector)[0]
        return self.point_head(out, point_coords)


class PointMappingSAM(nn.Module):
    def __init__(self, feature_size: int, max_prompt: int = 2):
        super().__init__()
        self.max_prompt = max_prompt

    def forward(self, out, point_coords):
        torch.cuda.empty_cache()
        masks = []
        for i in range(int(np.ceil(point_coords.shape[0] / self.max_prompt))):
            torch.cuda.empty_cache()
            masks.append(out.sum() + point_coords[i * self.max_prompt : (i + 1) * self.max_prompt].sum())
        return torch.stack(masks)


class ClassMappingClassify(nn.Module):
    def __init__(self, n_classes: int, feature_size: int):
        super().__init__()
        self.class_embeddings = nn.Embedding(n_classes, feature_size)

    def forward(self, src, class_vector):
        b, c, h, w, d = src.shape
        class_embedding = self.class_embeddings(class_vector)
        masks_embedding = class_embedding.squeeze() @ src.view(b, c, h * w * d)
        return masks_embedding.view(b, -1, h, w, d).transpose(0, 1), class_embedding
'''

SEGRESNET_DS_PY = '''
import torch
from torch import nn


class SegResNetDS2(nn.Module):
    def forward(self, x, with_point: bool = True, with_label: bool = True):
        outputs, outputs_auto = [], []
        x_ = x
        if with_point:
            if with_label:
                x_ = x.clone()
            outputs.append(x * 2)
        x = x_
        if with_label:
            outputs_auto.append(x + 1)
        return outputs, outputs_auto
'''

INFERER_PY = '''
from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)


def sliding_window_inference(inputs, roi_size, sw_batch_size, predictor, *args, **kwargs):
    """Windows along the last axis, ``sw_batch_size`` per call of ``predictor``."""
    windows = list(torch.split(inputs, roi_size, dim=-1))
    outs = []
    for i in range(0, len(windows), sw_batch_size):
        batch = torch.cat(windows[i : i + sw_batch_size])
        outs.extend(predictor(batch, *args, **kwargs).split(inputs.shape[0]))
    return torch.cat(outs, dim=-1)


class SlidingWindowInferer:
    """Windows along the last axis.

    Args:
        roi_size: window length.
        sw_batch_size: windows per network call.

    Note:
        a stand-in.
    """

    def __init__(self, roi_size: int, sw_batch_size: int = 1) -> None:
        self.roi_size = roi_size
        self.sw_batch_size = sw_batch_size

    def __call__(self, inputs: torch.Tensor, network: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return sliding_window_inference(inputs, self.roi_size, self.sw_batch_size, network, *args, **kwargs)


class SlidingWindowInfererAdapt(SlidingWindowInferer):
    def __call__(self, inputs: torch.Tensor, network: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return super().__call__(inputs, network, *args, **kwargs)
'''

VISTA3D_INFERER_PY = '''
from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from monai.data.meta_tensor import MetaTensor
from monai.utils import optional_import

tqdm, _ = optional_import("tqdm", name="tqdm")

__all__ = ["point_based_window_inferer"]


def point_based_window_inferer(inputs: torch.Tensor, roi_size: Sequence[int], predictor: Any) -> torch.Tensor:
    """Runs ``predictor`` on the window at the origin (a stand-in)."""
    window = copy.copy(inputs)[(slice(None), slice(None), *(slice(0, r) for r in roi_size))]
    return predictor(window)


def _pad_previous_mask(inputs: torch.Tensor, roi_size: Sequence[int]) -> torch.Tensor:
    return inputs
'''

TREE = {
    prs.VISTA3D: VISTA3D_PY,
    prs.SEGRESNET_DS: SEGRESNET_DS_PY,
    prs.INFERER: INFERER_PY,
    pr05.VISTA3D_INFERER: VISTA3D_INFERER_PY,
    "monai/__init__.py": "",
}


def _window_starts(size: int, roi: int, interval: int) -> list[int]:
    return sorted({*range(0, size - roi, interval), size - roi})


def stand_in_modules() -> dict[str, types.ModuleType]:
    """The upstream helpers PR 05's function imports, written here in a few lines each (our own, not upstream's)."""

    def dense_patch_slices(image_size, roi_size, interval):
        starts = [_window_starts(s, r, i) for s, r, i in zip(image_size, roi_size, interval)]
        return [tuple(slice(a, a + r) for a, r in zip(st, roi_size)) for st in itertools.product(*starts)]

    def compute_importance_map(size, mode, sigma_scale, device, dtype):
        weight = torch.ones(size, dtype=torch.float64)
        if mode == "gaussian":
            for d, n in enumerate(size):
                x = torch.arange(n, dtype=torch.float64) - (n - 1) / 2
                shape = [1] * len(size)
                shape[d] = n
                weight = weight * torch.exp(-(x / (sigma_scale * n)) ** 2 / 2).reshape(shape)
        return weight.to(device=device, dtype=dtype)

    def scan_interval(image_size, roi_size, num_spatial_dims, overlap):
        return tuple(r if r == s else max(int(r * (1 - o)), 1) for s, r, o in zip(image_size, roi_size, overlap))

    def ensure_tuple_rep(x, n):
        return tuple(x) if isinstance(x, (list, tuple)) else (x,) * n

    def fall_back_tuple(user, default):
        return tuple(u if u and u > 0 else d for u, d in zip(ensure_tuple_rep(user, len(default)), default))

    names = {
        "monai.data.meta_tensor": {"MetaTensor": type("MetaTensor", (), {})},
        "monai.data.utils": {"dense_patch_slices": dense_patch_slices, "compute_importance_map": compute_importance_map},
        "monai.inferers.utils": {"_get_scan_interval": scan_interval},
        "monai.utils": {
            "BlendMode": types.SimpleNamespace(CONSTANT="constant"),
            "PytorchPadMode": types.SimpleNamespace(CONSTANT="constant"),
            "ensure_tuple_rep": ensure_tuple_rep,
            "fall_back_tuple": fall_back_tuple,
            "look_up_option": lambda option, supported: option,
            "optional_import": lambda *args, **kwargs: (None, False),
        },
    }
    return {m: types.SimpleNamespace(**attrs) for m, attrs in names.items()}  # type: ignore[misc]


def blended_labels(inputs, roi_size, sw_batch_size, predictor, overlap, mode, label_prompt):
    """The reference for PR 05: blend the logits of every class over the whole volume, then take the labels."""
    helpers = stand_in_modules()
    size = inputs.shape[2:]
    plan = helpers["monai.data.utils"].dense_patch_slices(
        size, roi_size, helpers["monai.inferers.utils"]._get_scan_interval(size, roi_size, len(size), overlap)
    )
    weight = helpers["monai.data.utils"].compute_importance_map(roi_size, mode, 0.125, "cpu", inputs.dtype)
    total = count = None
    for start in range(0, len(plan), sw_batch_size):
        windows = plan[start : start + sw_batch_size]
        logits = predictor(torch.cat([inputs[(slice(None), slice(None), *w)] for w in windows]))
        if total is None:
            total = torch.zeros((logits.shape[1], *size), dtype=inputs.dtype)
            count = torch.zeros(size, dtype=inputs.dtype)
        for w, out in zip(windows, logits):
            total[(slice(None), *w)] += out * weight
            count[w] += weight
    best, channel = (total / count).max(dim=0)
    ids = torch.as_tensor(label_prompt or range(1, total.shape[0] + 1))
    return torch.where(best > 0, ids[channel], 0)


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text.lstrip("\n"))


def load(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, name, "exec"), module.__dict__)
    return module


def edited(rel: str, number: str) -> str:
    pr = next(p for p in prs.PRS if p.number == number)
    return pr.edits[rel](TREE[rel].lstrip("\n"))


class TestEdits(unittest.TestCase):
    def test_find_def_and_missing_name(self):
        self.assertEqual(edits.find_def(VISTA3D_PY, "PointMappingSAM.forward").name, "forward")
        with self.assertRaisesRegex(edits.EditError, "VISTA3D.missing not found"):
            edits.find_def(VISTA3D_PY, "VISTA3D.missing")

    @parameterized.expand([(1, 1), (1, 3), (4, 1), (4, 3)])
    def test_class_head_reshape_runs_for_one_class_and_one_channel(self, n_classes, channels):
        source = edited(prs.VISTA3D, "01")
        self.assertIn("class_embedding.reshape(-1, c) @ src.view", source)
        head = load(source, "vista3d_01").ClassMappingClassify(8, channels)
        src = torch.randn(2, channels, 3, 2, 2)
        logits, _ = head(src, torch.arange(n_classes).view(-1, 1))
        emb = head.class_embeddings.weight[:n_classes]
        expected = torch.einsum("kc,wchxy->kwhxy", emb, src)
        self.assertEqual(tuple(logits.shape), (n_classes, 2, 3, 2, 2))
        torch.testing.assert_close(logits, expected)

    def test_release_cached_memory_option(self):
        module = load(edited(prs.VISTA3D, "02"), "vista3d_02")
        calls = []
        original = torch.cuda.empty_cache
        torch.cuda.empty_cache = lambda: calls.append(1)
        try:
            encoder = lambda x: (x, x)  # noqa: E731
            net = module.VISTA3D(encoder, module.ClassMappingClassify(4, 1), module.PointMappingSAM(1))
            self.assertFalse(net.release_cached_memory)
            net(torch.ones(1, 1, 2, 2, 2), point_coords=torch.ones(3, 1, 3))
            self.assertEqual(calls, [])
            net.release_cached_memory = True
            self.assertTrue(net.point_head.release_cached_memory)
            net(torch.ones(1, 1, 2, 2, 2), point_coords=torch.ones(3, 1, 3))
            self.assertEqual(len(calls), 1 + 1 + 2)  # the network's, the point head's, one per chunk of 2 prompts
            point_head = module.PointMappingSAM(1)
            module.VISTA3D(encoder, torch.nn.Identity(), point_head, release_cached_memory=True)
            self.assertTrue(point_head.release_cached_memory)
        finally:
            torch.cuda.empty_cache = original
        self.assertIn("release_cached_memory: call ``torch.cuda.empty_cache()``", edited(prs.VISTA3D, "02"))

    def test_shared_bottleneck(self):
        source = edited(prs.SEGRESNET_DS, "02")
        self.assertNotIn("clone", source)
        net = load(source, "segresnet_02").SegResNetDS2()
        x = torch.arange(3.0)
        point, auto = net(x)
        torch.testing.assert_close(point[0], x * 2)
        torch.testing.assert_close(auto[0], x + 1)

    def test_timing_option(self):
        source = edited(prs.INFERER, "03")
        self.assertLess(source.index("import time"), source.index("import warnings"))
        module = load(source, "inferer_03")
        doc = module.SlidingWindowInferer.__doc__
        self.assertLess(doc.index("timing: after each call"), doc.index("Note:"))
        calls = []

        def net(x):
            calls.append(x.shape[0])
            return x * 3

        x = torch.rand(1, 1, 10)
        timed = module.SlidingWindowInfererAdapt(2, 2, timing=True)
        out = timed(x, net)
        torch.testing.assert_close(out, x * 3)
        self.assertEqual((timed.timings["windows"], timed.timings["batches"]), (5, 3))
        self.assertEqual(calls, [2, 2, 1])
        plain = module.SlidingWindowInferer(2, 2)
        torch.testing.assert_close(plain(x, net), out)
        self.assertEqual(plain.timings, {})

    @parameterized.expand(
        [
            ((1, 1, 13, 11, 10), (8, 8, 8), 3, 0.25, "constant", 4, None),
            ((2, 1, 17, 9, 12), (8, 6, 8), 4, 0.5, "gaussian", 3, [4, 9, 300]),
            ((1, 1, 19, 14), (8, 8), 2, 0.6, "constant", 1, [7]),
        ]
    )
    def test_label_inference_equals_blended_labels(self, shape, roi, batch, overlap, mode, classes, prompt):
        source = edited(pr05.VISTA3D_INFERER, "05")
        self.assertIn("import itertools\nfrom collections.abc import Callable, Sequence\n", source)
        self.assertIn("from monai.data.utils import compute_importance_map, dense_patch_slices\n", source)
        self.assertIn('__all__ = ["point_based_window_inferer", "sliding_window_label_inference"]', source)
        self.assertLess(source.index("def point_based_window_inferer"), source.index("def sliding_window_label"))
        with mock.patch.dict(sys.modules, stand_in_modules()):
            module = load(source, "vista3d_inferer_05")
        torch.manual_seed(0)
        conv = (torch.nn.Conv3d if len(shape) == 5 else torch.nn.Conv2d)(1, classes, 3, padding=1)
        inputs = torch.randn(*shape)
        with torch.no_grad():
            labels = module.sliding_window_label_inference(
                inputs, roi, batch, conv, overlap, mode, label_prompt=prompt
            )
            overlaps = (overlap,) * len(roi)
            expected = [blended_labels(x[None], roi, batch, conv, overlaps, mode, prompt) for x in inputs]
        self.assertEqual(labels.dtype, torch.int32 if prompt and max(prompt) > 255 else torch.uint8)
        expected = torch.stack(expected)
        self.assertGreater(len(torch.unique(expected)), 1)
        torch.testing.assert_close(labels[:, 0].long(), expected.long(), rtol=0, atol=0)

    @parameterized.expand(
        [
            ("01", prs.VISTA3D, "ClassMappingClassify.forward has no call of squeeze"),
            ("02", prs.SEGRESNET_DS, "SegResNetDS2.forward has no call of clone"),
            ("03", prs.INFERER, "no longer returns sliding_window_inference"),
            ("05", pr05.VISTA3D_INFERER, "point_based_window_inferer not found"),
            ("05", pr05.VISTA3D_INFERER, "no top-level '__all__ = \\[...\\]'"),
        ]
    )
    def test_moved_code_is_reported(self, number, rel, message):
        moved = {
            "01": VISTA3D_PY.replace(".squeeze()", ".flatten(0, 1)"),
            "02": SEGRESNET_DS_PY.replace("x.clone()", "x + 0"),
            "03": INFERER_PY.replace("return sliding_window_inference(", "return sliding_window_inference_v2("),
            "05": VISTA3D_INFERER_PY.replace("def point_based_window_inferer(", "def point_prompt_inferer(")
            if "not found" in message
            else VISTA3D_INFERER_PY.replace('["point_based_window_inferer"]', '("point_based_window_inferer",)'),
        }[number]
        with tempfile.TemporaryDirectory() as tmp:
            write_tree(Path(tmp), {**TREE, rel: moved})
            pr = next(p for p in prs.PRS if p.number == number)
            with self.assertRaisesRegex(edits.EditError, f"{rel}: .*{message}"):
                pr.apply(Path(tmp))

    def test_add_parameter_wraps_long_signatures(self):
        names = ["a" * 30, "b" * 30, "c" * 30]
        src = f"def f(self, {names[0]}: int, {names[1]}: int, {names[2]}: int):\n    pass\n"
        out = edits.add_parameter(src, "f", "flag: bool = False")
        expected = ["def f(", "    self,", *(f"    {n}: int," for n in names), "    flag: bool = False,", "):"]
        self.assertEqual(out.splitlines()[:7], expected)
        short = edits.add_parameter("def g(a: int):\n    pass\n", "g", "b=1")
        self.assertEqual(short.splitlines()[0], "def g(a: int, b=1):")


@unittest.skipIf(shutil.which("git") is None, "the tool needs git")
class TestBuild(unittest.TestCase):
    """The whole tool on the synthetic tree: stacked branches, one commit each, write-ups checked on the diffs."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.src = Path(cls.tmp.name) / "monai-src"
        write_tree(cls.src, TREE)
        cls.rc = build.main(["--monai-src", str(cls.src)])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def git(self, *args):
        return build.git(self.src, *args)

    def test_branches_are_stacked_single_commits(self):
        self.assertEqual(self.rc, 0)
        base = self.git("rev-list", "--max-parents=0", "HEAD").strip()
        parent = base
        for pr in prs.PRS:
            self.assertEqual(self.git("rev-parse", f"{pr.branch}~1").strip(), parent)
            title = (prs.REPO / pr.writeup).read_text().splitlines()[0].lstrip("# ")
            self.assertEqual(self.git("log", "-1", "--format=%s", pr.branch).strip(), title)
            parent = self.git("rev-parse", pr.branch).strip()
        self.assertEqual(self.git("status", "--porcelain").strip(), "")  # the user's checkout is untouched

    @parameterized.expand([(pr.number,) for pr in prs.PRS])
    def test_writeup_names_only_what_the_diff_has(self, number):
        pr = next(p for p in prs.PRS if p.number == number)
        self.assertEqual(build.check_writeup(self.src, pr), [])
        changed = set(self.git("diff", "--name-only", f"{pr.branch}~1", pr.branch).split())
        self.assertTrue([t for t in pr.tests if t in changed], "each PR adds its own tests")
        self.assertTrue([f for f in changed if f.startswith("tests/benchmarks/")], "each PR adds a benchmark")

    def test_writeup_check_catches_a_name_not_in_the_diff(self):
        pr = prs.PRS[0]
        text = (prs.REPO / pr.writeup).read_text() + "\nAlso `VISTA3D.fuse` and `monai/networks/nets/other.py`.\n"
        diff = self.git("diff", "--function-context", f"{pr.branch}~1", pr.branch)
        changed = set(self.git("diff", "--name-only", f"{pr.branch}~1", pr.branch).split())
        self.assertEqual(
            writeups.missing(text, diff, changed, pr.tests),
            [
                "file monai/networks/nets/other.py is not changed by the branch",
                "VISTA3D.fuse is not in the branch's diff",
            ],
        )


    @parameterized.expand([("passes", "self.assertEqual(1, 1)", True), ("fails", "self.assertEqual(1, 2)", False)])
    def test_run_tests_prints_one_line(self, _, body, ok):
        pr = dataclasses.replace(prs.PRS[0], tests=("tests/test_tiny.py",))
        with tempfile.TemporaryDirectory() as helpers:  # stands for an upstream checkout's tests/
            test = f"import unittest\n\n\nclass T(unittest.TestCase):\n    def test(self):\n        {body}\n"
            write_tree(Path(helpers), {"tests/__init__.py": "", "tests/test_tiny.py": test})
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                result = build.run_tests(self.src, pr, Path(helpers), sys.executable)
        self.assertEqual(result, ok)
        line = out.getvalue().strip()
        self.assertTrue(line.startswith("vista3d-pr-01: tests/test_tiny.py: Ran 1 test"), line)
        self.assertTrue(line.endswith("passed" if ok else "failed"), line)


@unittest.skipIf(shutil.which("git") is None, "the tool needs git")
class TestDoesNotApply(unittest.TestCase):
    def test_a_pr_that_does_not_apply_is_named(self):
        moved = {
            prs.VISTA3D: VISTA3D_PY.replace(".squeeze()", ".flatten(0, 1)"),
            pr05.VISTA3D_INFERER: VISTA3D_INFERER_PY.replace("point_based_window_inferer", "point_prompt_inferer"),
        }
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "monai-src"
            write_tree(src, {**TREE, **moved})
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = build.main(["--monai-src", str(src)])
            branches = build.git(src, "branch", "--format=%(refname:short)").split()
            base = build.git(src, "rev-list", "--max-parents=0", "HEAD").strip()
            parent_of_02 = build.git(src, "rev-parse", "vista3d-pr-02~1").strip()
        self.assertEqual(rc, 1)
        lines = out.getvalue().splitlines()
        self.assertIn(
            "vista3d-pr-01: PR 01 does not apply: monai/networks/nets/vista3d.py: ClassMappingClassify.forward has no "
            "call of squeeze(); later PRs are stacked without it",
            lines,
        )
        self.assertIn(
            "vista3d-pr-05: PR 05 does not apply: monai/apps/vista3d/inferer.py: point_based_window_inferer not "
            "found; later PRs are stacked without it",
            lines,
        )
        self.assertEqual(sorted(b for b in branches if b.startswith("vista3d-pr-")), ["vista3d-pr-02", "vista3d-pr-03"])
        self.assertEqual(parent_of_02, base)  # 02 stacked on the untouched tree, without 01


class TestWriteupChecks(unittest.TestCase):
    def test_named_items(self):
        text = "`monai/a/b.py`, `Foo.bar`, `baz()`, `x_y`, `Name`, `python run.py --x`, `True`, `[K, C]`, `k`"
        paths, names = writeups.named_items(text)
        self.assertEqual(paths, {"monai/a/b.py"})
        self.assertEqual(names, {"Foo.bar", "baz", "x_y", "Name"})

    def test_missing(self):
        diff = "+def bar():\n+    x_y = 1\n"
        problems = writeups.missing("`monai/a.py`, `Foo.bar`, `x_y`, `gone_name`", diff, {"monai/b.py"})
        expected = ["file monai/a.py is not changed by the branch", "gone_name is not in the branch's diff"]
        self.assertEqual(problems, expected)

    def test_summary(self):
        text = "# Title\n\n## What changes\n\nLine one.\nLine two.\n\n## Why\n\nnot this\n"
        self.assertEqual(writeups.summary(text), "Title\n\nLine one.\nLine two.\n")


if __name__ == "__main__":
    unittest.main()
