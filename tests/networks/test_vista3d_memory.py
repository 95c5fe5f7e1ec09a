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
"""VISTA3D allocates nothing that inference does not need (measured), and leaves the CUDA cache alone."""

from __future__ import annotations

import unittest
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile

from monai.networks.nets import VISTA3D
from tests.networks.tiny_vista3d import build_tiny_vista3d

S, C = 16, 8
COORDS = torch.tensor([[[3, 4, 5], [10, 10, 10]], [[8, 2, 12], [0, 0, 0]], [[1, 1, 1], [5, 5, 5]]])
LABELS = torch.tensor([[1, 0], [1, -1], [0, 1]])


def cpu_allocations(fn):
    """``(result, bytes allocated in total, peak bytes above the start)`` of ``fn()`` on CPU, from the profiler's
    allocation events."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns())
    total = current = peak = 0
    for e in events:
        current += e.nbytes()
        total += max(e.nbytes(), 0)
        peak = max(peak, current)
    return result, total, peak


def legacy_scatter(self, point_logits, mapping_index, bs):
    """MONAI 1.6.1's formulation: a -9999-filled buffer for all rows, then the point rows copied in."""
    logits = self.NINF_VALUE + torch.zeros([bs, *point_logits.shape[1:]], dtype=point_logits.dtype)
    logits[mapping_index] = point_logits
    return logits


