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
import dataclasses
import pickle
import threading
import time
import unittest
from unittest import mock

import torch
from parameterized import parameterized

from monai.networks.kernels import dispatch, unavailable_reason
from monai.networks.kernels.class_product import norm_act_product
from monai.networks.kernels.conv3d_resident import resident_unavailable_reason
from monai.networks.kernels.dispatch import FusedConfig
from monai.networks.nets import vista3d132
from monai.networks.nets.segresnet_ds import SegResNetDS2
from tests.networks.tiny_vista3d import build_tiny_vista3d

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CLASSES = torch.tensor([[1], [5], [7]])
TORCH = FusedConfig(kernels="torch")  # the PyTorch reference of the kernels: any device
EAGER = FusedConfig(graph_max_windows=0)  # no CUDA graphs (a capture runs the forward twice)


def _logits(net, x, **kw):
    with torch.no_grad():
        return net(x, class_vector=CLASSES.to(x.device), transpose=True, **kw)


def _conv_spies():
    """Patches that count the fused path's calls of the Triton and of the resident-weight convolution."""
    return (
        mock.patch.object(dispatch, "conv3x3x3", wraps=dispatch.conv3x3x3),
        mock.patch.object(dispatch, "conv3x3x3_resident", wraps=dispatch.conv3x3x3_resident),
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
        self.assertIs(net.fuse(TORCH), net)
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
        net.fuse(TORCH)
        self.assertEqual(list(net.state_dict()), keys)
        x = torch.randn(1, 1, 16, 16, 16)
        _logits(net, x)  # fills the padded-weight cache
        torch.manual_seed(1)
        other = build_tiny_vista3d().eval()
        net.load_state_dict(other.state_dict())
        torch.testing.assert_close(_logits(net, x), _logits(other, x), rtol=1e-4, atol=1e-4)

    def test_copies_are_unfused(self):
        net = build_tiny_vista3d().eval().fuse(TORCH)
        for other in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
            self.assertFalse(other.fused)
            self.assertTrue(net.fused)
            x = torch.randn(1, 1, 16, 16, 16)
            torch.testing.assert_close(_logits(other, x), _logits(net, x), rtol=1e-4, atol=1e-4)

    @parameterized.expand(
        [
            ("points", dict(), False),
            ("edit", dict(class_vector=[[3]], prompt_class=[[3]]), False),
            ("special_zero_shot", dict(prompt_class=[[140]]), False),  # labels 2/3, the zero-shot token
            ("window_prev_mask", dict(patch_coords="window", prev_mask="prev"), False),
            ("window_edit", dict(patch_coords="window", class_vector=[[1]], prompt_class=[[1]]), False),
            ("feature_cache", dict(patch_coords="window", keep_cache=True), True),
        ]
    )
    def test_clicks_equal_module_path(self, _, prompts, cached):
        # clicks run the encoder and the point decoder (with a class prompt, the class branch too) on the fused path
        # and the point head on its modules: the same logits as the module path
        torch.manual_seed(0)
        net = build_tiny_vista3d().eval()
        x = torch.randn(1, 1, 32, 16, 16)
        special = prompts.get("prompt_class") == [[140]]
        kw = dict(point_coords=torch.tensor([[[20, 4, 9], [6, 10, 3]]]), point_labels=torch.tensor([[1, 0]]) + 2 * special)
        kw.update({k: torch.tensor(v) for k, v in prompts.items() if k in ("class_vector", "prompt_class")})
        if "patch_coords" in prompts:  # the window at (2, 3, 1) of a padded 36 x 20 x 18 image
            kw["patch_coords"] = [(slice(None), slice(None), slice(2, 34), slice(3, 19), slice(1, 17))]
            kw["point_coords"] = kw["point_coords"] + torch.tensor([2, 3, 1])
        if "prev_mask" in prompts:
            kw["prev_mask"] = torch.randn(1, 1, 36, 20, 18)
        with torch.no_grad():
            expected = net(x, transpose=True, **kw)
        net.fuse(TORCH)
        branch = "class_and_point" if "class_vector" in kw else "point"
        with torch.no_grad(), mock.patch.object(net._fused, branch, wraps=getattr(net._fused, branch)) as spy:
            out = net(x, transpose=True, keep_cache=cached, **kw)
            if cached:  # the window's point features are kept and used again: the encoder runs once
                self.assertIsNotNone(net.image_embeddings)
                again = net(x, transpose=True, keep_cache=True, **kw)
                torch.testing.assert_close(again, out, rtol=0, atol=0)
        self.assertEqual(spy.call_count, 1)
        self.assertEqual(out.shape, expected.shape)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        if "prev_mask" in kw:  # where the clicks' regions leave it, the previous mask is kept
            self.assertTrue((out == kw["prev_mask"][kw["patch_coords"][0]]).any())
        net.image_embeddings = None
        net.fuse(False)
        with torch.no_grad():
            self.assertTrue(torch.equal(net(x, transpose=True, **kw), expected))

    def test_point_features_are_new_tensors(self):
        # the point head and a feature cache keep the point features past the next call: never a graph's buffer
        torch.manual_seed(0)
        net = build_tiny_vista3d().eval().fuse(TORCH)
        x = torch.randn(1, 1, 16, 16, 16)
        with torch.no_grad():
            first = net._fused.point(x)
            kept = first.clone()
            second = net._fused.point(torch.randn(1, 1, 16, 16, 16))
            _, point = net._fused.class_and_point(x, CLASSES[:1])
            reference, _ = net.image_encoder(x, with_point=True, with_label=False)
        self.assertNotEqual(first.data_ptr(), second.data_ptr())
        self.assertTrue(torch.equal(first, kept))
        self.assertEqual(first.shape, (1, 16, 16, 16, 16))  # the real channels, as the point head reads them
        torch.testing.assert_close(first, reference, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(point, reference, rtol=1e-4, atol=1e-4)

    def test_autograd_falls_back_with_one_log_line(self):
        torch.manual_seed(0)
        net = build_tiny_vista3d().eval().fuse(TORCH)
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
            build_tiny_vista3d().fuse(FusedConfig(kernels="cuda"))
        with self.assertRaisesRegex(TypeError, "config must be a FusedConfig, got dict"):
            build_tiny_vista3d().fuse({"kernels": "torch"})

    def test_config_is_resolved_once(self):
        net = build_tiny_vista3d().eval()
        self.assertIsNone(net.fused_config)
        self.assertEqual(net.fuse().fused_config, FusedConfig())  # no argument: the installed Triton's defaults
        self.assertIs(net.fuse(True).fused_config.kernels, "triton")
        self.assertIs(net.fuse(TORCH).fused_config, TORCH)
        # slab loads asked of a Triton outside the measured table are refused when fusing, not at the first forward
        with mock.patch.object(dispatch, "slab_loads_supported", return_value=False):
            with self.assertRaisesRegex(ValueError, "resident_conv='slabs' needs a Triton"):
                net.fuse(FusedConfig(resident_conv="slabs"))
            reference = FusedConfig(kernels="torch", resident_conv="slabs")  # builds no Gluon kernel
            self.assertIs(net.fuse(reference).fused_config, reference)
        self.assertIsNone(net.fuse(False).fused_config)

    @parameterized.expand([(True, False), (False, False), (False, True), (True, True)])
    def test_cudnn_autotune_first_call_only(self, autotune, caller_setting):
        # cuDNN times its algorithms on the first call of each input shape only (its plans stay cached per shape);
        # every other call, and the caller after each call, see the caller's own setting
        net = build_tiny_vista3d().eval().fuse(dataclasses.replace(TORCH, cudnn_autotune=autotune))
        seen = []
        real_conv3d = torch.nn.functional.conv3d

        def spy(*args, **kwargs):
            seen.append(torch.backends.cudnn.benchmark)
            return real_conv3d(*args, **kwargs)

        before = torch.backends.cudnn.benchmark
        try:
            torch.backends.cudnn.benchmark = caller_setting
            with mock.patch.object(torch.nn.functional, "conv3d", spy):
                for size, first in ((32, True), (32, False), (16, True), (32, False)):
                    seen.clear()
                    _logits(net, torch.randn(1, 1, size, size, size))
                    self.assertTrue(seen)
                    self.assertEqual(set(seen), {(autotune and first) or caller_setting}, f"{size}^3, first {first}")
                    self.assertEqual(torch.backends.cudnn.benchmark, caller_setting)  # the caller's after each call
        finally:
            torch.backends.cudnn.benchmark = before

    def test_first_kernel_waits_for_the_prefetched_hash(self):
        # a kernel launched while the prefetched hash of Triton runs would hash Triton again on its own thread
        from monai.networks.nets import vista3d_fused
        from monai.utils import triton_cache_key

        order = []
        hashing = threading.Thread(target=lambda: time.sleep(0.2) or order.append("hashed"))
        real_first_conv = vista3d_fused.FusedClassBranch._first_conv

        def first_conv(branch, conv, x):
            order.append("first convolution")
            return real_first_conv(branch, conv, x)

        net = build_tiny_vista3d().eval().fuse(TORCH)
        with mock.patch.object(triton_cache_key, "_cache_key_thread", hashing), \
                mock.patch.object(vista3d_fused.FusedClassBranch, "_first_conv", first_conv):
            hashing.start()
            _logits(net, torch.randn(1, 1, 32, 32, 32))
        self.assertEqual(order, ["hashed", "first convolution"])

    def test_shape_check(self):
        net = build_tiny_vista3d().eval().fuse(TORCH)
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

    def test_clicks(self):
        # point-only and class + point prompts with the Triton kernels: the module path's logits
        torch.manual_seed(0)
        net = build_tiny_vista3d().eval().to(DEVICE)
        x = torch.randn(1, 1, 16, 16, 16, device=DEVICE)
        clicks = dict(point_coords=torch.tensor([[[4, 5, 6], [11, 9, 3]]]), point_labels=torch.tensor([[1, 0]]))
        prompts = [clicks, dict(clicks, class_vector=torch.tensor([[5]]), prompt_class=torch.tensor([[5]]))]
        tf32 = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        try:
            with torch.no_grad():
                expected = [net(x, **kw) for kw in prompts]
                net.fuse(EAGER)
                with mock.patch.object(net._fused, "_encode", wraps=net._fused._encode) as encode:
                    out = [net(x, **kw) for kw in prompts]
        finally:
            torch.backends.cudnn.allow_tf32 = tf32
        self.assertEqual(encode.call_count, 2)
        for o, e in zip(out, expected):
            torch.testing.assert_close(o, e, rtol=2e-3, atol=2e-3)

    def test_triton_convolutions_fp16(self):
        # 48 channels: the full-resolution convolutions (encoder and decoder level 0: 2 each, class head: 4) and the
        # 96-channel ones of level 1 (2) take the Triton implicit GEMM with the statistics and residual epilogues,
        # except the eight 48-channel ones (with a residual or without) where the resident-weight kernel runs
        # (Hopper); fp16 against the float32 modules
        torch.manual_seed(0)
        net = build_tiny_vista3d(feature_size=48, blocks_down=(1, 1)).eval().to(DEVICE)
        x = torch.randn(1, 1, 8, 8, 12, device=DEVICE)
        expected = _logits(net, x)
        net.fuse(EAGER)  # a graph capture runs the forward twice
        triton_spy, gluon_spy = _conv_spies()
        upsample_spy = mock.patch.object(dispatch, "conv_transpose3x3x3", wraps=dispatch.conv_transpose3x3x3)
        with triton_spy as conv, gluon_spy as gluon, upsample_spy as upsample:
            out = _logits(net, x.half()).float()
        resident = 8 if resident_unavailable_reason(DEVICE) is None else 0
        self.assertEqual((conv.call_count, gluon.call_count), (10 - resident, resident))
        self.assertEqual(upsample.call_count, 1)  # the class decoder's 96 -> 48 upsampling, with its skip add
        self.assertLess(((out - expected).norm() / expected.norm()).item(), 5e-3)
        self.assertGreater((out.argmax(1) == expected.argmax(1)).double().mean().item(), 0.99)

    def test_norm_in_product(self):
        # the class features' last norm inside the class product: the logits of the norm's pass then the product.
        # fp16 class prompts take the kernel; float32 class + point prompts (the features come with the point
        # branch's) take the norm's pass and the product
        torch.manual_seed(0)
        net = build_tiny_vista3d(feature_size=48, blocks_down=(1, 1)).eval().to(DEVICE)
        x = torch.randn(1, 1, 8, 8, 12, device=DEVICE)
        clicks = dict(point_coords=torch.tensor([[[4, 5, 6]]]), point_labels=torch.tensor([[1]]))
        calls = [(x.half(), dict(class_vector=CLASSES.to(DEVICE))), (x, dict(clicks, class_vector=torch.tensor([[5]])))]
        with torch.no_grad():
            net.fuse(dataclasses.replace(EAGER, norm_in_product=False))
            expected = [net(image, transpose=True, **kw).float() for image, kw in calls]
            net.fuse(EAGER)  # (the default: the norm inside the product)
            spy = mock.patch("monai.networks.nets.vista3d_fused.norm_act_product", wraps=norm_act_product)
            with spy as product:
                out = [net(image, transpose=True, **kw).float() for image, kw in calls]
        self.assertEqual(product.call_count, 1)
        for o, e in zip(out, expected):
            self.assertLess(((o - e).norm() / e.norm()).item(), 1e-3)  # the same fp16 features; the sums' order

    @unittest.skipUnless(resident_unavailable_reason(DEVICE) is None, "the resident-weight kernel needs a Hopper GPU")
    def test_resident_96(self):
        # the 96-channel convolutions as four resident calls on channel slices: the Triton kernel's logits up to
        # the partial sums' extra fp16 rounding
        torch.manual_seed(0)
        net = build_tiny_vista3d(feature_size=48, blocks_down=(1, 1)).eval().to(DEVICE)
        x = torch.randn(1, 1, 16, 16, 16, device=DEVICE).half()
        expected = _logits(net.fuse(EAGER), x).float()
        spy = mock.patch.object(dispatch, "_quartered", wraps=dispatch._quartered)
        with spy as quartered:
            out = _logits(net.fuse(dataclasses.replace(EAGER, resident_96=True)), x).float()
        self.assertEqual(quartered.call_count, 2)  # the bottom level's block: conv1 and conv2 (with its residual)
        self.assertLess(((out - expected).norm() / expected.norm()).item(), 2e-3)
        self.assertGreater((out.argmax(1) == expected.argmax(1)).double().mean().item(), 0.99)

    @unittest.skipUnless(torch.cuda.is_available(), "CUDA graphs need a GPU")
    def test_cuda_graphs(self):
        torch.manual_seed(0)
        net = build_tiny_vista3d().eval().to(DEVICE)
        x1, x2 = torch.randn(2, 1, 32, 32, 32, device=DEVICE), torch.randn(2, 1, 32, 32, 32, device=DEVICE)
        with torch.autocast("cuda", dtype=torch.float16):
            eager1, eager2 = _logits(net.fuse(EAGER), x1), _logits(net, x2)
            net.fuse()
            out1 = _logits(net, x1)
            out2 = _logits(net, x2)  # a replay must not overwrite what the first call returned
            self.assertEqual(len(net._fused.run), 1)
            torch.testing.assert_close(out1, eager1, rtol=0, atol=0)
            torch.testing.assert_close(out2, eager2, rtol=0, atol=0)
            # a batch over the configured limit runs eagerly: no graph
            net.fuse(FusedConfig(graph_max_windows=1))
            torch.testing.assert_close(_logits(net, x1), eager1, rtol=0, atol=0)
            self.assertEqual(len(net._fused.run), 0)
            net.fuse()
            with torch.no_grad():  # changed weights: the graphs are recaptured
                net.class_head.image_post_mapping[0].layer.conv1.conv.weight.mul_(0.5)
            changed = _logits(net, x1)
            net.fuse(EAGER)
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
        net.fuse(EAGER)
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
        net.fuse(dataclasses.replace(EAGER, resident_conv="off"))
        with mock.patch.object(dispatch, "conv3x3x3_resident") as gluon:
            triton_out = _logits(net, x.half()).float()
        gluon.assert_not_called()
        self.assertLess(((out - triton_out).norm() / triton_out.norm()).item(), 5e-3)
        # where this Triton builds the slab loads (the default then), the patch loads are held to the same fp16
        # bound against float32 as the slab loads. Not to a bound between the two forms: they sum in another order,
        # so an fp16 output one ulp apart in one layer moves every later layer (1.07e-3 seen on an H200, Triton 3.6)
        if EAGER.resident_conv == "slabs":
            net.fuse(dataclasses.replace(EAGER, resident_conv="patches"))
            patches_out = _logits(net, x.half()).float()
            self.assertLess(((patches_out - expected).norm() / expected.norm()).item(), 5e-3)
            self.assertGreater((patches_out.argmax(1) == expected.argmax(1)).double().mean().item(), 0.99)
        # replayed as a CUDA graph: the same logits as the eager forward
        net.fuse()
        torch.testing.assert_close(_logits(net, x.half()).float(), out, rtol=0, atol=0)


if __name__ == "__main__":
    unittest.main()
