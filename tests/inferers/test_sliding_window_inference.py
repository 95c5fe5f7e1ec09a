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
"""Arguments of sliding_window_inference and the window / weight-map helpers."""

from __future__ import annotations

import io
import unittest
from unittest import mock

import torch
import torch.nn.functional as F
from parameterized import parameterized

import monai.inferers.sliding_window as swi
from monai.inferers import (
    compute_importance_map,
    dense_patch_slices,
    get_scan_interval,
    get_valid_patch_size,
    plan_sliding_windows,
    sliding_window_inference,
)


def _scale(w: torch.Tensor) -> torch.Tensor:
    return w * 2 + 1


def _coverage(shape, roi, overlap, mode="constant", sigma=0.125):
    """Reference blend computed voxel by voxel from the plan: sum(w * f(x)) / sum(w)."""
    x = torch.arange(float(torch.tensor(shape).prod())).reshape(shape) / 100
    plan = plan_sliding_windows(shape[2:], roi, overlap, shape[0])
    w = compute_importance_map(plan.roi_size, mode, sigma)
    num, den = torch.zeros(shape), torch.zeros((1, 1, *shape[2:]))
    xp = F.pad(x, plan.pad_size)
    for sl in plan.slices:
        num[(slice(None), slice(None), *sl)] += _scale(xp[(slice(None), slice(None), *sl)]) * w
        den[(slice(None), slice(None), *sl)] += w
    return x, num / den


SHAPE_CASES = [
    # name, input shape, roi_size, sw_batch_size, overlap, mode
    ("int_roi_3d", (1, 1, 12, 10, 9), 6, 3, 0.5, "constant"),
    ("seq_roi_3d", (2, 3, 12, 10, 9), (5, 6, 4), 4, 0.25, "gaussian"),
    ("minus_one", (1, 2, 12, 10, 9), (-1, 6, 4), 2, 0.5, "gaussian"),
    ("none_entry", (1, 1, 12, 10, 9), (None, 6, 4), 2, 0.5, "constant"),
    ("roi_none", (1, 1, 12, 10, 9), None, 1, 0.5, "constant"),
    ("per_dim_overlap", (1, 1, 12, 10, 9), (5, 6, 4), 3, (0.0, 0.5, 0.7), "gaussian"),
    ("2d", (2, 1, 15, 11), (6, 5), 5, 0.3, "gaussian"),
    ("batch_1", (1, 1, 12, 10, 9), (5, 6, 4), 1, 0.0, "constant"),
    ("large_batch", (2, 1, 12, 10, 9), (5, 6, 4), 1000, 0.5, "gaussian"),
]


class TestHelpers(unittest.TestCase):
    def test_valid_patch_size(self):
        self.assertEqual(get_valid_patch_size((10, 8, 6), 7), (7, 7, 6))
        self.assertEqual(get_valid_patch_size((10, 8, 6), (12, None, 0)), (10, 8, 6))
        self.assertEqual(get_valid_patch_size((10, 8, 6), (3,)), (3, 8, 6))

    def test_scan_interval(self):
        self.assertEqual(get_scan_interval((10, 8), (4, 8), 2, (0.5, 0.5)), (2, 8))
        self.assertEqual(get_scan_interval((10, 8), (4, 3), 2, (0.9, 0.0)), (1, 3))
        with self.assertRaises(ValueError):
            get_scan_interval((10, 8), (4,), 2, (0.5, 0.5))

    def test_dense_patch_slices_cover_and_end_at_border(self):
        slices = dense_patch_slices((10, 7), (4, 3), (3, 3))
        self.assertEqual([s[0].start for s in slices[::3]], [0, 3, 6])
        self.assertEqual(sorted({s[1].start for s in slices}), [0, 3, 4])
        self.assertEqual(dense_patch_slices((4,), (4,), (4,), return_slice=False), [((0, 4),)])
        covered = torch.zeros(10, 7)
        for s in slices:
            covered[s] += 1
        self.assertTrue(bool((covered > 0).all()))

    def test_importance_map(self):
        self.assertTrue(torch.equal(compute_importance_map((3, 4)), torch.ones(3, 4)))
        g = compute_importance_map((5, 7, 3), "gaussian", (0.5, 0.25, 1.0), dtype=torch.float64)
        self.assertEqual(g.dtype, torch.float64)
        self.assertEqual(tuple(g.shape), (5, 7, 3))
        self.assertEqual(tuple(torch.nonzero(g == g.max())[0].tolist()), (2, 3, 1))  # peak at the centre
        self.assertTrue(torch.allclose(g, g.flip(0).flip(1).flip(2)))
        tiny = compute_importance_map((64,), "gaussian", 0.01)
        self.assertAlmostEqual(float(tiny.min()), 1e-3, places=6)
        with self.assertRaises(ValueError):
            compute_importance_map((3, 3), "triangle")

    def test_plan(self):
        plan = plan_sliding_windows((10, 5), (4, 8), 0.5, batch_size=2)
        self.assertEqual(plan.roi_size, (4, 8))
        self.assertEqual(plan.padded_size, (10, 8))
        self.assertEqual(plan.pad_size, [1, 2, 0, 0])
        self.assertEqual(plan.num_windows, 4)
        self.assertEqual(plan.total_windows, 8)
        self.assertEqual(plan.coords(5)[:2], [slice(1, 2), slice(None)])


