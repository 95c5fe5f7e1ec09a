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
"""VISTA3D.fuse(): the fused channels-last class branch against the module path."""

from __future__ import annotations

import copy
import pickle
import unittest
from unittest import mock

import torch
import torch.nn as nn
from parameterized import parameterized

from monai.networks.kernels import unavailable_reason
from monai.networks.kernels.conv3d_resident import resident_unavailable_reason
from monai.networks.nets import vista3d132, vista3d_fused
from monai.networks.nets.segresnet_ds import SegResNetDS2
from tests.networks.tiny_vista3d import build_tiny_vista3d

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CLASSES = torch.tensor([[1], [5], [7]])


def _logits(net, x, **kw):
    with torch.no_grad():
        return net(x, class_vector=CLASSES.to(x.device), transpose=True, **kw)


def _conv_spies():
    """Patches that count the fused path's calls of the Triton and of the resident-weight convolution."""
    return (
        mock.patch.object(vista3d_fused, "conv3x3x3", wraps=vista3d_fused.conv3x3x3),
        mock.patch.object(vista3d_fused, "conv3x3x3_resident", wraps=vista3d_fused.conv3x3x3_resident),
    )


class TestFusedReference(unittest.TestCase):
    """The fused data flow with the PyTorch reference norms, float32 on the CPU: the same function as the modules."""

    @parameterized.expand(
        [
            (dict(), 32, 2),
            (dict(feature_size=48, blocks_down=(1, 2, 1)), 24, 1),  # 48 channels padded to 64, 96 to 128
            (dict(feature_size=8, blocks_down=(1, 1)), 16, 3),
        ]
    )
    def test_equals_module_path(self, config, size, batch):
        torch.manual_seed(0)
        net = build_tiny_vista3d(**config).eval()
        x = torch.randn(batch, 1, size, size, size)
        expected = _logits(net, x)
        self.assertIs(net.fuse(kernels="torch"), net)
        self.assertTrue(net.fused)
        out = _logits(net, x)
        self.assertEqual(out.shape, expected.shape)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        net.fuse(False)
        self.assertFalse(net.fused)
        self.assertTrue(torch.equal(_logits(net, x), expected))

    def test_state_dict_and_new_weights(self):
        torch.manual_seed(0)
        net = build_tiny_vista3d().eval()
        keys = list(net.state_dict())
        net.fuse(kernels="torch")
        self.assertEqual(list(net.state_dict()), keys)
        x = torch.randn(1, 1, 16, 16, 16)
        _logits(net, x)  # fills the padded-weight cache
        torch.manual_seed(1)
        other = build_tiny_vista3d().eval()
        net.load_state_dict(other.state_dict())
        torch.testing.assert_close(_logits(net, x), _logits(other, x), rtol=1e-4, atol=1e-4)

    def test_copies_are_unfused(self):
        net = build_tiny_vista3d().eval().fuse(kernels="torch")
        for other in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
            self.assertFalse(other.fused)
            self.assertTrue(net.fused)
            x = torch.randn(1, 1, 16, 16, 16)
            torch.testing.assert_close(_logits(other, x), _logits(net, x), rtol=1e-4, atol=1e-4)

    def test_point_prompts_take_the_module_path(self):
        torch.manual_seed(0)
        net = build_tiny_vista3d().eval()
        x = torch.randn(1, 1, 16, 16, 16)
        points = dict(point_coords=torch.tensor([[[4, 5, 6]]]), point_labels=torch.tensor([[1]]))
        with torch.no_grad():
            expected = net(x, **points)
            net.fuse(kernels="torch")
            self.assertTrue(torch.equal(net(x, **points), expected))

    def test_autograd_falls_back_with_one_log_line(self):
        torch.manual_seed(0)
        net = build_tiny_vista3d().eval().fuse(kernels="torch")
        x = torch.randn(1, 1, 16, 16, 16)
        with self.assertLogs("monai.networks.nets.vista3d", level="WARNING") as logs:
            out = net(x, class_vector=CLASSES, transpose=True)
            net(x, class_vector=CLASSES, transpose=True)
        self.assertEqual(len(logs.output), 1)
        self.assertIn("no backward pass", logs.output[0])
        self.assertTrue(out.requires_grad)
        net.fuse(False)
        torch.testing.assert_close(out, net(x, class_vector=CLASSES, transpose=True), rtol=0, atol=0)

    def test_unsupported_layouts(self):
        net = build_tiny_vista3d(norm="batch")
        with self.assertRaisesRegex(NotImplementedError, "InstanceNorm3d"):
            net.fuse()
        net = build_tiny_vista3d()
        net.image_encoder = SegResNetDS2(
            init_filters=16, out_channels=16, blocks_down=(1, 1, 1), norm="instance", resolution=(1, 1, 3)
        )
        with self.assertRaisesRegex(NotImplementedError, "resolution"):
            net.fuse()
        with self.assertRaisesRegex(ValueError, "kernels must be one of"):
            build_tiny_vista3d().fuse(kernels="cuda")

    @parameterized.expand([(True, False), (False, False), (False, True)])
    def test_cudnn_benchmark_scoped(self, switch, caller_setting):
        net = build_tiny_vista3d().eval().fuse(kernels="torch")
        seen = []
        real_conv3d = vista3d_fused.F.conv3d

        def spy(*args, **kwargs):
            seen.append(torch.backends.cudnn.benchmark)
            return real_conv3d(*args, **kwargs)

        before = torch.backends.cudnn.benchmark
        try:
            torch.backends.cudnn.benchmark = caller_setting
            with mock.patch.object(vista3d_fused, "CUDNN_BENCHMARK", switch), mock.patch.object(
                vista3d_fused.F, "conv3d", spy
            ):
                _logits(net, torch.randn(1, 1, 32, 32, 32))
            self.assertTrue(seen)
            self.assertEqual(set(seen), {switch or caller_setting})  # on inside the forward when switched on
            self.assertEqual(torch.backends.cudnn.benchmark, caller_setting)  # the caller's setting after it
        finally:
            torch.backends.cudnn.benchmark = before

    def test_resident_kernel_unavailable_is_logged_once(self):
        branch = vista3d_fused.FusedClassBranch(build_tiny_vista3d(feature_size=48).eval(), cuda_graphs=False)
        conv = nn.Conv3d(48, 48, 3, padding=1, bias=False)
        x = torch.zeros(1, 64, 4, 4, 4, dtype=torch.float16)
        with mock.patch.object(vista3d_fused, "resident_unavailable_reason", return_value="no such GPU here"):
            with self.assertLogs(vista3d_fused.logger, "WARNING") as logs:
                self.assertFalse(branch._resident(conv, x))
                self.assertFalse(branch._resident(conv, x))
        self.assertEqual(len(logs.output), 1)
        self.assertIn("no such GPU here", logs.output[0])
        with mock.patch.object(vista3d_fused, "resident_unavailable_reason", return_value=None):
            self.assertTrue(branch._resident(conv, x))
            self.assertFalse(branch._resident(nn.Conv3d(48, 96, 3, padding=1, bias=False), x))  # 48 -> 48 only

    def test_shape_check(self):
        net = build_tiny_vista3d().eval().fuse(kernels="torch")
        with self.assertRaisesRegex(ValueError, "divisible"):
            _logits(net, torch.randn(1, 1, 16, 16, 15))


