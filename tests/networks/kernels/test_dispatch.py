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
"""The fused path's configuration (its defaults, checks, immutability) and the choice of a 3x3x3 convolution's kernel
between the resident-weight Gluon, the Triton and the cuDNN convolution, on any machine."""

from __future__ import annotations

import dataclasses
import pickle
import unittest
from unittest import mock

import torch
import torch.nn as nn
import torch.nn.functional as F
from parameterized import parameterized

from monai.networks.kernels import dispatch
from monai.networks.kernels.conv3d import FUSED_LAUNCHES, ConvLaunch
from monai.networks.kernels.dispatch import (
    FusedConfig,
    check_config,
    choose_conv3x3x3,
    conv3x3x3_dispatch,
    upsample_add_dispatch,
)
from monai.networks.kernels.padded_weights import PaddedWeights, padded_channels


def _conv(c_in: int, c_out: int, **kwargs) -> nn.Conv3d:
    return nn.Conv3d(c_in, c_out, kwargs.pop("kernel_size", 3), **{"padding": 1, "bias": False, **kwargs})


def _x(channels: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.zeros(1, channels, 4, 4, 4, dtype=dtype).contiguous(memory_format=torch.channels_last_3d)


class TestFusedConfig(unittest.TestCase):
    def test_defaults_follow_the_installed_triton(self):
        for supported, form in ((True, "slabs"), (False, "patches")):
            with mock.patch.object(dispatch, "slab_loads_supported", return_value=supported):
                self.assertEqual(FusedConfig().resident_conv, form)
        config = FusedConfig()
        self.assertEqual(config.kernels, "triton")
        self.assertEqual(dict(config.triton_launches), dict(FUSED_LAUNCHES))
        self.assertEqual((config.graph_max_windows, config.cudnn_autotune), (4, True))

    def test_frozen_comparable_and_picklable(self):
        config = FusedConfig(triton_launches={128: ConvLaunch(16, 16), 64: ConvLaunch(8, 16, planes=2)})
        with self.assertRaises(dataclasses.FrozenInstanceError):
            config.graph_max_windows = 2
        # a mapping is kept as sorted pairs: equal configs compare and hash equal, and survive a pickle
        self.assertEqual(config.triton_launches, ((64, ConvLaunch(8, 16, planes=2)), (128, ConvLaunch(16, 16))))
        same = FusedConfig(triton_launches=[(64, ConvLaunch(8, 16, planes=2)), (128, ConvLaunch(16, 16))])
        self.assertEqual(hash(config), hash(same))
        self.assertEqual(pickle.loads(pickle.dumps(config)), config)
        self.assertEqual(config.triton_launch(64), ConvLaunch(8, 16, planes=2))
        self.assertIsNone(config.triton_launch(256))
        self.assertEqual(dataclasses.replace(config, triton_launches={}).triton_launches, ())

    @parameterized.expand(
        [
            ("kernels", dict(kernels="cuda"), "kernels must be one of"),
            ("resident form", dict(resident_conv="slab"), "resident_conv must be one of"),
            ("launch", dict(triton_launches={64: (8, 16)}), "maps padded widths to ConvLaunch"),
            ("width", dict(triton_launches={0: ConvLaunch()}), "maps padded widths to ConvLaunch"),
            ("graph limit", dict(graph_max_windows=-1), "graph_max_windows must be an int >= 0"),
            ("graph flag", dict(graph_max_windows=True), "graph_max_windows must be an int >= 0"),
            ("upsample launch", dict(upsample_launches={64: None}), "upsample_launches maps padded widths"),
            ("upsample planes", dict(upsample_launches={64: ConvLaunch(planes=2)}), "one input plane per program"),
            ("norm in product", dict(norm_in_product=1), "norm_in_product must be True or False"),
            ("resident 96", dict(resident_96="yes"), "resident_96 must be True or False"),
        ]
    )
    def test_refuses(self, _, kwargs, message):
        with self.assertRaisesRegex(ValueError, message):
            FusedConfig(**kwargs)

    def test_slabs_need_a_triton_that_builds_them(self):
        with mock.patch.object(dispatch, "slab_loads_supported", return_value=False):
            with mock.patch.object(dispatch, "triton_release", return_value=(3, 9)):
                with self.assertRaisesRegex(ValueError, "found Triton 3.9: use 'patches'"):
                    check_config(FusedConfig(resident_conv="slabs"))
            for config in (FusedConfig(resident_conv="patches"), FusedConfig(kernels="torch", resident_conv="slabs")):
                self.assertIsNone(check_config(config))
        with mock.patch.object(dispatch, "slab_loads_supported", return_value=True):
            self.assertIsNone(check_config(FusedConfig(resident_conv="slabs")))


class TestChoice(unittest.TestCase):
    def setUp(self):
        dispatch._say_once.cache_clear()
        self.addCleanup(dispatch._say_once.cache_clear)

    def _choose(self, conv, x, config=None, resident_reason=None):
        with mock.patch.object(dispatch, "resident_unavailable_reason", return_value=resident_reason):
            return choose_conv3x3x3(conv, x, FusedConfig() if config is None else config)

    def test_by_width(self):
        # 48 -> 48 on the Gluon kernel where it runs; 96 channels (padded to 128) on the Triton kernel; 192 (no launch
        # for that width) on cuDNN
        self.assertEqual(self._choose(_conv(48, 48), _x(64)), ("resident", None))
        self.assertEqual(self._choose(_conv(96, 96), _x(128)), ("triton", FUSED_LAUNCHES[128]))
        self.assertEqual(self._choose(_conv(48, 96), _x(64)), ("triton", FUSED_LAUNCHES[128]))
        self.assertEqual(self._choose(_conv(192, 192), _x(192)), ("cudnn", None))

    def test_configuration(self):
        off = FusedConfig(resident_conv="off")
        self.assertEqual(self._choose(_conv(48, 48), _x(64), off), ("triton", FUSED_LAUNCHES[64]))
        no_launches = dataclasses.replace(off, triton_launches={})
        self.assertEqual(self._choose(_conv(48, 48), _x(64), no_launches), ("cudnn", None))
        launch = ConvLaunch(16, 16, num_warps=8)
        wider = FusedConfig(triton_launches={192: launch})
        self.assertEqual(self._choose(_conv(192, 192), _x(192), wider), ("triton", launch))
        self.assertEqual(self._choose(_conv(96, 96), _x(128), wider), ("cudnn", None))
        self.assertEqual(self._choose(_conv(48, 48), _x(64), FusedConfig(kernels="torch")), ("cudnn", None))

    @parameterized.expand(
        [
            ("float32", _conv(48, 48), _x(64, torch.float32)),
            ("bias", _conv(48, 48, bias=True), _x(64)),
            ("stride 2", _conv(48, 48, stride=2), _x(64)),
            ("1x1x1", _conv(48, 48, kernel_size=1, padding=0), _x(64)),
            ("dilation", _conv(48, 48, dilation=2, padding=2), _x(64)),
            ("groups", _conv(48, 48, groups=2), _x(64)),
            ("transposed", nn.ConvTranspose3d(48, 48, 3, padding=1, bias=False), _x(64)),
            ("channels", _conv(40, 48), _x(64)),  # 40 input channels do not split into two powers of two
        ]
    )
    def test_other_convolutions_on_cudnn(self, _, conv, x):
        self.assertEqual(self._choose(conv, x), ("cudnn", None))

    def test_unavailable_resident_kernel_is_logged_once(self):
        with self.assertLogs(dispatch.logger, "WARNING") as logs:
            for _ in range(2):
                chosen = self._choose(_conv(48, 48), _x(64), resident_reason="no such GPU here")
                self.assertEqual(chosen, ("triton", FUSED_LAUNCHES[64]))
        self.assertEqual(len(logs.output), 1)
        self.assertIn("run on the Triton kernel: no such GPU here", logs.output[0])

    def test_patches_outside_the_table_are_logged_once(self):
        with mock.patch.object(dispatch, "slab_loads_supported", return_value=False):
            with mock.patch.object(dispatch, "triton_release", return_value=(3, 9)):
                with self.assertLogs(dispatch.logger, "WARNING") as logs:
                    for _ in range(2):
                        self.assertEqual(self._choose(_conv(48, 48), _x(64)), ("resident", None))
        self.assertEqual(len(logs.output), 1)
        self.assertIn("load per-shift patches (slower): Triton 3.9", logs.output[0])


class TestDispatch(unittest.TestCase):
    """Each choice reaches its kernel with the configured form; the cuDNN branch computes the convolution and the
    residual add (float32 on the CPU, the PyTorch reference of the kernels)."""

    def test_runs_the_chosen_kernel(self):
        weights = PaddedWeights()
        conv = _conv(48, 48)
        for form, slabs in (("slabs", True), ("patches", False)):
            config = FusedConfig(resident_conv=form)
            with mock.patch.object(dispatch, "resident_unavailable_reason", return_value=None):
                with mock.patch.object(dispatch, "conv3x3x3_resident", return_value=("y", "stats")) as resident:
                    self.assertEqual(conv3x3x3_dispatch(conv, _x(64), weights, config), ("y", "stats"))
            self.assertEqual(resident.call_args.kwargs["slabs"], slabs)
            self.assertEqual(tuple(resident.call_args.args[1].shape), (27 * 48, 64))  # the planes=1 GEMM operand
        with mock.patch.object(dispatch, "conv3x3x3", return_value=("y", "stats")) as triton_conv:
            conv3x3x3_dispatch(conv, _x(64), weights, FusedConfig(resident_conv="off"), residual=_x(64))
        self.assertIs(triton_conv.call_args.kwargs["launch"], FUSED_LAUNCHES[64])
        self.assertTrue(triton_conv.call_args.kwargs["stats"])
        self.assertIsNotNone(triton_conv.call_args.kwargs["residual"])

    def test_statistics_only_when_asked(self):
        # a level's last block passes stats=False: the kernels must not run their statistics epilogue
        weights, conv = PaddedWeights(), _conv(48, 48)
        with mock.patch.object(dispatch, "resident_unavailable_reason", return_value=None):
            with mock.patch.object(dispatch, "conv3x3x3_resident", return_value=("y", None)) as resident:
                conv3x3x3_dispatch(conv, _x(64), weights, FusedConfig(), stats=False)
        self.assertFalse(resident.call_args.kwargs["stats"])
        with mock.patch.object(dispatch, "conv3x3x3", return_value=("y", None)) as triton_conv:
            conv3x3x3_dispatch(conv, _x(64), weights, FusedConfig(resident_conv="off"), stats=False)
        self.assertFalse(triton_conv.call_args.kwargs["stats"])

    @parameterized.expand([(True,), (False,)])
    def test_cudnn_residual_statistics_only_when_asked(self, stats):
        torch.manual_seed(0)
        conv = _conv(64, 64, kernel_size=3, stride=2, padding=1)  # strided: cuDNN under kernels="triton" too
        x = torch.randn(1, 64, 4, 4, 4).contiguous(memory_format=torch.channels_last_3d)
        residual = torch.randn(1, 64, 2, 2, 2).contiguous(memory_format=torch.channels_last_3d)
        expected = conv(x) + residual
        with mock.patch.object(dispatch, "instance_stats", side_effect=lambda y, add: (y.add_(add), "stats")[1]) as st:
            y, out_stats = conv3x3x3_dispatch(conv, x, PaddedWeights(), FusedConfig(), residual=residual, stats=stats)
        self.assertEqual(st.called, stats)
        self.assertEqual(out_stats, "stats" if stats else None)
        torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)

    @parameterized.expand([(False,), (True,)])
    def test_cudnn_branch(self, with_residual):
        torch.manual_seed(0)
        conv = _conv(64, 64, kernel_size=3, stride=2, padding=1)  # 64 channels: the padded width itself
        x = torch.randn(2, 64, 6, 6, 6).contiguous(memory_format=torch.channels_last_3d)
        expected = conv(x)
        residual = torch.randn_like(expected).contiguous(memory_format=torch.channels_last_3d)
        y, stats = conv3x3x3_dispatch(conv, x, PaddedWeights(), FusedConfig(kernels="torch"),
                                      residual=residual if with_residual else None)  # fmt: skip
        self.assertIsNone(stats)
        self.assertTrue(y.is_contiguous(memory_format=torch.channels_last_3d))
        torch.testing.assert_close(y, expected + residual if with_residual else expected, rtol=1e-5, atol=1e-5)