class TestSlidingWindowShapes(unittest.TestCase):
    @parameterized.expand(SHAPE_CASES)
    def test_blend_matches_reference(self, _name, shape, roi, bs, overlap, mode):
        x, expected = _coverage(shape, roi, overlap, mode)
        out = sliding_window_inference(x, roi, bs, _scale, overlap, mode)
        self.assertEqual(tuple(out.shape), shape)
        self.assertTrue(torch.allclose(out, expected, atol=1e-5))
        # f is affine, so the blend of window outputs is f itself wherever no padding is involved
        self.assertTrue(torch.allclose(out, _scale(x), atol=1e-4))

    @parameterized.expand([("constant", "constant", 0.0), ("replicate", "replicate", 0.0), ("reflect", "reflect", 3.0)])
    def test_padding(self, _name, padding_mode, cval):
        x = torch.rand(1, 1, 6, 5, 4)
        out = sliding_window_inference(x, (9, 5, 6), 2, lambda w: w, 0.5, padding_mode=padding_mode, cval=cval)
        self.assertEqual(tuple(out.shape), (1, 1, 6, 5, 4))
        self.assertTrue(torch.allclose(out, x))

    def test_cval_fills_constant_padding(self):
        x = torch.zeros(1, 1, 4, 4)
        seen = []
        sliding_window_inference(x, (8, 4), 1, lambda w: seen.append(w) or w, cval=7.0)
        self.assertEqual(float(seen[0].max()), 7.0)
        self.assertEqual(float(seen[0][0, 0, 2:6].max()), 0.0)

    def test_sigma_scale_changes_gaussian(self):
        x = torch.rand(1, 1, 12, 12)
        f = lambda w: w * w.mean()  # noqa: E731  (not affine: the blend weights show)
        a = sliding_window_inference(x, 6, 4, f, 0.5, "gaussian", sigma_scale=0.125)
        b = sliding_window_inference(x, 6, 4, f, 0.5, "gaussian", sigma_scale=(1.0, 0.3))
        c = sliding_window_inference(x, 6, 4, f, 0.5, "constant")
        self.assertFalse(torch.allclose(a, b))
        self.assertFalse(torch.allclose(a, c))

    def test_roi_weight_map(self):
        x = torch.rand(1, 1, 12, 12)
        f = lambda w: w * w.mean()  # noqa: E731
        gauss = compute_importance_map((6, 6), "gaussian", 0.3)
        a = sliding_window_inference(x, (6, 6), 4, f, 0.5, "constant", roi_weight_map=gauss)
        b = sliding_window_inference(x, (6, 6), 4, f, 0.5, "gaussian", sigma_scale=0.3)
        self.assertTrue(torch.allclose(a, b))

    def test_process_fn(self):
        x = torch.rand(1, 1, 12, 10)
        calls = []

        def process(outs, windows, weight):
            calls.append((len(outs), tuple(windows.shape), tuple(weight.shape)))
            return tuple(o * 3 for o in outs), weight * 2

        out = sliding_window_inference(x, (6, 5), 3, lambda w: w, 0.5, "gaussian", process_fn=process)
        self.assertTrue(torch.allclose(out, x * 3, atol=1e-6))
        self.assertEqual(calls[0], (1, (3, 1, 6, 5), (6, 5)))

    def test_process_fn_per_window_weights(self):
        x = torch.rand(1, 1, 12, 10)

        def process(outs, windows, weight):  # a per-window weight, e.g. a confidence
            w = windows.mean(dim=(1, 2, 3), keepdim=True) * weight
            return outs, w

        out = sliding_window_inference(x, (6, 5), 3, lambda w: w * 0 + 1, 0.5, process_fn=process)
        self.assertTrue(torch.allclose(out, torch.ones_like(x), atol=1e-6))  # weighted mean of ones

    @parameterized.expand([(s, d, m) for s in (1, 2, 5) for d in (0, 1, -1) for m in ("constant", "gaussian")])
    def test_buffered_equals_unbuffered(self, steps, dim, mode):
        x = torch.rand(2, 1, 13, 11, 9)
        f = lambda w: torch.cat([w * w.mean((1, 2, 3, 4), True), w + 1], 1)  # noqa: E731
        ref = sliding_window_inference(x, (6, 5, 4), 3, f, 0.5, mode)
        out = sliding_window_inference(x, (6, 5, 4), 3, f, 0.5, mode, buffer_steps=steps, buffer_dim=dim)
        self.assertTrue(torch.allclose(out, ref, atol=1e-6))

    def test_buffered_multi_output_and_zoom(self):
        x = torch.rand(1, 1, 16, 12, 8)
        f = lambda w: (w * w.mean((1, 2, 3, 4), True), F.avg_pool3d(w, 2))  # noqa: E731
        ref = sliding_window_inference(x, (8, 4, 4), 2, f, 0.5, "gaussian")
        out = sliding_window_inference(x, (8, 4, 4), 2, f, 0.5, "gaussian", buffer_steps=2, buffer_dim=0)
        for a, b in zip(ref, out):
            self.assertTrue(torch.allclose(a, b, atol=1e-6))

    def test_with_coord(self):
        x = torch.rand(2, 2, 12, 10, 9)
        seen = []

        def predictor(windows, coords, scale, offset=0.0):
            self.assertEqual(len(coords), windows.shape[0])
            for w, c in zip(windows, coords):
                self.assertEqual(len(c), 5)
                self.assertTrue(torch.equal(w[None], x[tuple(c)]))
                seen.append(tuple((s.start, s.stop) for s in c[2:]) + (c[0].start,))
            return windows * scale + offset

        out = sliding_window_inference(x, (6, 5, 9), 3, predictor, 0.5, "constant", 0.125, "constant", 0.0,
                                       None, None, False, None, None, None, -1, True, 2.0, offset=1.0)
        self.assertTrue(torch.allclose(out, x * 2 + 1, atol=1e-6))
        plan = plan_sliding_windows((12, 10, 9), (6, 5, 9), 0.5, 2)
        self.assertEqual(len(seen), plan.total_windows)
        self.assertEqual(len(set(seen)), plan.total_windows)

    def test_args_kwargs_forwarded(self):
        x = torch.rand(1, 1, 10, 10)
        out = sliding_window_inference(x, 5, 2, lambda w, a, b=0: w * a + b, 0.25, "constant", 0.125, "constant",
                                       0.0, None, None, False, None, None, None, -1, False, 3.0, b=2.0)
        self.assertTrue(torch.allclose(out, x * 3 + 2))

    def test_condition_kwarg_is_windowed(self):
        x, cond = torch.rand(1, 1, 9, 8), torch.rand(1, 1, 9, 8)
        out = sliding_window_inference(x, (12, 4), 2, lambda w, condition: w + condition, 0.5, condition=cond)
        self.assertTrue(torch.allclose(out, x + cond))

    def test_dict_and_tuple_outputs(self):
        x = torch.rand(1, 2, 12, 10, 8)
        d = sliding_window_inference(x, 6, 3, lambda w: {"z": w * 2, "a": w[:, :1]}, 0.5, "gaussian")
        self.assertEqual(list(d.keys()), ["a", "z"])
        self.assertTrue(torch.allclose(d["z"], x * 2, atol=1e-6))
        self.assertTrue(torch.allclose(d["a"], x[:, :1], atol=1e-6))
        t = sliding_window_inference(x, 6, 3, lambda w: (w, w.sum(1, keepdim=True)), 0.5)
        self.assertIsInstance(t, tuple)
        self.assertEqual([tuple(o.shape) for o in t], [(1, 2, 12, 10, 8), (1, 1, 12, 10, 8)])
        single = sliding_window_inference(x, 6, 3, lambda w: [w], 0.5)
        self.assertIsInstance(single, torch.Tensor)

    @parameterized.expand([
        ("down2", lambda w: F.avg_pool3d(w, 2), (8, 8, 8), 0.5, (1, 1, 8, 6, 4)),
        ("up2", lambda w: F.interpolate(w, scale_factor=2, mode="nearest"), (8, 8, 8), 0.5, (1, 1, 32, 24, 16)),
        ("per_dim", lambda w: F.interpolate(w, scale_factor=(0.5, 1, 2), mode="nearest"), (8, 4, 4), 0.5,
         (1, 1, 8, 12, 16)),
    ])
    def test_output_at_other_scale(self, _name, f, roi, overlap, expected_shape):
        x = torch.ones(1, 1, 16, 12, 8) * 3
        out = sliding_window_inference(x, roi, 2, f, overlap, "gaussian")
        self.assertEqual(tuple(out.shape), expected_shape)
        self.assertTrue(torch.allclose(out, torch.full(expected_shape, 3.0)))

    def test_padded_output_at_other_scale(self):
        x = torch.rand(1, 1, 4, 12, 8)
        out = sliding_window_inference(x, (8, 8, 8), 2, lambda w: F.avg_pool3d(w, 2), 0.5)
        self.assertEqual(tuple(out.shape), (1, 1, 2, 6, 4))
        self.assertTrue(torch.allclose(out, F.avg_pool3d(x, 2), atol=1e-6))
        odd = sliding_window_inference(x[:, :, :3], (8, 8, 8), 2, lambda w: F.avg_pool3d(w, 2), 0.5)
        # padded 3 -> 8 (2 before), cropped at round(2 * 0.5) : round(5 * 0.5) of the half-size output, as upstream
        self.assertEqual(tuple(odd.shape), (1, 1, 1, 6, 4))

    def test_device_arguments(self):
        x = torch.rand(1, 1, 8, 8)
        seen = []
        out = sliding_window_inference(x, 4, 2, lambda w: seen.append(w.device) or w, sw_device="cpu", device="cpu")
        self.assertEqual(out.device.type, "cpu")
        self.assertEqual({d.type for d in seen}, {"cpu"})

    def test_dtype_follows_input(self):
        x = torch.rand(1, 1, 8, 8, dtype=torch.float64)
        out = sliding_window_inference(x, 4, 2, lambda w: w.float(), 0.5, "gaussian")
        self.assertEqual(out.dtype, torch.float64)
        self.assertTrue(torch.allclose(out, x, atol=1e-6))

    def test_progress_without_tqdm(self):
        x = torch.rand(1, 1, 8, 8)
        err = io.StringIO()
        with mock.patch.object(swi, "has_tqdm", False), mock.patch("sys.stderr", err):
            out = sliding_window_inference(x, 4, 1, lambda w: w, 0.0, progress=True)
        self.assertTrue(torch.allclose(out, x))
        self.assertIn("4/4", err.getvalue())

    def test_progress_with_tqdm(self):
        x = torch.rand(1, 1, 8, 8)
        fake = mock.MagicMock(side_effect=lambda items: items)
        with mock.patch.object(swi, "has_tqdm", True), mock.patch.object(swi, "tqdm", fake):
            sliding_window_inference(x, 4, 3, lambda w: w, 0.0, progress=True)
        fake.assert_called_once()
        self.assertEqual(len(fake.call_args[0][0]), 2)  # 4 windows in batches of 3


