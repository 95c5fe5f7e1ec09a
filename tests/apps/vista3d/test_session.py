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
"""Vista3DSession: a click sequence equals the pipeline's stages called with the same clicks and previous logits."""

from __future__ import annotations

import collections
import unittest
from unittest import mock

import numpy as np
import torch
from parameterized import parameterized
from torch.utils._python_dispatch import TorchDispatchMode

from monai.apps.vista3d.core.pipeline import Vista3DPipeline
from monai.apps.vista3d.core.prompts import parse_prompt
from monai.apps.vista3d.core.session import Vista3DSession, WindowFeatureCache
from monai.apps.vista3d.errors import ClassPromptError, PromptError, Vista3DInputError
from monai.networks.kernels.dispatch import FusedConfig
from tests.apps.vista3d.stub_vista import phantom
from tests.networks.tiny_vista3d import tiny_vista3d_with_recorded_weights

#: operators that wait for the device on a GPU: a value read back (``item``, ``bool``), ``equal``, ``unique``,
#: boolean indexing (``nonzero``)
HOST_READS = ("aten._local_scalar_dense", "aten.equal", "aten._unique2", "aten.unique", "aten.nonzero")


class HostReads(TorchDispatchMode):
    """Counts the operators of :data:`HOST_READS` dispatched while active."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func).rsplit(".", 1)[0]
        if name in HOST_READS:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))

# clicks inside the body of the 40 x 40 x 36 test phantom (1 mm voxels, the network grid is 1.5 mm)
CLICKS = [([[20, 20, 18]], [1]), ([[8, 30, 10]], [1]), ([[30, 9, 26]], [0]), ([[20, 21, 18]], [1])]


def _pipe(**kw) -> Vista3DPipeline:
    kw.setdefault("roi_size", 16)  # smaller than the network grid (27 x 27 x 24): windows leave voxels uncovered
    return Vista3DPipeline(network=tiny_vista3d_with_recorded_weights(), device="cpu", **kw)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(torch.nan_to_num(a, nan=7e7), torch.nan_to_num(b, nan=7e7))


class TestHostReads(unittest.TestCase):
    def test_a_later_click_reads_back_a_fixed_few_values(self):
        """On a GPU each read of a value waits for the device; a click's post-processing and its merge with the
        previous logits read a fixed number, however many clicks came before (the plain-torch labeller, as on a
        GPU: it read one value per click and window margin, and ten per labelling for its box)."""
        img, aff, _ = phantom((40, 40, 36), np.eye(3), (1.0, 1.0, 1.0))
        session = Vista3DSession(_pipe(), torch.from_numpy(img), aff)
        counts, rounds = [], []
        with mock.patch("monai.utils.point_helpers._scipy_ndimage", lambda: None):
            for points, labels in CLICKS:
                with HostReads() as reads:
                    session.click(points, labels)
                rounds.append(reads.counts.pop("aten.equal", 0))  # the labeller's checks: as many as its rounds need
                counts.append(sum(reads.counts.values()))
        self.assertEqual(len(set(counts[1:])), 1, counts)  # later clicks: the same count, not one more per click
        # the merge labels its positive and negative regions in one pass: 10-11 reads a later click (13-14 when it
        # labelled them one after the other), 8 the first
        self.assertLessEqual(max(c + r for c, r in zip(counts, rounds)), 12, (counts, rounds))


class TestSessionEqualsPipeline(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.img, cls.aff, _ = phantom((40, 40, 36), np.eye(3), (1.0, 1.0, 1.0))
        cls.image = torch.from_numpy(cls.img)

    def _independent(self, pipe: Vista3DPipeline, classes, steps: int) -> tuple[list, list]:
        """The label maps and logits of ``steps`` clicks, each step from the stages with the cumulative clicks."""
        x, record = pipe.preprocess(self.image[None], self.aff)
        points = [p for pts, _ in CLICKS[:steps] for p in pts]
        labels = [v for _, labs in CLICKS[:steps] for v in labs]
        on_grid = pipe.prompts(parse_prompt(classes, points, labels), record)
        coords, labs, ids = on_grid["point_coords"], on_grid["point_labels"], on_grid["label_ids"]
        maps, prev, all_logits = [], None, []
        for k in range(steps):
            logits, _ = pipe.infer(x, ids, coords[:, : k + 1], labs[:, : k + 1], prev_mask=prev, point_start=k)
            all_logits.append(logits.clone())
            maps.append(pipe.invert(pipe.postprocess(logits, ids, coords[:, : k + 1], labs[:, : k + 1])[0], record))
            prev = all_logits[-1]
        return maps, all_logits

    @parameterized.expand([("clicks_only", None, 4), ("liver", "liver", 3), ("special_class", "25", 2)])
    def test_clicks_equal_independent_calls(self, _, classes, steps):
        pipe = _pipe()
        expected, expected_logits = self._independent(pipe, classes, steps)
        session = Vista3DSession(pipe, self.image, self.aff)
        for k in range(steps):
            out = session.click(*CLICKS[k], classes=classes if k == 0 else None)
            self.assertEqual(session.clicks, k + 1)
            self.assertEqual(tuple(out.shape), self.img.shape)
            self.assertTrue(torch.equal(out, expected[k]), f"click {k}")
            self.assertTrue(_same(session.logits, expected_logits[k]), f"click {k}")
        self.assertEqual(set(session.timings), {"prompts", "inference", "postprocess", "invert"})
        # the first click is what the pipeline's one-call segment gives
        first = pipe.segment(self.image, self.aff, classes=classes, points=CLICKS[0][0], point_labels=CLICKS[0][1])
        self.assertTrue(torch.equal(first.labels, expected[0]))

    def test_previous_mask_is_carried(self):
        # windows land around the new clicks only; elsewhere the previous step's logits stay as they were
        pipe = _pipe()
        session = Vista3DSession(pipe, self.image, self.aff)
        session.click(*CLICKS[0])
        first = session.logits.clone()
        self.assertTrue(torch.isnan(first).any())  # a 16^3 window leaves most of the 27 x 27 x 24 grid
        with mock.patch.object(pipe, "infer", wraps=pipe.infer) as infer:
            session.click(*CLICKS[1])
        call = infer.call_args
        self.assertTrue(_same(call.kwargs["prev_mask"], first))  # the raw logits, not the post-processed ones
        self.assertEqual(call.kwargs["point_start"], 1)
        self.assertEqual(tuple(call.args[2].shape), (1, 2, 3))  # every click so far goes to the network
        second = session.logits
        changed = torch.nan_to_num(second, nan=7e7) != torch.nan_to_num(first, nan=7e7)
        self.assertTrue(changed.any())
        for axis in range(2, 5):  # what changed lies in the new click's one 16^3 window
            dims = [d for d in range(5) if d != axis]
            where = changed.any(dim=dims[-1]).any(dim=dims[-2]).any(dim=dims[-3]).any(dim=dims[-4])
            idx = torch.nonzero(where).flatten()
            self.assertLessEqual(int(idx.max() - idx.min()) + 1, 16)
        # as upstream: a voxel without a previous prediction stays without one (VISTA3D's connected-components
        # combine multiplies the previous logits by 0 where the click result replaces them, and NaN * 0 is NaN)
        self.assertTrue(torch.equal(torch.isnan(second), torch.isnan(first)))

    def test_reset_starts_a_new_object(self):
        pipe = _pipe()
        session = Vista3DSession(pipe, self.image, self.aff)
        session.click(*CLICKS[0], classes="liver")
        session.click(*CLICKS[1])
        self.assertEqual(session.label_ids, [1])
        session.reset()
        self.assertEqual((session.clicks, session.logits, session.label_ids), (0, None, None))
        out = session.click(*CLICKS[2], classes="spleen")
        expected = pipe.segment(self.image, self.aff, classes="spleen", points=CLICKS[2][0], point_labels=CLICKS[2][1])
        self.assertTrue(torch.equal(out, expected.labels))

    def test_window_features_are_reused(self):
        # the 3rd click repeats the 1st (the same window): its point features are not computed again, and the
        # labels are those without a cache; the 4th click, one voxel away, has a window of its own
        pipe = _pipe()
        cached = Vista3DSession(pipe, self.image, self.aff)
        plain = Vista3DSession(pipe, self.image, self.aff, cache_windows=0)
        self.assertIsNone(plain.feature_cache)
        encoder = pipe.network.image_encoder
        with mock.patch.object(encoder, "forward", wraps=encoder.forward) as encode:
            for click in (CLICKS[0], CLICKS[1], CLICKS[0], CLICKS[3]):
                self.assertTrue(torch.equal(cached.click(*click), plain.click(*click)))
                self.assertTrue(_same(cached.logits, plain.logits))
        self.assertEqual(cached.feature_cache.hits, 1)  # the 1st click's window again
        self.assertEqual(encode.call_count, 8 - cached.feature_cache.hits)
        self.assertIsNone(pipe.network.image_embeddings)  # the network keeps no state between calls

    def test_fused_session_equals_module_session(self):
        module = Vista3DSession(_pipe(), self.image, self.aff)
        pipe = _pipe()
        pipe.network.fuse(FusedConfig(kernels="torch"))
        fused = Vista3DSession(pipe, self.image, self.aff)
        with mock.patch.object(pipe.network._fused, "point", wraps=pipe.network._fused.point) as point:
            for click in CLICKS[:3]:
                self.assertTrue(torch.equal(fused.click(*click), module.click(*click)))
                torch.testing.assert_close(fused.logits, module.logits, rtol=1e-4, atol=1e-4, equal_nan=True)
        self.assertEqual(point.call_count, 3)

    @parameterized.expand(
        [
            ("bad_class", dict(classes="not an organ"), ClassPromptError, "not an organ"),
            ("no_points", dict(points=None), PromptError, "a click needs points"),
            ("empty_points", dict(points=[]), PromptError, "no points given"),
            ("empty_string", dict(points=" "), PromptError, "a click needs points"),
            ("no_labels", dict(point_labels=None), PromptError, "without labels"),
            ("bad_label", dict(point_labels=[2]), PromptError, "1 \\(positive\\) or 0"),
            ("two_classes", dict(classes="liver,spleen"), PromptError, "at most one class"),
            ("outside", dict(points=[[60, 3, 3]]), PromptError, "outside the image"),
        ]
    )
    def test_bad_prompts_one_line(self, _, change, error, message):
        session = Vista3DSession(_pipe(), self.image, self.aff)
        kw = dict(points=CLICKS[0][0], point_labels=CLICKS[0][1], classes=None)
        kw.update(change)
        with self.assertRaisesRegex(error, message) as caught:
            session.click(**kw)
        self.assertNotIn("\n", str(caught.exception))
        self.assertEqual(session.clicks, 0)  # a refused click changes nothing

    def test_other_class_mid_object(self):
        session = Vista3DSession(_pipe(), self.image, self.aff)
        session.click(*CLICKS[0], classes="liver")
        session.click(*CLICKS[1], classes="liver")  # repeating the object's class is fine
        with self.assertRaisesRegex(PromptError, "clicked as class 1, not class 3: call reset\\(\\)"):
            session.click(*CLICKS[2], classes="spleen")
        self.assertEqual(session.clicks, 2)

    def test_image_checks(self):
        with self.assertRaisesRegex(Vista3DInputError, "affine"):
            Vista3DSession(_pipe(), self.image)
        with self.assertRaisesRegex(Vista3DInputError, "must be \\[X, Y, Z\\]"):
            Vista3DSession(_pipe(), self.image[None, None], self.aff)


class TestWindowFeatureCache(unittest.TestCase):
    def test_new_weights_empty_the_cache(self):
        torch.manual_seed(0)
        net = tiny_vista3d_with_recorded_weights()
        cache = WindowFeatureCache(net, max_windows=2)
        x = torch.randn(1, 1, 16, 16, 16)
        window = [(slice(None), slice(None), slice(0, 16), slice(0, 16), slice(0, 16))]
        kw = dict(point_coords=torch.tensor([[[5, 6, 7]]]), point_labels=torch.tensor([[1]]), patch_coords=window)
        with torch.no_grad():
            first = cache(x, **kw)
            self.assertEqual((cache.hits, cache.misses, len(cache)), (0, 1, 1))
            self.assertTrue(torch.equal(cache(x, **kw), first))
            self.assertEqual(cache.hits, 1)
            net.point_head.output_hypernetworks_mlps.layers[0].weight.mul_(2.0)  # new weights
            changed = cache(x, **kw)
            self.assertEqual((cache.hits, cache.misses), (1, 2))
            self.assertTrue(torch.equal(changed, net(x, **kw)))
            self.assertFalse(torch.equal(changed, first))
            # class prompts are not cached
            cache(x, class_vector=torch.tensor([[1]]), **kw)
            self.assertEqual((cache.hits, cache.misses), (1, 2))
        with self.assertRaisesRegex(ValueError, "max_windows"):
            WindowFeatureCache(net, 0)


if __name__ == "__main__":
    unittest.main()