class TestNoExtraAllocation(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.model = build_tiny_vista3d(feature_size=C, blocks_down=(1, 1)).eval()

    def _class_only(self, model, images, cv):
        return model(images, class_vector=cv, transpose=True)

    def _components_class(self, images, cv):
        _, feats = self.model.image_encoder(images, with_point=False, with_label=True)
        return self.model.class_head(feats, cv)[0].transpose(0, 1)

    def test_class_only_allocates_only_encoder_and_head(self):
        images, cv = torch.randn(2, 1, S, S, S), torch.arange(1, 6).unsqueeze(1)
        feature_bytes = 2 * C * S**3 * 4
        with torch.no_grad():
            self._class_only(self.model, images, cv)  # warm-up (lazy initialisations)
            out, total, peak = cpu_allocations(lambda: self._class_only(self.model, images, cv))
            ref, ref_total, ref_peak = cpu_allocations(lambda: self._components_class(images, cv))
        self.assertTrue(torch.equal(out, ref))
        self.assertLess(total - ref_total, feature_bytes // 2)
        self.assertLess(peak - ref_peak, feature_bytes // 2)

        # the measurement sees a full-size copy of the encoder features if one comes back
        real_forward = self.model.image_encoder.forward

        def copying_encoder(*args, **kwargs):
            point, auto = real_forward(*args, **kwargs)
            return point, auto.clone()

        with torch.no_grad(), mock.patch.object(self.model.image_encoder, "forward", side_effect=copying_encoder):
            _, bad_total, _ = cpu_allocations(lambda: self._class_only(self.model, images, cv))
        self.assertGreaterEqual(bad_total - ref_total, feature_bytes)

    def test_points_only_no_filled_buffer(self):
        image = torch.randn(1, 1, S, S, S)
        out_bytes = COORDS.shape[0] * S**3 * 4

        def forward():
            return self.model(image, point_coords=COORDS, point_labels=LABELS)

        def components():
            feats, _ = self.model.image_encoder(image, with_point=True, with_label=False)
            return self.model.point_head(feats, COORDS, LABELS)

        with torch.no_grad():
            forward()
            out, total, peak = cpu_allocations(forward)
            ref, ref_total, ref_peak = cpu_allocations(components)
            with mock.patch.object(VISTA3D, "_scatter_point_logits", legacy_scatter):
                legacy, legacy_total, legacy_peak = cpu_allocations(forward)
        self.assertTrue(torch.equal(out, ref))
        self.assertTrue(torch.equal(out, legacy))
        self.assertLess(total - ref_total, out_bytes // 2)
        self.assertLess(peak - ref_peak, out_bytes // 2)
        self.assertGreaterEqual(legacy_total - ref_total, 2 * out_bytes)  # zeros, + NINF, then the copy-in

    def test_points_only_padding_row_keeps_ninf(self):
        labels = LABELS.clone()
        labels[1] = -1
        with torch.no_grad():
            out = self.model(torch.randn(1, 1, S, S, S), point_coords=COORDS, point_labels=labels)
        self.assertTrue((out[1] == self.model.NINF_VALUE).all())
        self.assertTrue(torch.isfinite(out).all() and (out[[0, 2]] != self.model.NINF_VALUE).all())

    def test_both_decoders_share_the_bottleneck(self):
        """With class and point prompts the encoder output is not copied for the second decoder."""
        enc = self.model.image_encoder
        image = torch.randn(1, 1, S, S, S)
        with torch.no_grad():
            enc(image)
            _, both, _ = cpu_allocations(lambda: enc(image, with_point=True, with_label=True))
            _, point, _ = cpu_allocations(lambda: enc(image, with_point=True, with_label=False))
            _, auto, _ = cpu_allocations(lambda: enc(image, with_point=False, with_label=True))
            _, neither, _ = cpu_allocations(lambda: enc(image, with_point=False, with_label=False))
        bottleneck_bytes = 2 * C * (S // 2) ** 3 * 4
        # encoder once plus each decoder, nothing else
        self.assertLess(abs(both - (point + auto - neither)), bottleneck_bytes // 2)


class TestCudaCacheNotReleased(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.model = build_tiny_vista3d(feature_size=C, blocks_down=(1, 1)).eval()
        self.image = torch.randn(1, 1, S, S, S)

    def _run_all_modes(self):
        with torch.no_grad():
            self.model(self.image, class_vector=torch.tensor([[1], [2]]))
            self.model(self.image, point_coords=COORDS, point_labels=LABELS)
            self.model(self.image, class_vector=torch.tensor([[1], [2], [3]]), point_coords=COORDS, point_labels=LABELS)

    def test_not_called_by_default(self):
        self.assertFalse(self.model.release_cached_memory)
        with mock.patch("torch.cuda.empty_cache") as empty_cache:
            with torch.no_grad():
                self.model(torch.randn(3, 1, S, S, S), class_vector=torch.tensor([[1], [2]]), transpose=True)
            empty_cache.assert_not_called()
            self._run_all_modes()
            empty_cache.assert_not_called()

    def test_opt_in(self):
        self.model.release_cached_memory = True
        self.assertTrue(self.model.point_head.release_cached_memory)
        with mock.patch("torch.cuda.empty_cache") as empty_cache:
            with torch.no_grad():
                self.model(self.image, point_coords=COORDS, point_labels=LABELS)
            # after the encoder, after the point features are downsampled, and per prompt chunk
            self.assertEqual(empty_cache.call_count, 3)
        self.model.release_cached_memory = False
        self.assertFalse(self.model.point_head.release_cached_memory)

    def test_constructor_option(self):
        m = VISTA3D(self.model.image_encoder, self.model.class_head, self.model.point_head, release_cached_memory=True)
        self.assertTrue(m.release_cached_memory and m.point_head.release_cached_memory)


@unittest.skipUnless(torch.cuda.is_available(), "needs CUDA for torch.cuda.max_memory_allocated")
class TestCudaPeakMemory(unittest.TestCase):
    def test_class_only_peak(self):
        device = torch.device("cuda")
        torch.manual_seed(0)
        model = build_tiny_vista3d(feature_size=C, blocks_down=(1, 1)).to(device).eval()
        images, cv = torch.randn(4, 1, 32, 32, 32, device=device), torch.arange(1, 9, device=device).unsqueeze(1)

        def peak(fn):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            out = fn()
            torch.cuda.synchronize()
            return out, torch.cuda.max_memory_allocated() - base

        def components():
            return model.class_head(model.image_encoder(images, with_point=False, with_label=True)[1], cv)[0]

        with torch.no_grad():
            model(images, class_vector=cv)
            out, fwd_peak = peak(lambda: model(images, class_vector=cv, transpose=True))
            del out
            ref, ref_peak = peak(components)
        self.assertLessEqual(fwd_peak, ref_peak + 4 * C * 32**3 * 4 // 2)


if __name__ == "__main__":
    unittest.main()
