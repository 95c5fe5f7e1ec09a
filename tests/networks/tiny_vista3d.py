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
"""Helpers shared by the VISTA3D tests: the tiny configuration of the recorded parity fixtures."""

from __future__ import annotations

import os

import torch

from monai.networks.nets import SegResNetDS2
from monai.networks.nets.vista3d import VISTA3D, ClassMappingClassify, PointMappingSAM

TESTING_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "testing_data")
TINY_CONFIG = {
    "feature_size": 16,
    "blocks_down": (1, 1, 1),
    "norm": "instance",
    "dsdepth": 1,
    "n_classes": 512,
    "last_supported": 132,
    "use_mlp": True,
}


def build_tiny_vista3d(config: dict | None = None, **overrides) -> VISTA3D:
    """A VISTA3D of the layout described by ``config`` (keys of ``vista3d_tiny_parity.pt``'s ``config``)."""
    cfg = dict(TINY_CONFIG if config is None else config)
    cfg.update(overrides)
    f = cfg["feature_size"]
    encoder = SegResNetDS2(
        in_channels=cfg.get("in_channels", 1),
        blocks_down=tuple(cfg["blocks_down"]),
        norm=cfg["norm"],
        out_channels=f,
        init_filters=f,
        dsdepth=cfg["dsdepth"],
    )
    class_head = ClassMappingClassify(n_classes=cfg["n_classes"], feature_size=f, use_mlp=cfg["use_mlp"])
    point_head = PointMappingSAM(feature_size=f, n_classes=cfg["n_classes"], last_supported=cfg["last_supported"])
    return VISTA3D(image_encoder=encoder, class_head=class_head, point_head=point_head)


def tiny_vista3d_with_recorded_weights() -> VISTA3D:
    """The tiny VISTA3D of ``vista3d_tiny_parity.pt`` with its recorded weights, in eval mode."""
    state = load_testing_data("vista3d_tiny_parity.pt")
    model = build_tiny_vista3d(state["config"])
    model.load_state_dict(state["state_dict"], strict=True)
    return model.eval()


def load_testing_data(name: str) -> dict:
    return torch.load(os.path.join(TESTING_DATA, name), weights_only=True)


def to_slices(patch: list) -> list:
    """``[[start, stop], ...]`` per window (as stored in the fixtures) -> the inferers' tuples of slices."""
    return [tuple(slice(a, b) for a, b in window) for window in patch]
