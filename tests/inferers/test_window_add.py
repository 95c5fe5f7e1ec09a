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
"""The window-add kernel of the sliding-window stitch against PyTorch's addcmul_, and the stitch through it."""

from __future__ import annotations

import subprocess
import sys
import unittest

import torch
from parameterized import parameterized

from monai.inferers import SlidingWindowInferer, SlidingWindowInfererAdapt, sliding_window_inference
from monai.inferers.window_add import add_window, add_window_supported
from monai.networks.kernels import unavailable_reason
from tests.subprocess_env import ROOT, child_env

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNELS_RUN = unavailable_reason(DEVICE) is None


@unittest.skipUnless(KERNELS_RUN, f"the fused kernels do not run here: {unavailable_reason(DEVICE)}")
class TestAddWindow(unittest.TestCase):
    # (target dtype, source dtype, with a weight map, window [C, D, H, W]); W of 5 and 20 are not powers of two
    @parameterized.expand(
        [
            (torch.float32, torch.float16, True, (3, 4, 6, 20)),
            (torch.float32, torch.float16, False, (2, 5, 3, 8)),
            (torch.float32, torch.float32, True, (1, 2, 2, 5)),
            (torch.float16, torch.float16, True, (4, 3, 5, 16)),
        ]
    )
    def test_equals_addcmul(self, t_dtype, s_dtype, weighted, window):
        g = torch.Generator().manual_seed(sum(window))
        c, d, h, w = window
        result = torch.randn(2, c, d + 3, h + 2, w + 4, generator=g).to(DEVICE, t_dtype)
        src = torch.randn(1, c, d, h, w, generator=g).to(DEVICE, s_dtype)
        weight = torch.rand(1, 1, d, h, w, generator=g).to(DEVICE) if weighted else None
        idx = (slice(1, 2), slice(None), slice(2, 2 + d), slice(1, 1 + h), slice(3, 3 + w))  # a strided slice
        expected = result.clone()
        if weighted:
            expected[idx] = (expected[idx].float() + src.float() * weight).to(t_dtype)
        else:
            expected[idx] = (expected[idx].float() + src.float()).to(t_dtype)
        self.assertTrue(add_window_supported(result[idx], src, weight))
        add_window(result[idx], src, weight)
        tol = 1e-6 if t_dtype == torch.float32 else 1e-3
        torch.testing.assert_close(result, expected, rtol=tol, atol=tol)  # outside the slice: untouched

    def test_unsupported(self):
        target = torch.zeros(1, 2, 3, 4, 5, device=DEVICE)
        src = torch.ones(1, 2, 3, 4, 5, device=DEVICE)
        cases = [
            (target[..., ::2], src[..., ::2].contiguous(), None),  # rows not contiguous in the target
            (target, src.transpose(3, 4).contiguous().transpose(3, 4), None),  # a source not contiguous
            (target, src, torch.ones(1, 2, 3, 4, 5, device=DEVICE)),  # a weight per channel
            (target, src[:, :1], None),  # shapes differ
        ]
        for t, s, w in cases:
            self.assertFalse(add_window_supported(t, s, w))
            with self.assertRaisesRegex(ValueError, "add_window takes"):
                add_window(t, s, w)


@unittest.skipUnless(torch.cuda.is_available() and KERNELS_RUN, "the stitch uses the kernel on CUDA tensors")
class TestStitchThroughTheKernel(unittest.TestCase):
    def test_sliding_window_equals_pytorch_stitch(self):
        from unittest import mock

        from monai.inferers import window_add

        x = torch.randn(1, 3, 40, 36, 30, device="cuda")
        net = torch.nn.Conv3d(3, 5, 3, padding=1).cuda().half()
        inferer = SlidingWindowInferer((16, 16, 16), 3, overlap=0.25, mode="gaussian", window_add=True)

        def run():
            with torch.no_grad():
                return inferer(x.half(), net)

        with mock.patch.object(window_add, "add_window", wraps=window_add.add_window) as spy:
            fused = run()
        self.assertGreater(spy.call_count, 0)
        with mock.patch.object(window_add, "add_window_supported", return_value=False):
            plain = run()
        torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)


def _add_in_torch(target, src, weight=None):
    """What the kernel computes, in PyTorch: the spy's body on a machine without the kernel."""
    target.add_(src if weight is None else src * weight)
    return target


class TestWindowAddIsASetting(unittest.TestCase):
    """The generic stitch adds in PyTorch; only an inferer told ``window_add=True`` (the fused path) uses the kernel."""

    def _stitch(self, run):
        from unittest import mock

        from monai.inferers import window_add

        x = torch.randn(1, 2, 20, 18, 14)
        net = torch.nn.Conv3d(2, 3, 3, padding=1)
        with mock.patch.object(window_add, "add_window_supported", return_value=True):  # as on a GPU with Triton
            with mock.patch.object(window_add, "add_window", side_effect=_add_in_torch) as spy:
                with torch.no_grad():
                    out = run(x, net)
        with torch.no_grad():
            plain = sliding_window_inference(x, (8, 8, 8), 2, net, overlap=0.25, mode="gaussian")
        torch.testing.assert_close(out, plain)
        return spy.call_count

    def test_generic_stitch_does_not_call_the_kernel(self):
        self.assertEqual(self._stitch(lambda x, net: sliding_window_inference(x, 8, 2, net, 0.25, "gaussian")), 0)
        self.assertEqual(self._stitch(lambda x, net: SlidingWindowInferer(8, 2, 0.25, "gaussian")(x, net)), 0)

    def test_told_stitch_calls_the_kernel(self):
        inferer = SlidingWindowInfererAdapt(8, 2, 0.25, "gaussian", window_add=True)
        self.assertGreater(self._stitch(lambda x, net: inferer(x, net)), 0)

    @parameterized.expand([({}, True), ({"window_add": False}, False), ({"kernels": "torch"}, False)])
    def test_fused_config(self, fields, on):
        from monai.networks.kernels.dispatch import FusedConfig

        self.assertIs(FusedConfig(**fields).stitch_window_add, on)


# a sliding-window pass without the kernel, in a fresh process: which of Triton's modules it imported
_WITHOUT_KERNEL = """
import sys
import torch
from monai.inferers import SlidingWindowInferer
SlidingWindowInferer((8, 8, 8), 2, 0.25, "gaussian")(torch.rand(1, 1, 12, 10, 9), lambda w: w * 2)
print(sorted(name for name in sys.modules if name == "triton" or name.startswith("triton.")))
"""


class TestTritonOnlyForTheKernel(unittest.TestCase):
    def test_a_pass_without_the_kernel_imports_no_triton(self):
        # Triton's import costs ~0.2 s, a CPU or module-path run has no use for it
        done = subprocess.run([sys.executable, "-c", _WITHOUT_KERNEL], cwd=ROOT, env=child_env(), capture_output=True,
                              text=True, timeout=300)
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        self.assertEqual(done.stdout.strip().splitlines()[-1], "[]")


if __name__ == "__main__":
    unittest.main()