class TestSlidingWindowErrors(unittest.TestCase):
    @parameterized.expand([
        ("negative_overlap", dict(overlap=-0.1)),
        ("overlap_one", dict(overlap=1.0)),
        ("overlap_length", dict(overlap=(0.1, 0.2))),
        ("sw_batch_zero", dict(sw_batch_size=0)),
        ("sw_batch_float", dict(sw_batch_size=2.5)),
        ("roi_length", dict(roi_size=(4, 4))),
        ("mode", dict(mode="triangle")),
        ("padding_mode", dict(padding_mode="mirror")),
        ("reflect_too_large", dict(roi_size=(30, 4, 4), padding_mode="reflect")),
        ("circular_too_large", dict(roi_size=(40, 4, 4), padding_mode="circular")),
        ("buffer_dim", dict(buffer_steps=1, buffer_dim=3)),
    ])
    def test_bad_argument(self, _name, overrides):
        args = dict(inputs=torch.rand(1, 1, 8, 7, 6), roi_size=(4, 4, 4), sw_batch_size=2, predictor=lambda w: w)
        args.update(overrides)
        with self.assertRaises(ValueError):
            sliding_window_inference(**args)

    def test_bad_inputs(self):
        with self.assertRaises(ValueError):
            sliding_window_inference(torch.rand(4, 4), 2, 1, lambda w: w)

    def test_bad_predictor_outputs(self):
        x = torch.rand(1, 1, 8, 8)
        with self.assertRaises(ValueError):  # one output for a batch of two windows
            sliding_window_inference(x, 4, 2, lambda w: w[:1])
        with self.assertRaises(TypeError):
            sliding_window_inference(x, 4, 2, lambda w: 3.0)
        with self.assertRaises(ValueError):  # a scale whose windows do not land on the output grid
            sliding_window_inference(torch.rand(1, 1, 12), 11, 2, lambda w: F.interpolate(w, size=15), 0.0)