@unittest.skipUnless(
    unavailable_reason(DEVICE) is None, f"the fused kernels do not run here: {unavailable_reason(DEVICE)}"
)
class TestFusedKernels(unittest.TestCase):
    """The fused path with the Triton kernels (on the GPU, or in Triton's CPU interpreter)."""

    def test_tiny_network(self):
        torch.manual_seed(0)
        net = build_tiny_vista3d().eval().to(DEVICE)
        x = torch.randn(2, 1, 16, 16, 16, device=DEVICE)
        tf32 = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False  # float32 convolutions on both paths, so only the kernels differ
        try:
            expected = _logits(net, x)
            out = _logits(net.fuse(), x)
        finally:
            torch.backends.cudnn.allow_tf32 = tf32
        torch.testing.assert_close(out, expected, rtol=2e-3, atol=2e-3)

    def test_triton_convolutions_fp16(self):
        # 48 channels: the full-resolution convolutions (encoder and decoder level 0: 2 each, class head: 4) and the
        # 96-channel ones of level 1 (2) take the Triton implicit GEMM with the statistics and residual epilogues,
        # except the eight 48-channel ones (with a residual or without) where the resident-weight kernel runs
        # (Hopper); fp16 against the float32 modules
        torch.manual_seed(0)
        net = build_tiny_vista3d(feature_size=48, blocks_down=(1, 1)).eval().to(DEVICE)
        x = torch.randn(1, 1, 8, 8, 12, device=DEVICE)
        expected = _logits(net, x)
        net.fuse(cuda_graphs=False)  # a graph capture runs the forward twice
        triton_spy, gluon_spy = _conv_spies()
        with triton_spy as conv, gluon_spy as gluon:
            out = _logits(net, x.half()).float()
        resident = 8 if resident_unavailable_reason(DEVICE) is None else 0
        self.assertEqual((conv.call_count, gluon.call_count), (10 - resident, resident))
        self.assertLess(((out - expected).norm() / expected.norm()).item(), 5e-3)
        self.assertGreater((out.argmax(1) == expected.argmax(1)).double().mean().item(), 0.99)

    @unittest.skipUnless(torch.cuda.is_available(), "CUDA graphs need a GPU")
    def test_cuda_graphs(self):
        torch.manual_seed(0)
        net = build_tiny_vista3d().eval().to(DEVICE)
        x1, x2 = torch.randn(2, 1, 32, 32, 32, device=DEVICE), torch.randn(2, 1, 32, 32, 32, device=DEVICE)
        with torch.autocast("cuda", dtype=torch.float16):
            eager1, eager2 = _logits(net.fuse(cuda_graphs=False), x1), _logits(net, x2)
            net.fuse()
            out1 = _logits(net, x1)
            out2 = _logits(net, x2)  # a replay must not overwrite what the first call returned
            self.assertEqual(len(net._fused.graphs), 1)
            torch.testing.assert_close(out1, eager1, rtol=0, atol=0)
            torch.testing.assert_close(out2, eager2, rtol=0, atol=0)
            with torch.no_grad():  # changed weights: the graphs are recaptured
                net.class_head.image_post_mapping[0].layer.conv1.conv.weight.mul_(0.5)
            changed = _logits(net, x1)
            net.fuse(cuda_graphs=False)
            torch.testing.assert_close(changed, _logits(net, x1), rtol=0, atol=0)
        self.assertGreater((changed - out1).abs().max().item(), 0)

    @unittest.skipUnless(torch.cuda.is_available(), "vista3d132 in fp16 needs a GPU")
    def test_vista3d132_fp16(self):
        torch.manual_seed(0)
        net = vista3d132().eval().to(DEVICE)
        x = torch.rand(2, 1, 96, 96, 96, device=DEVICE)
        with torch.autocast("cuda", dtype=torch.float16):
            expected = _logits(net, x).float()
            out = _logits(net.fuse(), x).float()
        rel = ((out - expected).norm() / expected.norm()).item()
        self.assertLess(rel, 5e-3)  # fp16 rounding through ~40 layers of a random network
        same = (out.argmax(1) == expected.argmax(1)).double().mean().item()
        self.assertGreater(same, 0.99)


