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
"""Padding arithmetic for convolutions."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["same_padding", "stride_minus_kernel_padding"]


def _as_ints(value: Sequence[int] | int) -> tuple[int, ...]:
    return tuple(int(v) for v in value) if isinstance(value, Sequence) else (int(value),)


def _unwrap(values: tuple[int, ...]) -> tuple[int, ...] | int:
    return values if len(values) > 1 else values[0]


def same_padding(kernel_size: Sequence[int] | int, dilation: Sequence[int] | int = 1) -> tuple[int, ...] | int:
    """Padding that keeps the spatial size of a stride-1 convolution (an int when all arguments are ints).

    Raises:
        NotImplementedError: when ``(kernel_size - 1) * dilation`` is odd, so no symmetric padding exists.
    """
    ks, dil = _as_ints(kernel_size), _as_ints(dilation)
    n = max(len(ks), len(dil))
    ks, dil = ks * (n // len(ks)), dil * (n // len(dil))
    if any((k - 1) * d % 2 for k, d in zip(ks, dil)):
        raise NotImplementedError(f"Same padding not available for kernel_size={ks} and dilation={dil}.")
    return _unwrap(tuple((k - 1) * d // 2 for k, d in zip(ks, dil)))


def stride_minus_kernel_padding(kernel_size: Sequence[int] | int, stride: Sequence[int] | int) -> tuple[int, ...] | int:
    """``stride - kernel_size`` per dimension: the output padding of a transposed convolution."""
    ks, st = _as_ints(kernel_size), _as_ints(stride)
    n = max(len(ks), len(st))
    ks, st = ks * (n // len(ks)), st * (n // len(st))
    return _unwrap(tuple(s - k for k, s in zip(ks, st)))
