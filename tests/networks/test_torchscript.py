"""TorchScript: the carried blocks and SegResNetDS script, save and load, and give the eager outputs (as in 1.6.1)."""

from __future__ import annotations

import io
import unittest

import torch
from parameterized import parameterized

from monai.networks.blocks import UnetBasicBlock, UnetResBlock, UnetrBasicBlock
from monai.networks.nets import SegResNetDS

CASES = [
    ["res_block_same_channels", lambda: UnetResBlock(3, 4, 4, 3, 1, "instance"), (1, 4, 6, 6, 6)],
    ["res_block_new_channels", lambda: UnetResBlock(2, 3, 5, 3, 1, ("group", {"num_groups": 1})), (2, 3, 8, 8)],
    ["res_block_stride", lambda: UnetResBlock(3, 4, 4, 3, 2, "batch"), (2, 4, 8, 8, 8)],
    ["basic_block", lambda: UnetBasicBlock(3, 2, 4, 3, 1, "instance"), (1, 2, 6, 6, 6)],
    ["unetr_basic_res", lambda: UnetrBasicBlock(3, 4, 4, 3, 1, "instance", res_block=True), (1, 4, 6, 6, 6)],
    ["unetr_basic_plain", lambda: UnetrBasicBlock(3, 4, 6, 3, 1, "instance", res_block=False), (1, 4, 6, 6, 6)],
    ["segresnet_ds", lambda: SegResNetDS(3, init_filters=4, blocks_down=(1, 1, 1)), (1, 1, 8, 8, 8)],
    ["segresnet_ds_2d", lambda: SegResNetDS(2, init_filters=4, in_channels=2, blocks_down=(1, 2), act="leakyrelu"),
     (2, 2, 8, 12)],
    ["segresnet_ds_aniso", lambda: SegResNetDS(3, init_filters=4, blocks_down=(1, 1, 1), resolution=(1, 1, 4)),
     (1, 1, 16, 16, 8)],
    ["segresnet_ds_one_level", lambda: SegResNetDS(3, init_filters=4, blocks_down=(1,)), (1, 1, 5, 6, 7)],
    ["segresnet_ds_nontrainable_up",
     lambda: SegResNetDS(3, init_filters=4, blocks_down=(1, 1), upsample_mode="nontrainable"), (1, 1, 8, 8, 8)],
]


def _script_round_trip(net: torch.nn.Module) -> torch.jit.ScriptModule:
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(net), buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


class TestTorchScript(unittest.TestCase):
    @parameterized.expand(CASES)
    def test_script_save_load(self, _, make, shape):
        torch.manual_seed(0)
        net = make().eval()
        x = torch.randn(shape)
        loaded = _script_round_trip(net)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), net(x))

    def test_deep_supervision_list_in_training(self):
        torch.manual_seed(0)
        net = SegResNetDS(3, init_filters=4, blocks_down=(1, 1, 1), dsdepth=2, norm="instance").train()
        x = torch.randn(1, 1, 8, 8, 8)
        outputs = _script_round_trip(net)(x)
        self.assertEqual([tuple(o.shape) for o in outputs], [(1, 2, 8, 8, 8), (1, 2, 4, 4, 4)])
        for got, want in zip(outputs, net(x)):
            torch.testing.assert_close(got, want)

    def test_scripted_shape_check(self):
        loaded = _script_round_trip(SegResNetDS(3, init_filters=4, blocks_down=(1, 1, 1)).eval())
        with self.assertRaisesRegex(Exception, "must be divisible by"):
            loaded(torch.randn(1, 1, 8, 8, 6))


if __name__ == "__main__":
    unittest.main()
