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
"""ClassMappingClassify maps all classes onto all windows in one matmul, equal to the per-window loop."""

from __future__ import annotations

import unittest
from unittest import mock

import torch
from parameterized import parameterized
from torch.overrides import TorchFunctionMode

from monai.networks.nets.vista3d import ClassMappingClassify
from tests.networks.tiny_vista3d import build_tiny_vista3d


def loop_reference(head: ClassMappingClassify, src: torch.Tensor, class_vector: torch.Tensor) -> torch.Tensor:
    """The per-window formulation: ``class_embedding @ window`` for each window, concatenated on dim 1."""
    b, c, h, w, d = src.shape
    feats = head.image_post_mapping(src)
    emb = head.class_embeddings(class_vector)
    if head.use_mlp:
        emb = head.mlp(emb)
    masks = [(emb @ feats[[i]].view(1, c, h * w * d)).view(-1, 1, h, w, d) for i in range(b)]
    return torch.cat(masks, 1)


def _cpu_supports(dtype: torch.dtype) -> bool:
    try:
        torch.ones(2, 2, dtype=dtype) @ torch.ones(2, 2, dtype=dtype)
        torch.nn.functional.conv3d(torch.ones(1, 1, 3, 3, 3, dtype=dtype), torch.ones(1, 1, 3, 3, 3, dtype=dtype))
        return True
    except RuntimeError:
        return False


DTYPES = [d for d in (torch.float32, torch.bfloat16, torch.float16) if d == torch.float32 or _cpu_supports(d)]
SHAPES = [  # classes, windows, feature_size, spatial, use_mlp
    (1, 1, 1, (2, 2, 2), False),
    (1, 1, 8, (4, 3, 2), True),
    (3, 1, 1, (3, 3, 3), False),
    (1, 4, 1, (2, 3, 4), False),  # the class MLP's InstanceNorm needs feature_size > 1
    (5, 3, 4, (4, 4, 4), True),
    (14, 4, 8, (4, 4, 2), True),
    (117, 2, 16, (2, 2, 2), True),
]
CASES = [[*shape, dtype] for shape in SHAPES for dtype in DTYPES]
RANDOM_CASES = []
_gen = torch.Generator().manual_seed(2026)
for _ in range(12):
    k, win, feat = (int(torch.randint(1, hi, (1,), generator=_gen)) for hi in (20, 6, 12))
    use_mlp = feat > 1 and bool(torch.randint(0, 2, (1,), generator=_gen))
    size = tuple(int(torch.randint(1, 5, (1,), generator=_gen)) for _ in range(3))
    RANDOM_CASES.append([k, win, feat, size, use_mlp, torch.float32])


class TestClassHeadBroadcast(unittest.TestCase):
    @parameterized.expand(CASES + RANDOM_CASES)
    def test_equals_loop(self, n_classes, n_windows, feature_size, spatial, use_mlp, dtype):
        torch.manual_seed(n_classes * 100 + n_windows * 10 + feature_size)
        head = ClassMappingClassify(n_classes=max(n_classes, 8), feature_size=feature_size, use_mlp=use_mlp)
        head = head.to(dtype).eval()
        src = torch.randn(n_windows, feature_size, *spatial).to(dtype)
        class_vector = torch.randperm(max(n_classes, 8))[:n_classes].unsqueeze(1)
        with torch.no_grad():
            out, emb = head(src, class_vector)
            ref = loop_reference(head, src, class_vector)
            # rounding bound of a length-C dot product, for each of the two results: C * eps * (|a| @ |b|)
            feats = head.image_post_mapping(src).float()
            scale = emb.float().abs().reshape(n_classes, 1, feature_size) @ feats.abs().view(n_windows, feature_size, -1).unsqueeze(1)
        self.assertEqual(tuple(out.shape), (n_classes, n_windows, *spatial))
        self.assertEqual(tuple(emb.shape), (n_classes, 1, feature_size))
        self.assertEqual(out.dtype, dtype)
        bound = 2 * feature_size * torch.finfo(dtype).eps * scale.squeeze(2).transpose(0, 1).reshape(out.shape)
        if dtype != torch.float32:  # plus the final rounding of each result to the low precision
            bound = bound + 2 * torch.finfo(dtype).eps * ref.float().abs()
        err = (out.float() - ref.float()).abs()
        self.assertTrue(bool((err <= bound + 1e-30).all()), f"max excess {(err - bound).max().item()}")

    def test_windows_first_layout(self):
        head = ClassMappingClassify(n_classes=8, feature_size=4).eval()
        with torch.no_grad():
            out, _ = head(torch.randn(3, 4, 2, 2, 2), torch.tensor([[1], [2]]))
        self.assertTrue(out.transpose(0, 1).is_contiguous())

    def test_no_python_loop_over_windows_or_classes(self):
        """One product call for any number of windows and classes (whatever spelling: @, matmul, bmm, einsum)."""
        head = ClassMappingClassify(n_classes=20, feature_size=4, use_mlp=False).eval()
        names = {"matmul", "__matmul__", "__rmatmul__", "bmm", "einsum", "mm", "baddbmm", "tensordot"}

        class CountProducts(TorchFunctionMode):
            calls = 0

            def __torch_function__(self, func, types, args=(), kwargs=None):
                if getattr(func, "__name__", "") in names:
                    CountProducts.calls += 1
                return func(*args, **(kwargs or {}))

        feats = torch.randn(6, 4, 2, 2, 2)
        with torch.no_grad(), CountProducts():
            out, _ = head(feats, torch.arange(13).unsqueeze(1))
        self.assertEqual(CountProducts.calls, 1)
        self.assertEqual(tuple(out.shape), (13, 6, 2, 2, 2))


class TestTransposeNoCopy(unittest.TestCase):
    def test_transpose_returns_head_result_without_copy(self):
        model = build_tiny_vista3d(feature_size=8, blocks_down=(1, 1)).eval()
        captured = {}
        head_forward = model.class_head.forward

        def capture(*args, **kwargs):
            out = head_forward(*args, **kwargs)
            captured["logits"] = out[0]
            return out

        with torch.no_grad(), mock.patch.object(model.class_head, "forward", side_effect=capture):
            out = model(torch.randn(3, 1, 8, 8, 8), class_vector=torch.tensor([[1], [4]]), transpose=True)
        self.assertEqual(tuple(out.shape), (3, 2, 8, 8, 8))
        self.assertTrue(out.is_contiguous())
        self.assertEqual(out.data_ptr(), captured["logits"].data_ptr())


if __name__ == "__main__":
    unittest.main()
