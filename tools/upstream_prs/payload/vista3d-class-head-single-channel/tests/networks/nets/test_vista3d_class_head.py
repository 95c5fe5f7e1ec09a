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

from __future__ import annotations

import unittest

import torch
from parameterized import parameterized

from monai.networks import eval_mode
from monai.networks.nets.vista3d import ClassMappingClassify
from tests.test_utils import assert_allclose

# (classes, windows, feature_size, use_mlp): one class and one channel are the shapes squeeze() got wrong
CASES = [
    (1, 1, 4, True),
    (1, 3, 4, False),
    (5, 1, 4, True),
    (5, 2, 4, False),
    (3, 2, 1, False),
    (1, 2, 1, False),
    (1, 1, 1, False),
    (13, 6, 8, True),
]


def per_window_reference(head: ClassMappingClassify, src: torch.Tensor, class_vector: torch.Tensor) -> torch.Tensor:
    """The class logits one window and one class at a time: [K, W, H, W, D]."""
    feats = head.image_post_mapping(src)
    emb = head.class_embeddings(class_vector)
    if head.use_mlp:
        emb = head.mlp(emb)
    emb = emb.reshape(class_vector.shape[0], -1)
    rows = [torch.stack([torch.einsum("c,chwd->hwd", e, f) for f in feats]) for e in emb]
    return torch.stack(rows)


class TestClassMappingClassifyShapes(unittest.TestCase):
    @parameterized.expand(CASES)
    def test_matches_per_window_reference(self, n_classes, n_windows, feature_size, use_mlp):
        torch.manual_seed(0)
        head = ClassMappingClassify(n_classes=max(n_classes, 2), feature_size=feature_size, use_mlp=use_mlp)
        src = torch.randn(n_windows, feature_size, 4, 3, 5)
        class_vector = torch.arange(n_classes).view(-1, 1)
        with eval_mode(head):
            logits, emb = head(src, class_vector)
            expected = per_window_reference(head, src, class_vector)
        self.assertEqual(tuple(logits.shape), (n_classes, n_windows, 4, 3, 5))
        self.assertEqual(tuple(emb.shape), (n_classes, 1, feature_size))
        assert_allclose(logits, expected, rtol=1e-5, atol=1e-5, type_test=False)

    def test_one_product_for_all_classes_and_windows(self):
        head = ClassMappingClassify(n_classes=16, feature_size=4, use_mlp=False)
        src = torch.randn(6, 4, 2, 2, 2)
        calls = []
        original = torch.Tensor.__matmul__

        def counting(a, b):
            calls.append((tuple(a.shape), tuple(b.shape)))
            return original(a, b)

        torch.Tensor.__matmul__ = counting
        try:
            with eval_mode(head):
                head(src, torch.arange(13).view(-1, 1))
        finally:
            torch.Tensor.__matmul__ = original
        self.assertEqual(calls, [((13, 4), (6, 4, 8))])


if __name__ == "__main__":
    unittest.main()
