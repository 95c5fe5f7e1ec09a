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
"""Dependent launches: the context that asks for them, the launch arguments that grant them, and the wait every such
kernel starts with (compiled for Hopper without a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unittest
from unittest import mock

import torch
from parameterized import parameterized

import monai
import monai.utils.triton_support as triton_support
from monai.utils.triton_support import dependent_launch_args, dependent_launches, launches_dependent, triton


class TestDependentLaunches(unittest.TestCase):
    def test_context_nests_and_restores(self):
        self.assertFalse(launches_dependent())
        with dependent_launches():
            self.assertTrue(launches_dependent())
            with dependent_launches(False):
                self.assertFalse(launches_dependent())
            self.assertTrue(launches_dependent())
            with self.assertRaises(KeyError), dependent_launches(False):
                raise KeyError("inside")
            self.assertTrue(launches_dependent())
        self.assertFalse(launches_dependent())

    @parameterized.expand(
        [
            ("asked, Hopper", True, True, False, (9, 0), True),
            ("not asked", False, True, False, (9, 0), False),
            ("a CPU tensor", True, False, False, (9, 0), False),
            ("the interpreter", True, True, True, (9, 0), False),
            ("Ampere", True, True, False, (8, 0), False),
        ]
    )
    def test_launch_args(self, _, asked, cuda, interpreter, capability, expected):
        x = mock.Mock(is_cuda=cuda, device="cuda:0")
        with (
            dependent_launches(asked),
            mock.patch.object(triton_support, "interpreting", lambda: interpreter),
            mock.patch.object(torch.cuda, "get_device_capability", lambda device: capability),
        ):
            args = dependent_launch_args(x)
        self.assertEqual(args, {"DEPENDENT": True, "launch_pdl": True} if expected else {"DEPENDENT": False})

    def test_cpu_tensor_never_dependent(self):
        with dependent_launches():
            self.assertEqual(dependent_launch_args(torch.zeros(1)), {"DEPENDENT": False})


# the norm's apply kernel built for sm_90 in a fresh interpreter (with TRITON_INTERPRET, the CPU test runs, Triton's
# jit functions are interpreter objects its compiler refuses), as plain and as dependent; prints the two PTX texts
_BUILD_SCRIPT = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from monai.networks.kernels.instance_norm import _apply_kernel
pointers = ("x_ptr", "res_ptr", "y_ptr", "mean_ptr", "var_ptr", "w_ptr", "b_ptr")
signature = {k: "*fp16" if k in pointers[:3] else "*fp32" for k in pointers}
signature.update({"S": "i32", "C": "i32", "real_channels": "i32", "eps": "fp32", "negative_slope": "fp32"})
constants = dict(HAS_AFFINE=True, HAS_RESIDUAL=False, ACT=1, WRITE_PADDING=False, BLOCK_S=64, BLOCK_C=16)
ptx = {}
for dependent in (True, False):
    const = {**constants, "DEPENDENT": dependent}
    sig = {**signature, **{k: "constexpr" for k in const}}
    src = triton.compiler.ASTSource(fn=_apply_kernel, signature=sig, constexprs=const)
    ptx[str(dependent)] = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
json.dump(ptx, sys.stdout)
"""


@unittest.skipIf(triton is None, "Triton is not installed (the CPU wheels of torch come without it)")
class TestWaitForProducers(unittest.TestCase):
    """The norm's apply kernel compiled for compute capability 9.0 (no GPU needed): a dependent build waits for the
    kernel before it and releases the one after it before it reads anything; the plain build has neither."""

    def test_ptx(self):
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        root = os.path.dirname(os.path.dirname(os.path.abspath(monai.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        run = subprocess.run([sys.executable, "-c", _BUILD_SCRIPT], env=env, capture_output=True, text=True, cwd=root)
        self.assertEqual(run.returncode, 0, run.stderr[-3000:])
        ptx = json.loads(run.stdout)
        for dependent in (True, False):
            for instruction in ("griddepcontrol.wait", "griddepcontrol.launch_dependents"):
                self.assertEqual(instruction in ptx[str(dependent)], dependent, f"{instruction}, {dependent}")
        first_load = ptx["True"].index("ld.global")
        self.assertLess(ptx["True"].index("griddepcontrol.launch_dependents"), first_load)
        self.assertLess(ptx["True"].index("griddepcontrol.wait"), ptx["True"].index("griddepcontrol.launch_dependents"))


if __name__ == "__main__":
    unittest.main()