class TestSlidingWindowSettings(unittest.TestCase):
    """The one argument list: every caller builds its settings from the names of the fields."""

    def test_from_values_and_split(self):
        values = {"roi_size": (8, 8), "overlap": 0.5, "inputs": None, "progress": True, "transpose": True}
        settings = swi.SlidingWindowSettings.from_values(values)
        self.assertEqual((settings.roi_size, settings.overlap, settings.progress), ((8, 8), 0.5, True))
        self.assertEqual(settings.sw_batch_size, 1)  # a field not given keeps its default
        fields, rest = swi.SlidingWindowSettings.split(values)
        self.assertEqual(set(fields), {"roi_size", "overlap", "progress"})
        self.assertEqual(set(rest), {"inputs", "transpose"})

    def test_every_argument_reaches_the_loop(self):
        """sliding_window_inference's window arguments: the settings' fields but the inferers' own; all passed on."""
        import dataclasses
        import inspect

        params = set(inspect.signature(sliding_window_inference).parameters) - {"inputs", "predictor", "args", "kwargs"}
        inferer_only = {"window_add", "on_plan"}  # set by inferers and the streamed path; upstream's signature stays
        self.assertEqual(params, {f.name for f in dataclasses.fields(swi.SlidingWindowSettings)} - inferer_only)
        with mock.patch("monai.inferers.utils.run_sliding_window") as run:
            sliding_window_inference(torch.zeros(1, 1, 4, 4), (2, 2), 3, None, 0.5, "gaussian", 0.2, "reflect", 1.5,
                                     "cpu", "cpu", True, None, None, 2, 0, True)
        got = run.call_args.args[2]
        self.assertEqual(
            (got.sw_batch_size, got.overlap, got.mode, got.sigma_scale, got.padding_mode, got.cval, got.progress),
            (3, 0.5, "gaussian", 0.2, "reflect", 1.5, True),
        )
        self.assertEqual((got.buffer_steps, got.buffer_dim, got.with_coord), (2, 0, True))


if __name__ == "__main__":
    unittest.main()
