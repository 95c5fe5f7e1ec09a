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
"""Triton's Gluon (``triton.experimental.gluon``, an experimental API) across Triton releases: the one room that
knows which release names what, so the kernels written in it (:py:mod:`~monai.networks.kernels.conv3d_resident`)
use one spelling.

- :py:data:`GLUON_MISSING`: ``None`` where Gluon's Hopper API (wgmma, TMA, mbarriers, tensor descriptors) imports,
  else why not; then the Gluon names below are absent and the fused path keeps its Triton kernels.
- :py:data:`GLUON_EXPECTED_FROM`: the first release the kernels are measured on; from it on a missing Gluon is a
  breakage, not a machine without it (``tests/networks/kernels/test_gluon_compat.py`` fails there).
- ``tma_load`` / ``tma_store``: the TMA copies, ``async_load`` / ``async_store`` from Triton 3.9 (which makes the
  old names raise), ``async_copy_global_to_shared`` / ``async_copy_shared_to_global`` before.
- ``NEW_REINTERPRET``: a shared-memory view's ``reinterpret`` (3.9 on) rather than ``_reinterpret`` (3.6-3.8), a
  ``gl.constexpr`` for the ``if`` inside ``gluon.jit`` code.
- :py:func:`ast_source`: Gluon's AST source class, public as ``gluon.GluonASTSource`` from 3.9 on, in
  ``gluon._runtime`` before.
"""

from __future__ import annotations

from typing import Any

from monai.utils.triton_support import triton

__all__ = ["GLUON_EXPECTED_FROM", "GLUON_MISSING", "ast_source", "triton_release"]

#: the oldest Triton release the resident-weight kernel builds on (3.5's Gluon lacks what it uses), so the first on
#: which Gluon's Hopper API must import
GLUON_EXPECTED_FROM = (3, 6)


def triton_release(version: str | None = None) -> tuple[int, int] | None:
    """``(major, minor)`` of a Triton version string (the installed Triton's when ``None``); ``None`` without one."""
    if version is None:
        if triton is None:
            return None
        version = triton.__version__
    major, minor = version.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


GLUON_MISSING: str | None = None
if triton is None:
    GLUON_MISSING = "Triton is not installed (it ships with the CUDA builds of PyTorch)"
else:
    try:
        from triton.experimental import gluon
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.hopper import (
            fence_async_shared,
            mbarrier,
            tma,
            warpgroup_mma,
            warpgroup_mma_wait,
        )
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
        tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
        NEW_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))
        __all__ += ["gluon", "gl", "fence_async_shared", "mbarrier", "tma", "warpgroup_mma", "warpgroup_mma_wait"]
        __all__ += ["TensorDescriptor", "tma_load", "tma_store", "NEW_REINTERPRET"]
    except (ImportError, AttributeError) as e:  # a Triton without (this) Gluon Hopper API
        GLUON_MISSING = f"Triton {triton.__version__} has no usable Gluon ({type(e).__name__}: {e})"


def ast_source() -> Any:
    """Gluon's AST source class (what ``triton.compile`` takes for a ``gluon.jit`` function without a GPU)."""
    source = getattr(gluon, "GluonASTSource", None)
    if source is None:
        from triton.experimental.gluon._runtime import GluonASTSource

        source = GluonASTSource
    return source
