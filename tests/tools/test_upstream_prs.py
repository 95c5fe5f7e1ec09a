"""tools/upstream_prs: the edits on a small tree shaped like the touched upstream files, the branches, the report.

The tree below is written here (not upstream's code): it has the classes, functions and statements the edits look
for, with our own bodies, so that the edits can be applied, run and diffed without an upstream checkout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import shutil
import sys
import tempfile
import types
import unittest
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from parameterized import parameterized
from scipy import ndimage

from tools.upstream_prs import build, clicks_prs, edits, prs, timing_pr, writeups

VISTA3D_PY = '''
import numpy as np
import torch
from torch import nn


def vista3d132(feature_size: int = 4):
    """A stand-in of the factory."""
    return VISTA3D(nn.Identity(), ClassMappingClassify(4, feature_size), PointMappingSAM(feature_size))


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
        self.tokens = nn.ModuleList([nn.Embedding(1, feature_size), nn.Embedding(2, feature_size)])
        self.extra = nn.Embedding(3, feature_size)
        self.pe_layer = PositionEmbeddingRandom(feature_size)
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


class PositionEmbeddingRandom(nn.Module):
    def __init__(self, n: int = 4, scale: float = 2.0) -> None:
        super().__init__()
        self.register_buffer("frequencies", scale * torch.randn((3, n)))
'''

SEGRESNET_DS_PY = """
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
"""

INFERER_PY = '''
from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = ["SlidingWindowInferer", "SlidingWindowInfererAdapt"]


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
        self.sw_device = None

    def __call__(self, inputs: torch.Tensor, network: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return sliding_window_inference(inputs, self.roi_size, self.sw_batch_size, network, *args, **kwargs)


class SlidingWindowInfererAdapt(SlidingWindowInferer):
    def __call__(self, inputs: torch.Tensor, network: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return super().__call__(inputs, network, *args, **kwargs)
'''

INFERERS_INIT_PY = """
from __future__ import annotations

from .inferer import SlidingWindowInferer, SlidingWindowInfererAdapt
"""

INFERERS_RST = """
Inferers
--------

Sliding Window Inference Function
---------------------------------

.. autofunction:: monai.inferers.sliding_window_inference
"""

VISTA3D_INFERER_PY = '''
from __future__ import annotations

from typing import Any

import torch

__all__ = ["point_based_window_inferer"]


def point_based_window_inferer(
    inputs: torch.Tensor,
    predictor: Any,
    prev_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """Runs ``predictor`` on the first half of the last axis (a stand-in).

    Args:
        inputs: the image.
        predictor: the network.
        prev_mask: logits of the voxels no window covers.
    """
    half = inputs.shape[-1] // 2
    total = torch.zeros(inputs.shape, device="cpu")
    covered = torch.zeros(inputs.shape, device="cpu")
    total[..., :half] += predictor(inputs[..., :half], **kwargs).to("cpu")
    covered[..., :half] = 1
    total = total / covered
    if prev_mask is not None:
        prev_mask = prev_mask.to("cpu")
        total[covered < 1] = prev_mask[covered < 1]
    return total
'''

TRANSFORMS_UTILS_PY = """
from __future__ import annotations

import itertools

import numpy as np
import torch
from scipy import ndimage

__all__ = ["get_largest_connected_component_mask", "keep_merge_components_with_points"]

use_cp = False


def convert_data_type(x, kind):
    return (x.numpy() if isinstance(x, torch.Tensor) else x,)


def get_largest_connected_component_mask(img):
    return img


def keep_merge_components_with_points(img_pos, img_neg):
    if use_cp:
        lib = None
    else:
        img_pos_, *_ = convert_data_type(img_pos, np.ndarray)
        label = ndimage.label
        lib = np
    features, _ = label(img_pos_)
    outs = np.zeros_like(img_pos_)
    outs[features > 0] = 1
    return outs


