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
"""The helpers of ``vista3d_fused.py``: where the GPU is busy and waits between kernels, its ``--triton-conv``
choices."""

import contextlib
import io
import types
import unittest

from torch.autograd import DeviceType

from monai.networks.kernels.conv3d import FUSED_LAUNCHES
from monai.networks.kernels.conv_transpose3d import UPSAMPLE_LAUNCH
from tests.benchmarks.vista3d_fused import conv_tables, idle_before_kinds, kernel_gaps, kind_of, longest_gaps, main


def _event(name: str, start: float, end: float, device=DeviceType.CUDA):
    """A profiler event's fields the helpers read (times in microseconds)."""
    return types.SimpleNamespace(name=name, device_type=device, time_range=types.SimpleNamespace(start=start, end=end))


class TestIdle(unittest.TestCase):
    def test_kinds(self):
        self.assertEqual(kind_of("_resident_conv_kernel"), "3x3x3 convolution, resident weights (Gluon)")
        self.assertEqual(kind_of("sm90_xmma_fprop_implicit_gemm_f16f16"), "convolution")
        self.assertEqual(kind_of("_apply_kernel"), "norm apply (Triton)")
        self.assertEqual(kind_of("something else"), "other")

    def test_gaps_by_the_kernel_after_them(self):
        events = [
            _event("_apply_kernel", 0, 100),
            _event("aten::conv3d", 90, 400, DeviceType.CPU),  # host events are not the GPU's
            _event("sm90_xmma_fprop", 110, 300),  # 10 us idle before a cuDNN convolution
            _event("_stats_kernel", 250, 320),  # overlaps the one before it: no gap
            _event("_apply_kernel", 350, 400),  # 30 us idle before an apply pass
            _event("sm90_xmma_fprop", 1400, 1500),  # 1000 us
        ]
        span, gaps = kernel_gaps(events)
        idle = idle_before_kinds(gaps)
        self.assertEqual(list(idle), ["convolution", "norm apply (Triton)"])  # the longest idle first
        self.assertEqual(idle["convolution"][0], 2)
        self.assertAlmostEqual(idle["convolution"][1], 1.010)
        self.assertEqual(idle["norm apply (Triton)"][0], 1)
        self.assertAlmostEqual(idle["norm apply (Triton)"][1], 0.030)
        self.assertAlmostEqual(span, 1500)  # microseconds, first kernel start to last end
        self.assertAlmostEqual(sum(g[1] for g in gaps), 1040)  # the same idle time, in total
        self.assertEqual(kernel_gaps([]), (0.0, []))
        self.assertEqual(idle_before_kinds([]), {})
        # each stretch names the kernel that ended last before it (not the one that started last) and when it began
        self.assertEqual(
            longest_gaps(gaps, 2),
            [("sm90_xmma_fprop", 1000, "_apply_kernel", 400), ("_apply_kernel", 30, "_stats_kernel", 320)],
        )


class TestConvChoices(unittest.TestCase):
    def test_pairs_take_both_launches(self):
        tables = conv_tables()
        pair = tables["up8x8+96x8x8"]
        self.assertEqual(pair["upsample_launches"], tables["up8x8"]["upsample_launches"])
        self.assertEqual(pair["triton_launches"], tables["96x8x8"]["triton_launches"])
        self.assertEqual(pair["triton_launches"][64], FUSED_LAUNCHES[64])  # the 48-channel launch stays the default
        self.assertNotEqual(pair["upsample_launches"][64], UPSAMPLE_LAUNCH)

    def test_a_choice_named_twice_is_refused(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as raised:
            main(["--device", "cpu", "--forward", "--triton-conv", "default,up2s,default"])
        self.assertEqual(raised.exception.code, 2)
        self.assertIn("a choice named twice", err.getvalue())


if __name__ == "__main__":
    unittest.main()