def _torch_resident(x, weights, stats=False, programs=None, residual=None, slabs=None, out=None):
    """conv3x3x3_resident's contract in PyTorch (channel views, out, residual, statistics), for CPU tests."""
    w = weights.float().view(27, 48, 64).permute(2, 1, 0).reshape(64, 48, 3, 3, 3)
    y = F.conv3d(x[:, :48].float(), w, padding=1)
    if residual is not None:
        y = y + residual.float()
    if out is None:
        out = torch.empty(y.shape, dtype=torch.float16).contiguous(memory_format=torch.channels_last_3d)
    out.copy_(y.half())
    if not stats:
        return out, None
    var, mean = torch.var_mean(out.float(), dim=(2, 3, 4), unbiased=False)
    return out, (mean, var)


class TestQuartered(unittest.TestCase):
    """FusedConfig(resident_96=True): a 96 -> 96 convolution as four resident 48 -> 48 calls (the kernel's contract
    stood in by PyTorch here; the kernel itself on the GPU)."""

    @parameterized.expand([(True, True), (False, False), (True, False)])
    def test_equals_the_convolution(self, with_residual, stats):
        torch.manual_seed(0)
        conv = _conv(96, 96)
        x = torch.randn(2, 128, 4, 3, 5)
        x[:, 96:] = 0
        x = x.half().contiguous(memory_format=torch.channels_last_3d)
        residual = None
        expected = F.conv3d(x[:, :96].float(), conv.weight.detach().half().float(), padding=1)
        if with_residual:
            residual = torch.randn(2, 128, 4, 3, 5)
            residual[:, 96:] = 0
            residual = residual.half().contiguous(memory_format=torch.channels_last_3d)
            expected = expected + residual[:, :96].float()
        config = FusedConfig(resident_conv="slabs", resident_96=True)
        with mock.patch.object(dispatch, "resident_unavailable_reason", return_value=None):
            self.assertEqual(choose_conv3x3x3(conv, x, config), ("quartered", None))
            with mock.patch.object(dispatch, "conv3x3x3_resident", side_effect=_torch_resident) as resident:
                y, moments = conv3x3x3_dispatch(conv, x, PaddedWeights(), config, residual=residual, stats=stats)
        self.assertEqual(resident.call_count, 4)
        self.assertTrue(all(call.kwargs["slabs"] for call in resident.call_args_list))
        self.assertEqual((tuple(y.shape), y.dtype), ((2, 128, 4, 3, 5), torch.float16))
        self.assertTrue(y.is_contiguous(memory_format=torch.channels_last_3d))
        torch.testing.assert_close(y[:, :96].float(), expected, rtol=2e-3, atol=2e-3)  # twice rounded to fp16
        self.assertTrue(torch.equal(y[:, 96:], torch.zeros_like(y[:, 96:])))
        if not stats:
            self.assertIsNone(moments)
            return
        var, mean = torch.var_mean(y.double(), dim=(2, 3, 4), unbiased=False)
        torch.testing.assert_close(moments[0].double(), mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(moments[1].double(), var, rtol=1e-4, atol=1e-6)

    @parameterized.expand(
        [
            ("flag off", dict(resident_conv="slabs"), None, (96, 96), "triton"),
            ("resident off", dict(resident_conv="off", resident_96=True), None, (96, 96), "triton"),
            ("no Hopper", dict(resident_conv="slabs", resident_96=True), "not a Hopper GPU", (96, 96), "triton"),
            ("other width", dict(resident_conv="slabs", resident_96=True), None, (96, 192), "cudnn"),
        ]
    )
    def test_choice(self, _, config_kwargs, reason, channels, expected):
        x = torch.zeros(1, 128, 2, 2, 2, dtype=torch.float16).contiguous(memory_format=torch.channels_last_3d)
        with mock.patch.object(dispatch, "resident_unavailable_reason", return_value=reason):
            chosen, _ = choose_conv3x3x3(_conv(*channels), x, FusedConfig(**config_kwargs))
        self.assertEqual(chosen, expected)


class TestUpsampleAdd(unittest.TestCase):
    """A decoder level's upsampling and skip add: the Triton kernel for the widths the configuration lists, else
    cuDNN then the statistics kernel's add (PyTorch's add under kernels="torch")."""

    @staticmethod
    def _up(c_in: int, c_out: int, changes: dict | None = None) -> nn.ConvTranspose3d:
        up = dict(kernel_size=3, stride=2, padding=1, output_padding=1, bias=False)
        return nn.ConvTranspose3d(c_in, c_out, **{**up, **(changes or {})})

    @parameterized.expand(
        [
            ("listed width", (96, 48), {}, torch.float16, "kernel"),
            ("width not listed", (96, 48), dict(upsample_launches={}), torch.float16, "cudnn"),
            ("other width", (192, 96), {}, torch.float16, "cudnn"),
            ("float32", (96, 48), {}, torch.float32, "cudnn"),
            ("with a bias", (96, 48, dict(bias=True)), {}, torch.float16, "cudnn"),
            ("input not in pieces", (40, 48), {}, torch.float16, "cudnn"),
            ("torch", (96, 48), dict(kernels="torch"), torch.float16, "torch"),
        ]
    )
    def test_choice(self, _, conv_args, config_kwargs, dtype, expected):
        conv = self._up(*conv_args)
        x = torch.zeros(1, padded_channels(conv.in_channels), 2, 2, 2, dtype=dtype)
        x = x.contiguous(memory_format=torch.channels_last_3d)
        skip = torch.zeros(1, padded_channels(conv.out_channels), 4, 4, 4, dtype=dtype)
        skip = skip.contiguous(memory_format=torch.channels_last_3d)
        config = FusedConfig(**config_kwargs)
        stats = mock.patch.object(dispatch, "instance_stats", return_value="stats")
        kernel = mock.patch.object(dispatch, "conv_transpose3x3x3", return_value=("y", "kernel stats"))
        transposed = mock.patch.object(dispatch.F, "conv_transpose3d", return_value=torch.zeros_like(skip))
        with stats as stats_spy, kernel as kernel_spy, transposed as cudnn_spy:
            _, out_stats = upsample_add_dispatch(conv, x, skip, PaddedWeights(), config)
        self.assertEqual(kernel_spy.called, expected == "kernel")
        self.assertEqual(cudnn_spy.called, expected != "kernel")
        self.assertEqual(stats_spy.called, expected == "cudnn")
        self.assertEqual(out_stats, {"kernel": "kernel stats", "cudnn": "stats", "torch": None}[expected])
        if expected == "kernel":
            self.assertIs(kernel_spy.call_args.kwargs["skip"], skip)
            self.assertTrue(kernel_spy.call_args.kwargs["stats"])
            self.assertEqual(tuple(kernel_spy.call_args.args[1].shape), (18 * 96, 128))  # real inputs, 2 x padded

    def test_cudnn_path_adds_the_skip(self):
        torch.manual_seed(0)
        conv = self._up(16, 16)  # padded to 64 channels in and out
        x = torch.randn(1, 64, 2, 3, 4)
        x[:, 16:] = 0
        skip = torch.randn(1, 64, 4, 6, 8).contiguous(memory_format=torch.channels_last_3d)
        x = x.contiguous(memory_format=torch.channels_last_3d)
        y, stats = upsample_add_dispatch(conv, x, skip.clone(), PaddedWeights(), FusedConfig(kernels="torch"))
        self.assertIsNone(stats)
        torch.testing.assert_close(y[:, :16], conv(x[:, :16]) + skip[:, :16], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(y[:, 16:], skip[:, 16:], rtol=0, atol=0)


if __name__ == "__main__":
    unittest.main()
