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
"""The labeller's Triton rounds against its plain-torch rounds (the same fixed point) and scipy's components."""

from __future__ import annotations

import unittest
from unittest import mock

import torch
from parameterized import parameterized

import monai.utils.label_rounds as label_rounds
import monai.utils.point_helpers as point_helpers
from monai.utils.triton_support import unavailable_reason

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNELS_RUN = unavailable_reason(DEVICE) is None


def torch_rounds(m: torch.Tensor, connectivity: int) -> torch.Tensor:
    """The plain-torch rounds' labels, on the CPU."""
    return point_helpers._root_labels(m.cpu(), connectivity)


def blobs(shape: tuple[int, ...], seed: int, level: float = 0.05) -> torch.Tensor:
    """Smooth random blobs: long, winding components that need many rounds."""
    gen = torch.Generator().manual_seed(seed)
    field = torch.randn(1, 1, *shape, generator=gen)
    for _ in range(2):
        field = torch.nn.functional.avg_pool3d(field, 3, 1, 1)
    return field[0, 0] > level


@unittest.skipUnless(KERNELS_RUN, f"the fused kernels do not run here: {unavailable_reason(DEVICE)}")
class TestRootLabelsTriton(unittest.TestCase):
    # (shape, connectivities): 1 to 4 axes; the last is the stack a VISTA3D merge labels (positive, empty,
    # negative) once its size-1 axis is dropped
    @parameterized.expand([((40,), (1,)), ((13, 11), (1, 2)), ((9, 10, 11), (1, 2, 3)), ((3, 6, 7, 8), (1, 3, 4))])
    def test_random_masks_equal_the_torch_rounds(self, shape, connectivities):
        gen = torch.Generator().manual_seed(sum(shape))
        for density in (0.2, 0.5):
            m = torch.rand(shape, generator=gen) < density
            for connectivity in connectivities:
                got = label_rounds.root_labels_triton(m.to(DEVICE), connectivity)
                self.assertEqual(got.dtype, torch.int32)
                self.assertTrue(torch.equal(got.cpu(), torch_rounds(m, connectivity)), (density, connectivity))

    def test_neighbours_along_some_axes(self):  # items stacked on the first axis: no neighbour across it
        m = torch.rand(3, 7, 6, 5, generator=torch.Generator().manual_seed(7)) < 0.5
        for connectivity in (1, 3):
            got = label_rounds.root_labels_triton(m.to(DEVICE), connectivity, axes=(1, 2, 3)).cpu()
            self.assertTrue(torch.equal(got, point_helpers._root_labels(m, connectivity, axes=(1, 2, 3))))

    def test_snake_takes_many_rounds(self):
        m = torch.zeros(15, 15, 3, dtype=torch.bool)  # one 6-connected path winding through every row
        for r in range(0, 15, 2):
            m[r, :, 1] = True
            if r + 1 < 15:
                m[r + 1, 14 if (r // 2) % 2 == 0 else 0, 1] = True
        got = label_rounds.root_labels_triton(m.to(DEVICE), 1).cpu()
        first = int(torch.nonzero(m.reshape(-1))[0])
        self.assertTrue(torch.equal(got[m], torch.full((int(m.sum()),), first, dtype=torch.int32)))
        self.assertTrue(torch.equal(got, torch_rounds(m, 1)))

    def test_empty_and_full(self):
        for m in (torch.zeros(4, 5, 6, dtype=torch.bool), torch.ones(4, 5, 6, dtype=torch.bool)):
            self.assertTrue(torch.equal(label_rounds.root_labels_triton(m.to(DEVICE), 3).cpu(), torch_rounds(m, 3)))

    @unittest.skipUnless(torch.cuda.is_available(), "a click's stack at full size: needs a CUDA GPU")
    def test_a_clicks_stack_equals_scipy(self):
        both = torch.stack([blobs((128, 128, 128), 1), torch.zeros(128, 128, 128, dtype=torch.bool),
                            blobs((128, 128, 128), 2, 0.1)])[:, None]
        for stack, items in ((both, False), (both[::2], True)):  # as a merge labels two rows; one row
            expected, n = point_helpers._label(stack, connectivity=3, items=items)  # on the CPU: scipy's
            got, m = point_helpers._label(stack.cuda(), connectivity=3, items=items)
            self.assertGreater(n, 10)
            self.assertEqual(m, n)
            self.assertTrue(torch.equal(got.cpu(), expected))

    @unittest.skipUnless(torch.cuda.is_available(), "millions of voxels at once: needs a CUDA GPU")
    def test_noise_at_full_size_equals_scipy_every_time(self):
        # a random network's foreground: salt and pepper near the percolation threshold, many tiny components and
        # one that spans the volume, as a click on random weights labels; the GPU's order differs from run to run
        gen = torch.Generator().manual_seed(11)
        for density in (0.3, 0.5):
            m = torch.rand(200, 160, 128, generator=gen) < density
            expected, n = point_helpers._label(m, connectivity=3)  # on the CPU: scipy's
            for _ in range(3):
                got, k = point_helpers._label(m.cuda(), connectivity=3)
                self.assertEqual(k, n)
                self.assertTrue(torch.equal(got.cpu(), expected), density)


@unittest.skipUnless(torch.cuda.is_available() and KERNELS_RUN, "the GPU labeller's kernels: needs a Hopper GPU")
class TestDispatch(unittest.TestCase):
    def test_a_gpu_mask_takes_the_kernels(self):
        m = blobs((20, 18, 16), 3).cuda()
        with mock.patch.object(label_rounds, "root_labels_triton", wraps=label_rounds.root_labels_triton) as rounds:
            labels, _ = point_helpers._label(m, connectivity=3)
        rounds.assert_called_once()
        self.assertTrue(torch.equal(labels.cpu(), point_helpers._label(m.cpu(), connectivity=3)[0]))


class TestSupported(unittest.TestCase):
    def test_what_the_kernels_take(self):
        cases = {(4, 5, 6): True, (2, 3, 4, 5): True, (2, 2, 2, 2, 2): False}
        with mock.patch.object(label_rounds, "interpreting", lambda: True), \
                mock.patch.object(label_rounds, "triton", object()):
            for shape, expected in cases.items():
                self.assertEqual(label_rounds.root_labels_triton_supported(torch.ones(shape, dtype=torch.bool)),
                                 expected, shape)
            self.assertFalse(label_rounds.root_labels_triton_supported(torch.ones(3, 3)))  # not a mask

    def test_nothing_without_triton(self):
        with mock.patch.object(label_rounds, "triton", None):
            self.assertFalse(label_rounds.root_labels_triton_supported(torch.ones(3, 3, dtype=torch.bool)))


if __name__ == "__main__":
    unittest.main()
