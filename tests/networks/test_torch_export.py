"""``torch.export`` of the networks TorchScript cannot script (``SegResNetDS2``, ``VISTA3D``; see
docs/upstream-compatibility.md): the exported program gives the eager module's outputs, for a class prompt and for
clicks, with or without classes; an exported click program checks its inputs where it runs, as the eager module
does."""

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


class _PointPrompt(torch.nn.Module):
    """VISTA3D with clicks as positional inputs."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, image: torch.Tensor, point_coords: torch.Tensor, point_labels: torch.Tensor) -> torch.Tensor:
        return self.net(image, point_coords=point_coords, point_labels=point_labels)


class _ClassAndPointPrompt(torch.nn.Module):
    """VISTA3D with classes and their clicks as positional inputs."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, image: torch.Tensor, point_coords: torch.Tensor, point_labels: torch.Tensor,
                class_vector: torch.Tensor) -> torch.Tensor:
        return self.net(image, point_coords=point_coords, point_labels=point_labels, class_vector=class_vector)


def _segresnetds2():
    net = SegResNetDS2(
        spatial_dims=3, init_filters=8, in_channels=1, out_channels=4, blocks_down=(1, 1), blocks_up=(1,)
    )
    return net, (torch.randn(1, 1, 16, 16, 16),)


def _vista3d_classes():
    net = _ClassPrompt(vista3d132(encoder_embed_dim=8, in_channels=1))
    return net, (torch.randn(1, 1, 32, 32, 32), torch.tensor([[1], [3]]))


def _vista3d_points():
    net = _PointPrompt(vista3d132(encoder_embed_dim=8, in_channels=1))
    clicks = torch.tensor([[[10.0, 12.0, 8.0], [20.0, 5.0, 9.0]], [[3.0, 30.0, 8.0], [25.0, 15.0, 19.0]]])
    return net, (torch.randn(1, 1, 32, 32, 32), clicks, torch.tensor([[1, 0], [0, 3]]))


def _vista3d_classes_and_points():
    net, (image, clicks, labels) = _vista3d_points()
    return _ClassAndPointPrompt(net.net), (image, clicks, labels, torch.tensor([[3], [25]]))


class TestTorchExport(unittest.TestCase):
    @parameterized.expand(
        [("segresnetds2", _segresnetds2), ("vista3d_classes", _vista3d_classes), ("vista3d_points", _vista3d_points),
         ("vista3d_classes_and_points", _vista3d_classes_and_points)]
    )
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

    def test_exported_clicks_take_other_clicks_and_check_them(self):
        """The program traced on one set of clicks answers another as the eager module does, and refuses a prompt
        row without a click or an unknown label when it runs."""
        torch.manual_seed(0)
        net, (image, coords, labels) = _vista3d_points()
        net.eval()
        with torch.no_grad():
            program = torch.export.export(net, (image, coords, labels)).module()
            other = (image, coords.flip(1) + 1.0, torch.tensor([[0, 1], [2, 1]]))
            torch.testing.assert_close(program(*other), net(*other))
            with self.assertRaisesRegex(RuntimeError, "every prompt row of an exported VISTA3D needs a click"):
                program(image, coords, torch.tensor([[1, 0], [-1, -1]]))
            with self.assertRaisesRegex(RuntimeError, "point_labels must be -1"):
                program(image, coords, torch.tensor([[1, 7], [0, 1]]))


if __name__ == "__main__":
    unittest.main()