def keep_components_with_positive_points(img):
    for c in range(img.shape[0]):
        img_ = img[c] > 0
        img_, *_ = convert_data_type(img_, np.ndarray)
        features, _ = ndimage.label(img_)
        pos_mask = torch.from_numpy(img_) > 0
        features = torch.from_numpy(features).to(img.device)
        img[c][pos_mask & (features != 1)] = 0
    return img
"""

TREE = {
    prs.VISTA3D: VISTA3D_PY,
    prs.SEGRESNET_DS: SEGRESNET_DS_PY,
    timing_pr.INFERER: INFERER_PY,
    timing_pr.INFERERS_INIT: INFERERS_INIT_PY,
    timing_pr.INFERERS_RST: INFERERS_RST,
    clicks_prs.VISTA3D_INFERER: VISTA3D_INFERER_PY,
    clicks_prs.TRANSFORMS_UTILS: TRANSFORMS_UTILS_PY,
    "monai/__init__.py": "",
}
AUTHOR = ["--author", "A Tester <tester@example.com>"]
# the synthetic tree has no formatter config: whatever black, isort or ruff this environment has stays out of it
NO_FORMATTERS = mock.patch.object(build, "has_module", return_value=False)


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text.lstrip("\n"))


def load(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, name, "exec"), module.__dict__)
    return module


def pr_named(branch: str) -> prs.PR:
    return next(p for p in prs.PRS if p.branch == branch)


def edited(rel: str, branch: str) -> str:
    return pr_named(branch).edits[rel](TREE[rel].lstrip("\n"))


class TestEdits(unittest.TestCase):
    def test_find_def_and_missing_name(self):
        self.assertEqual(edits.find_def(VISTA3D_PY, "PointMappingSAM.forward").name, "forward")
        with self.assertRaisesRegex(edits.EditError, "VISTA3D.missing not found"):
            edits.find_def(VISTA3D_PY, "VISTA3D.missing")

    @parameterized.expand([(1, 1), (1, 3), (4, 1), (4, 3)])
    def test_class_head_reshape_runs_for_one_class_and_one_channel(self, n_classes, channels):
        source = edited(prs.VISTA3D, "vista3d-class-head-single-channel")
        self.assertIn("class_embedding.reshape(-1, c) @ src.view", source)
        head = load(source, "vista3d_head").ClassMappingClassify(8, channels)
        src = torch.randn(2, channels, 3, 2, 2)
        logits, _ = head(src, torch.arange(n_classes).view(-1, 1))
        emb = head.class_embeddings.weight[:n_classes]
        torch.testing.assert_close(logits, torch.einsum("kc,wchxy->kwhxy", emb, src))

    def test_release_cached_memory_keeps_the_calls_by_default(self):
        module = load(edited(prs.VISTA3D, "vista3d-release-cached-memory-option"), "vista3d_cache")
        encoder = lambda x: (x, x)  # noqa: E731
        with mock.patch("torch.cuda.empty_cache") as calls:
            net = module.VISTA3D(encoder, module.ClassMappingClassify(4, 1), module.PointMappingSAM(1))
            self.assertTrue(net.release_cached_memory and net.point_head.release_cached_memory)
            net(torch.ones(1, 1, 2, 2, 2), point_coords=torch.ones(3, 1, 3))
            self.assertEqual(calls.call_count, 1 + 1 + 2)  # the network's, the point head's, one per chunk of 2
            net.release_cached_memory = False
            self.assertFalse(net.point_head.release_cached_memory)
            net(torch.ones(1, 1, 2, 2, 2), point_coords=torch.ones(3, 1, 3))
            self.assertEqual(calls.call_count, 4)
        point_head = module.PointMappingSAM(1)
        module.VISTA3D(encoder, torch.nn.Identity(), point_head, release_cached_memory=False)
        self.assertFalse(point_head.release_cached_memory)

    def test_shared_bottleneck(self):
        source = edited(prs.SEGRESNET_DS, "segresnetds2-shared-bottleneck")
        self.assertNotIn("clone", source)
        self.assertIn("        x_ = x\n", source)
        point, auto = load(source, "segresnet").SegResNetDS2()(torch.arange(3.0))
        torch.testing.assert_close((point[0], auto[0]), (torch.arange(3.0) * 2, torch.arange(3.0) + 1))

    def test_timing_option(self):
        source = edited(timing_pr.INFERER, "inferer-sliding-window-timing")
        self.assertLess(source.index("import time"), source.index("import warnings"))
        self.assertIn(
            '__all__ = ["SlidingWindowInferer", "SlidingWindowInfererAdapt", "format_window_timings"]', source
        )
        module = load(source, "inferer_timing")
        calls = []

        def net(x):
            calls.append(x.shape[0])
            return x * 3

        x = torch.rand(1, 1, 10)
        timed = module.SlidingWindowInfererAdapt(2, 2, timing=True)
        with mock.patch("torch.cuda.synchronize") as synchronize:
            out = timed(x, net)
        torch.testing.assert_close(out, x * 3)
        t = timed.timings
        self.assertEqual((t["windows"], t["batches"], t["sync"], t["synchronized"]), (5, 3, 0.0, []))
        self.assertEqual((calls, synchronize.call_count), ([2, 2, 1], 0))  # CPU windows: nothing synchronised
        self.assertIn("| sync 0.0 ms | windows 5, batches 3, sw_batch_size 2", module.format_window_timings(t))
        plain = module.SlidingWindowInferer(2, 2)
        torch.testing.assert_close(plain(x, net), out)
        self.assertEqual(plain.timings, {})

    def test_timing_sync_cost_is_counted_for_a_cuda_window_device(self):
        module = load(edited(timing_pr.INFERER, "inferer-sliding-window-timing"), "inferer_sync")
        clock = iter(float(i) for i in range(100))
        with mock.patch("torch.cuda.synchronize") as synchronize, mock.patch.object(
            module.time, "perf_counter", side_effect=lambda: next(clock)
        ):
            timer = module._WindowTimer(lambda x: x, 2, torch.device("cuda", 1))
            timer(torch.zeros(2, 1))
            t = timer.finish()
        self.assertEqual([c.args for c in synchronize.call_args_list], [(torch.device("cuda", 1),)] * 4)
        # clock ticks: 0 the sync before the pass (not the pass's), 1 start, 2-3 the sync before the call, 4 forward
        # starts, 5 the network's own sync (charged to forward, not to sync), 6 forward ends, 7-8 the last sync, 9 end
        self.assertEqual((t["synchronized"], t["sync"], t["windows"]), (["cuda:1"], 2.0, 2))
        self.assertEqual((t["forward"], t["total"]), (2.0, 8.0))

    def test_timing_exported_and_documented(self):
        init = edited(timing_pr.INFERERS_INIT, "inferer-sliding-window-timing")
        self.assertIn(
            "from .inferer import SlidingWindowInferer, SlidingWindowInfererAdapt, format_window_timings", init
        )
        rst = edited(timing_pr.INFERERS_RST, "inferer-sliding-window-timing")
        self.assertIn("sliding_window_inference\n\n.. autofunction:: monai.inferers.format_window_timings\n", rst)

    def test_point_inferer_device(self):
        source = edited(clicks_prs.VISTA3D_INFERER, "vista3d-point-inferer-device")
        self.assertEqual(source.count('"cpu"'), 1)  # only the default of stitch_device
        module = load(source, "point_inferer")
        seen = []

        def net(x, **kwargs):
            seen.append(kwargs)
            return x * 2

        x, prev = torch.rand(1, 1, 4, 6), torch.rand(1, 1, 4, 6)
        expected = torch.cat([x[..., :3] * 2, prev[..., 3:]], dim=-1)
        for device in (None, "cpu", torch.device("cpu")):
            out = module.point_based_window_inferer(x, net, prev_mask=prev, device=device, flag=1)
            torch.testing.assert_close(out, expected, rtol=0, atol=0)
        self.assertEqual(seen, [{"flag": 1}] * 3)  # device= is the inferer's, not handed to the network

    @parameterized.expand(
        [((40,), 1), ((17, 23), 1), ((17, 23), 2), ((9, 10, 11), 1), ((9, 10, 11), 3), ((1, 12, 1, 9), 2)]
    )
    def test_labeller_numbers_components_as_scipy(self, shape, connectivity):
        module = load(edited(clicks_prs.TRANSFORMS_UTILS, "transforms-connected-components-on-device"), "utils_cc")
        mask = np.random.RandomState(len(shape) + connectivity).rand(*shape) < 0.45
        structure = ndimage.generate_binary_structure(mask.ndim, connectivity)
        expected, num = ndimage.label(mask, structure=structure)
        labels, n = module.label_connected_components(torch.as_tensor(mask), connectivity, return_num=True)
        self.assertEqual(n, num)
        np.testing.assert_array_equal(labels.numpy(), expected)

    def test_click_post_processing_keeps_the_cpu_path(self):
        source = edited(clicks_prs.TRANSFORMS_UTILS, "transforms-connected-components-on-device")
        self.assertLess(
            source.index('elif isinstance(img_pos, torch.Tensor) and img_pos.device.type != "cpu"'),
            source.index("    else:\n        img_pos_, *_"),
        )
        self.assertIn("outs = lib.zeros_like(img_pos_)", source)
        self.assertIn(
            '__all__ = ["get_largest_connected_component_mask", "keep_merge_components_with_points", '
            '"label_connected_components"]',
            source,
        )
        module = load(source, "utils_paths")
        mask = torch.as_tensor(np.random.RandomState(0).rand(6, 7, 8) < 0.5)
        np.testing.assert_array_equal(module.keep_merge_components_with_points(mask, mask), mask.numpy())
        img = torch.randn(2, 9, 9)
        expected = img.clone()
        for c in range(2):
            features, _ = ndimage.label(expected[c].numpy() > 0)
            expected[c][torch.as_tensor((features > 1))] = 0
        torch.testing.assert_close(module.keep_components_with_positive_points(img), expected)

    def test_meta_build_draws_nothing_and_the_same_values_elsewhere(self):
        module = load(edited(prs.VISTA3D, "vista3d-meta-device-build"), "vista3d_meta")
        no_draws = mock.patch("torch.randn", side_effect=AssertionError("drawn on meta"))
        with no_draws, mock.patch("torch.nn.init.normal_", side_effect=AssertionError("drawn on meta")):
            with torch.device("meta"):
                net = module.vista3d132()
        self.assertTrue(all(p.is_meta for p in net.state_dict().values()))
        torch.manual_seed(1)
        new = module.vista3d132().state_dict()
        plain_module = load(VISTA3D_PY.lstrip("\n"), "vista3d_plain")
        torch.manual_seed(1)
        plain = plain_module.vista3d132().state_dict()
        self.assertEqual(list(new), list(plain))
        for name in new:
            self.assertTrue(torch.equal(new[name], plain[name]), name)

    @parameterized.expand(
        [
            (
                "vista3d-class-head-single-channel",
                prs.VISTA3D,
                ".squeeze()",
                ".flatten(0, 1)",
                "has no call of squeeze",
            ),
            (
                "vista3d-release-cached-memory-option",
                prs.VISTA3D,
                "def forward(self, out,",
                "def run(self, out,",
                "PointMappingSAM.forward not found",
            ),
            (
                "segresnetds2-shared-bottleneck",
                prs.SEGRESNET_DS,
                "x.clone()",
                "x + 0",
                "conditional clone\\(\\) found 0 times",
            ),
            (
                "inferer-sliding-window-timing",
                timing_pr.INFERER,
                "return sliding_window_inference(",
                "return swi(",
                "no longer returns sliding_window_inference",
            ),
            (
                "vista3d-point-inferer-device",
                clicks_prs.VISTA3D_INFERER,
                '.to("cpu")',
                ".cpu()",
                "no longer stitches on the CPU",
            ),
            (
                "transforms-connected-components-on-device",
                clicks_prs.TRANSFORMS_UTILS,
                "if use_cp:",
                "if use_cupy:",
                "'if use_cp:' found 0 times",
            ),
            (
                "vista3d-meta-device-build",
                prs.VISTA3D,
                'register_buffer("frequencies"',
                'register_parameter("frequencies"',
                "register_buffer\\(...\\) found 0",
            ),
        ]
    )
    def test_moved_code_is_reported(self, branch, rel, old, new, message):
        self.assertIn(old, TREE[rel])
        with tempfile.TemporaryDirectory() as tmp:
            write_tree(Path(tmp), {**TREE, rel: TREE[rel].replace(old, new)})
            with self.assertRaisesRegex(edits.EditError, f"{rel}: .*{message}"):
                pr_named(branch).apply(Path(tmp))
            self.assertEqual((Path(tmp) / rel).read_text(), TREE[rel].replace(old, new).lstrip("\n"))  # untouched

    def test_add_parameter_wraps_long_signatures(self):
        names = ["a" * 30, "b" * 30, "c" * 30]
        src = f"def f(self, {names[0]}: int, {names[1]}: int, {names[2]}: int):\n    pass\n"
        out = edits.add_parameter(src, "f", "flag: bool = False")
        expected = ["def f(", "    self,", *(f"    {n}: int," for n in names), "    flag: bool = False,", "):"]
        self.assertEqual(out.splitlines()[:7], expected)
        self.assertEqual(
            edits.add_parameter("def g(a: int):\n    pass\n", "g", "b=1").splitlines()[0], "def g(a: int, b=1):"
        )
        with self.assertRaisesRegex(edits.EditError, "kwargs"):
            edits.add_parameter("def h(a, **kw):\n    pass\n", "h", "b=1")
        self.assertEqual(
            edits.add_parameter("def h(a, **kw):\n    pass\n", "h", "b=1", allow_kwargs=True).splitlines()[0],
            "def h(a, b=1, **kw):",
        )


@unittest.skipIf(shutil.which("git") is None, "the tool needs git")
class TestBuild(unittest.TestCase):
    """The whole tool on the synthetic tree: independent signed-off branches, write-ups checked, the report."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.src = Path(cls.tmp.name) / "monai-src"
        cls.older = Path(cls.tmp.name) / "older"  # another tree where one PR's function has moved
        write_tree(cls.src, TREE)
        write_tree(cls.older, {**TREE, prs.SEGRESNET_DS: SEGRESNET_DS_PY.replace("x.clone()", "x + 0")})
        (cls.older / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: monai\nVersion: 0.9.9\n")
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()), NO_FORMATTERS:
            cls.rc = build.main(["--monai-src", str(cls.src), "--also-apply", str(cls.older), *AUTHOR])
        cls.out = out.getvalue()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def git(self, *args):
        return build.git(self.src, *args)

    def test_branches_are_independent_signed_off_commits(self):
        self.assertEqual(self.rc, 0, self.out)
        base = self.git("rev-parse", "HEAD").strip()
        for pr in prs.PRS:
            self.assertEqual(self.git("rev-parse", f"{pr.branch}~1").strip(), base)  # each on the untouched tree
            message = self.git("log", "-1", "--format=%B", pr.branch)
            title = (prs.REPO / pr.writeup).read_text().splitlines()[0].lstrip("# ")
            self.assertEqual(message.splitlines()[0], title)
            self.assertIn("Signed-off-by: A Tester <tester@example.com>", message)
            self.assertEqual(
                self.git("log", "-1", "--format=%an <%ae>", pr.branch).strip(), "A Tester <tester@example.com>"
            )
        self.assertEqual(self.git("status", "--porcelain").strip(), "")  # the user's checkout is untouched

    def test_report_table(self):
        rows = {
            line.split(" | ")[0].lstrip("| "): line.split(" | ")
            for line in self.out.splitlines()
            if line.startswith("| ")
        }
        self.assertEqual(rows["branch"][1:3], ["applies on 0.9.9", "applies on monai-src"])
        for pr in prs.PRS:
            expected = "no" if pr.branch == "segresnetds2-shared-bottleneck" else "yes"
            self.assertEqual(rows[pr.branch][1:3], [expected, "yes"], pr.branch)
            self.assertEqual(rows[pr.branch][4], "yes")  # DCO
            for command in pr.measured:
                self.assertIn(command.replace("BRANCH", pr.branch), rows[pr.branch][-1])

    @parameterized.expand([(pr.branch,) for pr in prs.PRS])
    def test_writeup_names_only_what_the_diff_has(self, branch):
        pr = pr_named(branch)
        self.assertEqual(build.check_writeup(self.src, pr), [])
        changed = set(self.git("diff", "--name-only", f"{pr.branch}~1", pr.branch).split())
        self.assertTrue(set(pr.new_tests) <= changed and pr.new_tests, "each PR adds its own tests")
        self.assertFalse([f for f in changed if f.startswith("tests/benchmarks/")], "upstream has no tests/benchmarks")

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
    def test_run_tests_prints_one_line_per_kind(self, _, body, ok):
        pr = dataclasses.replace(prs.PRS[0], upstream_tests=("tests/test_tiny.py",))
        with tempfile.TemporaryDirectory() as helpers:  # stands for an upstream checkout's tests/ and the payload
            test = f"import unittest\n\n\nclass T(unittest.TestCase):\n    def test(self):\n        {body}\n"
            write_tree(Path(helpers), {"tests/__init__.py": "", "tests/test_tiny.py": test})
            out = io.StringIO()
            report = build.Report(pr)
            base = self.git("rev-parse", "HEAD").strip()
            new_tests = mock.patch.object(prs.PR, "new_tests", ("tests/test_tiny.py",))
            payload = mock.patch.object(prs.PR, "payload", Path(helpers))
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()), new_tests, payload:
                result = build.run_tests(self.src, pr, Path(helpers), sys.executable, report, base)
        self.assertEqual(result, ok)
        lines = out.getvalue().strip().splitlines()
        self.assertEqual(len(lines), 3)
        for kind, line in zip(("upstream", "new"), lines, strict=False):
            self.assertTrue(line.startswith(f"{pr.branch}: {kind} tests tests/test_tiny.py: Ran 1 test"), line)
            self.assertTrue(line.endswith("passed" if ok else "failed"), line)
        self.assertTrue(report.upstream_tests.startswith("Ran 1 test"))
        # the same test on the untouched tree: a test that passes there would test nothing the PR changes
        self.assertEqual(lines[2], f"{pr.branch}: new tests on the untouched tree: {report.new_tests_on_base}")
        self.assertTrue(report.new_tests_on_base.endswith("passed" if ok else "failed"))


@unittest.skipIf(shutil.which("git") is None, "the tool needs git")
class TestDoesNotApply(unittest.TestCase):
    def test_a_pr_that_does_not_apply_is_named_and_the_others_are_built(self):
        moved = {prs.VISTA3D: VISTA3D_PY.replace(".squeeze()", ".flatten(0, 1)")}
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "monai-src"
            write_tree(src, {**TREE, **moved})
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()), NO_FORMATTERS:
                rc = build.main(["--monai-src", str(src), *AUTHOR])
            branches = build.git(src, "branch", "--format=%(refname:short)").split()
        self.assertEqual(rc, 1)
        self.assertIn(
            "vista3d-class-head-single-channel: does not apply on monai-src: monai/networks/nets/vista3d.py: "
            "ClassMappingClassify.forward has no call of squeeze()",
            out.getvalue().splitlines(),
        )
        self.assertEqual(
            sorted(b for b in branches if b in {p.branch for p in prs.PRS}), sorted(p.branch for p in prs.PRS[1:])
        )


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
