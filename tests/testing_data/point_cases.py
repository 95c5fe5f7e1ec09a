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
"""The point-inferer cases of ``point_helpers_upstream.pt``, shared by the recording script and the tests.

``make_point_helpers_reference.py`` runs these with upstream MONAI to record the outputs; the tests run them with
this fork and compare. Only torch is needed here, so the recording script can import it next to upstream.
"""

from __future__ import annotations

import torch

__all__ = ["StubPredictor", "make_inferer_cases", "make_vista3d_inferer_case"]


class StubPredictor(torch.nn.Module):
    """A deterministic predictor with VISTA3D's call signature for the point inferer cases.

    Its output depends on the window content, the window position and the prompt, so misplaced windows,
    wrong point offsets or a wrong ``prev_mask`` change the result.
    """

    def __init__(self, channels: int = 2):
        super().__init__()
        self.channels = channels

    def forward(
        self,
        input_images,
        point_coords=None,
        point_labels=None,
        class_vector=None,
        prompt_class=None,
        patch_coords=None,
        prev_mask=None,
        **kwargs,
    ):
        window = patch_coords[0]
        starts = torch.tensor([window[a].start for a in (2, 3, 4)], dtype=torch.float32)
        x = torch.nn.functional.avg_pool3d(input_images[:, :1], 3, stride=1, padding=1)
        shift = 0.01 * starts.sum() + 0.1 * float(point_coords.float().sum())
        chans = [x * (c + 1) + shift for c in range(self.channels)]
        out = torch.cat(chans, 1)
        if prev_mask is not None:
            out = out + 0.5 * prev_mask[window][:, : self.channels]
        if class_vector is not None:
            out = out + float(torch.as_tensor(class_vector).float().sum())
        return out + kwargs.get("offset", 0.0)


def make_inferer_cases() -> list:
    """Keyword arguments of the point inferer cases run with :class:`StubPredictor`."""
    gen = torch.Generator().manual_seed(77)
    image = torch.randn((1, 1, 30, 26, 21), generator=gen)
    small = torch.randn((1, 1, 13, 26, 9), generator=gen)  # smaller than the window on two axes
    prev = torch.randn((1, 2, 30, 26, 21), generator=gen)
    coords = torch.tensor([[[3.0, 20.4, 10.0], [15.7, 2.2, 19.0], [29.0, 25.0, 0.0]]])
    labels = torch.tensor([[1, 0, 3]])
    # for center_only=False: points whose windows stay inside the image (near an edge upstream slices empty
    # or truncated windows, which this fork shifts inside instead)
    inner = torch.tensor([[[6.0, 20.4, 10.0], [15.7, 5.2, 15.0], [24.0, 8.0, 5.5]]])
    return [
        {"inputs": image, "roi_size": (16, 12, 10), "point_coords": coords, "point_labels": labels},
        {"inputs": image, "roi_size": (15, 11, 9), "point_coords": coords, "point_labels": labels},
        {
            "inputs": image,
            "roi_size": (16, 12, 10),
            "point_coords": inner,
            "point_labels": labels,
            "center_only": False,
        },
        {
            "inputs": image,
            "roi_size": (16, 12, 10),
            "point_coords": inner,
            "point_labels": labels,
            "center_only": False,
            "margin": 3,
            "prev_mask": prev,
            "point_start": 1,
            "class_vector": torch.tensor([4]),
        },
        {"inputs": small, "roi_size": (16, 12, 10), "point_coords": coords[:, :2] * 0.4, "point_labels": labels[:, :2]},
        {
            "inputs": small,
            "roi_size": (16, 12, 10),
            "point_coords": coords[:, :2].long() // 3,
            "point_labels": labels[:, :2],
            "prev_mask": prev[:, :, :13, :, :9],
            "offset": 0.25,
        },
    ]


def make_vista3d_inferer_case() -> dict:
    """The tiny VISTA3D point inferer case: a 64x48x40 image, 2 points, 32^3 windows."""
    gen = torch.Generator().manual_seed(2024)
    return {
        "inputs": torch.randn((1, 1, 64, 48, 40), generator=gen),
        "roi_size": (32, 32, 32),
        "point_coords": torch.tensor([[[20.0, 30.0, 10.0], [45.0, 12.0, 33.0]]]),
        "point_labels": torch.tensor([[1, 0]]),
        "transpose": True,
    }
