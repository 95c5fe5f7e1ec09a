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

from __future__ import annotations

import functools
import itertools
import unittest

import torch
from parameterized import parameterized

from monai.inferers import sliding_window_inference
from monai.inferers.sliding_window import SlidingWindowSettings, run_sliding_window
from monai.inferers.tile_stitcher import TileStitcher


class MaxReduction:
    """A reduction that is not VISTA3D's: the highest output channel of each voxel, and the tiles it was given."""

    def __init__(self, inputs: torch.Tensor):
        self.result = torch.full((inputs.shape[0], 1, *inputs.shape[2:]), float("nan"))
        self.regions: list[tuple] = []

    def add(self, image, region, outputs):
        self.regions.append((image, region))
        self.result[(image, 0, *region)] = outputs.max(0).values

    def finish(self):
        return self.result


class RecordingTileStitcher(TileStitcher):
    """Records the tiles held after each batch and the order the windows ran in."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.held_after_batch: list[tuple[int, set]] = []
        self.ran: list[int] = []

    def add(self, out, batch, coords, windows):
        super().add(out, batch, coords, windows)
        self.ran.extend(batch)
        self.held_after_batch.append((len(self.ran), self.held_tiles))


def per_window_conv(channels: int, classes: int, seed: int):
    torch.manual_seed(seed)
    conv = torch.nn.Conv3d(channels, classes, 3, padding=1)
    return lambda x: torch.cat([conv(x[i : i + 1]) for i in range(len(x))])  # batching changes no bit


def run_tiles(x, predictor, roi, sw_batch_size, overlap, mode, slab_dim):
    """One pass with a recording tile stitcher; returns ``(result, stitcher)``."""
    made = []

    def factory(**kwargs):
        made.append(RecordingTileStitcher(MaxReduction(x), slab_dim=slab_dim, **kwargs))
        return made[-1]

    settings = SlidingWindowSettings(roi_size=roi, sw_batch_size=sw_batch_size, overlap=overlap, mode=mode)
    return run_sliding_window(x, predictor, settings, stitcher=factory), made[0]


CASES = [
    # batch, shape, roi, overlap, mode, slab_dim, sw_batch_size (sizes not divisible by the steps)
    (2, (23, 19, 17), (10, 8, 6), 0.25, "constant", 0, 3),
    (1, (23, 19, 17), (10, 8, 6), 0.5, "gaussian", 1, 2),
    (1, (21, 17, 13), (10, 8, 6), (0.6, 0.3, 0.1), "gaussian", 2, 4),
    (2, (7, 6, 19), (10, 8, 6), 0.25, "gaussian", -1, 1),  # padded on two axes
]


class TestTileStitcher(unittest.TestCase):
    @parameterized.expand(CASES)
    def test_equals_full_outputs(self, batch, shape, roi, overlap, mode, slab_dim, sw_batch_size):
        """Any reduction of the tiles equals the same reduction of the full blended outputs, bit for bit."""
        predictor = per_window_conv(2, 4, seed=sum(shape))
        x = torch.randn(batch, 2, *shape, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            full = sliding_window_inference(x, roi, sw_batch_size, predictor, overlap, mode)
            result, stitcher = run_tiles(x, predictor, roi, sw_batch_size, overlap, mode, slab_dim)
        self.assertTrue(torch.equal(result, full.max(1, keepdim=True).values))
        # every voxel written once: the regions of each image tile the image
        for b in range(batch):
            covered = torch.zeros(shape, dtype=torch.int64)
            for _, region in (r for r in stitcher.reduction.regions if r[0] == b):
                covered[region] += 1
            self.assertTrue(bool((covered == 1).all()))

    @parameterized.expand(CASES)
    def test_tiles_freed_as_soon_as_complete(self, batch, shape, roi, overlap, mode, slab_dim, sw_batch_size):
        """After each batch exactly the tiles with some but not all of their windows run are held, slab by slab."""
        predictor = per_window_conv(1, 2, seed=1)
        with torch.no_grad():
            x = torch.randn(batch, 1, *shape)
            _, stitcher = run_tiles(x, predictor, roi, sw_batch_size, overlap, mode, slab_dim)
        plan, tiling, n = stitcher.plan, stitcher.tiling, stitcher.plan.num_windows
        d = slab_dim % len(shape)
        tiles = list(itertools.product(*(range(len(b) - 1) for b in tiling.bounds)))

        def overlaps(w, t):  # from the window's slices, not from the tiling's bookkeeping
            return all(s.start < e and a < s.stop for s, (a, e) in zip(plan.slices[w], tiling.box(t)))

        windows_of = {t: {w for w in range(n) if overlaps(w, t)} for t in tiles}

        self.assertEqual(sorted(stitcher.ran), list(range(batch * n)))  # every window once
        for done, held in stitcher.held_after_batch:
            image, ran = divmod(done - 1, n)
            run = {i % n for i in stitcher.ran[image * n : done]}
            expected = {t for t in tiles if windows_of[t] & run and not windows_of[t] <= run}
            self.assertEqual(held, expected)
            if ran == n - 1:
                self.assertEqual(held, set())  # an image's tiles are all freed by the end of its windows
        for b in range(batch):  # slab order: window starts along slab_dim never go back within an image
            starts = [plan.slices[i % n][d].start for i in stitcher.ran[b * n : (b + 1) * n]]
            self.assertEqual(starts, sorted(starts))

    @parameterized.expand([(0.5,), (0.9,), (0.99,)])
    def test_bookkeeping_independent_of_window_count(self, overlap):
        """Tiles and held accumulators stay within the volume however many windows there are (0.99: one a voxel)."""
        shape, roi, classes = (24, 24, 16), (16, 16, 16), 2

        class Peak(TileStitcher):
            peak = 0

            def add(self, *args):
                super().add(*args)
                held = sum(a.numel() for a in self._acc.values())
                held += sum(p.numel() for parts in self._parts.values() for _, _, p, _ in parts)
                self.peak = max(self.peak, held)

        made = []

        def factory(**kwargs):
            made.append(Peak(MaxReduction(x), **kwargs))
            return made[-1]

        x = torch.randn(1, 1, *shape)
        settings = SlidingWindowSettings(roi_size=roi, sw_batch_size=4, overlap=overlap)
        with torch.no_grad():
            result = run_sliding_window(x, lambda w: w.repeat(1, classes, 1, 1, 1), settings, stitcher=factory)
        stitcher = made[0]
        torch.testing.assert_close(result, x)  # the mean of equal window outputs
        tiles = [len(b) - 1 for b in stitcher.tiling.bounds]
        self.assertLessEqual(tiles, [2 * s // r + 1 for s, r in zip(shape, roi)])  # cuts half a window apart
        self.assertGreater(stitcher.plan.num_windows, 1)
        self.assertLessEqual(stitcher.peak, classes * x[0, 0].numel())  # never more than the full outputs

    def test_errors(self):
        x = torch.randn(1, 1, 20, 20, 20)
        predictor = per_window_conv(1, 2, seed=0)
        settings = SlidingWindowSettings(roi_size=16)
        for slab_dim in (3, -4):
            factory = functools.partial(TileStitcher, slab_dim=slab_dim, reduction=MaxReduction(x))
            with self.assertRaisesRegex(ValueError, "slab_dim"):
                run_sliding_window(x, predictor, settings, stitcher=factory)
        factory = functools.partial(TileStitcher, reduction=MaxReduction(x))
        with self.assertRaisesRegex(ValueError, r"\[n, C, \*roi_size\]"):
            run_sliding_window(x, lambda w: {"a": predictor(w)}, settings, stitcher=factory)


if __name__ == "__main__":
    unittest.main()