@unittest.skipUnless(
    resident_unavailable_reason(DEVICE) is None,
    f"the resident-weight convolution does not run here: {resident_unavailable_reason(DEVICE)}",
)
class TestFusedResidentConv(unittest.TestCase):
    """The fused path with the resident-weight Gluon convolution (Hopper GPUs only)."""

    def test_network_48_channels(self):
        # feature_size 48: the 48-channel convolutions (encoder and decoder level 0: conv1 without a residual and
        # conv2 with one, 2 each; class head: 4) take the resident-weight kernel, the 96-channel ones of level 1 (2)
        # the Triton kernel; two windows (per-sample statistics), a shape no tile divides
        torch.manual_seed(0)
        net = build_tiny_vista3d(feature_size=48, blocks_down=(1, 1)).eval().to(DEVICE)
        x = torch.randn(2, 1, 10, 20, 22, device=DEVICE)
        expected = _logits(net, x)
        net.fuse(cuda_graphs=False)
        triton_spy, gluon_spy = _conv_spies()
        with triton_spy as conv, gluon_spy as gluon:
            out = _logits(net, x.half()).float()
        self.assertEqual((conv.call_count, gluon.call_count), (2, 8))
        # the two level-0 conv2 calls pass the block's input as the residual, the others none
        with_residual = [c.kwargs.get("residual") is not None for c in gluon.call_args_list]
        self.assertEqual(sum(with_residual), 2)
        self.assertLess(((out - expected).norm() / expected.norm()).item(), 5e-3)
        self.assertGreater((out.argmax(1) == expected.argmax(1)).double().mean().item(), 0.99)
        # the same forward with the Triton kernel in its place
        with mock.patch.object(vista3d_fused, "RESIDENT_CONV", False):
            with mock.patch.object(vista3d_fused, "conv3x3x3_resident") as gluon:
                triton_out = _logits(net, x.half()).float()
            gluon.assert_not_called()
        self.assertLess(((out - triton_out).norm() / triton_out.norm()).item(), 5e-3)
        # replayed as a CUDA graph: the same logits as the eager forward
        net.fuse()
        torch.testing.assert_close(_logits(net, x.half()).float(), out, rtol=0, atol=0)


if __name__ == "__main__":
    unittest.main()
