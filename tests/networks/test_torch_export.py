"""``torch.export`` of the networks TorchScript cannot script (``SegResNetDS2``, ``VISTA3D``; see
docs/upstream-compatibility.md): the exported program gives the eager module's outputs. Point prompts do not
export yet (their clicks become data-dependent shapes)."""

import unittest

import torch
from parameterized import parameterized

from monai.networks.nets import SegResNetDS2
from monai.networks.nets.vista3d import vista3d132


class _ClassPrompt(torch.nn.Module):
    """VISTA3D with a class prompt as a positional input, the form ``torch.export`` takes."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, image: torch.Tensor, class_vector: torch.Tensor) -> torch.Tensor:
        return self.net(image, class_vector=class_vector)


def _segresnetds2():
    net = SegResNetDS2(
        spatial_dims=3, init_filters=8, in_channels=1, out_channels=4, blocks_down=(1, 1), blocks_up=(1,)
    )
    return net, (torch.randn(1, 1, 16, 16, 16),)


def _vista3d_classes():
    net = _ClassPrompt(vista3d132(encoder_embed_dim=8, in_channels=1))
    return net, (torch.randn(1, 1, 32, 32, 32), torch.tensor([[1], [3]]))


class TestTorchExport(unittest.TestCase):
    @parameterized.expand([("segresnetds2", _segresnetds2), ("vista3d_classes", _vista3d_classes)])
    def test_exported_equals_eager(self, _, build):
        torch.manual_seed(0)
        net, inputs = build()
        net.eval()
        with torch.no_grad():
            expected = net(*inputs)
            got = torch.export.export(net, inputs).module()(*inputs)
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = got if isinstance(got, tuple) else (got,)
        self.assertEqual(len(got), len(expected))
        for g, e in zip(got, expected):
            self.assertEqual(g.shape, e.shape)
            torch.testing.assert_close(g, e)


if __name__ == "__main__":
    unittest.main()
