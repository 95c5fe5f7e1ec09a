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
"""Upstream's import paths of code that lives lower in the package: the same objects under both names."""

from __future__ import annotations

import unittest

from parameterized import parameterized

import monai.networks.blocks.activation as blocks_activation
import monai.networks.layers.activations as layers_activations
import monai.transforms.utils as transforms_utils
import monai.utils.point_helpers as point_helpers
from monai.networks.layers import Act


class TestUpstreamPaths(unittest.TestCase):
    @parameterized.expand([(name,) for name in point_helpers.__all__])
    def test_point_helpers(self, name):
        self.assertIn(name, transforms_utils.__all__)
        self.assertIs(getattr(transforms_utils, name), getattr(point_helpers, name))

    def test_geglu(self):
        self.assertIs(blocks_activation.GEGLU, layers_activations.GEGLU)
        self.assertIs(Act["geglu"], layers_activations.GEGLU)


if __name__ == "__main__":
    unittest.main()
