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
from unittest import mock

import torch

from monai.utils.cuda_libraries import start_cublas


class TestStartCublas(unittest.TestCase):
    def test_nothing_off_cuda(self):
        with mock.patch("threading.Thread") as thread:
            self.assertIsNone(start_cublas(torch.device("cpu")))
        thread.assert_not_called()

    def test_multiplies_on_the_device_on_a_daemon_thread(self):
        seen = []

        def linear(a, b):
            seen.append((a.device.type, a.dtype, torch.is_grad_enabled()))
            return a

        devices = []

        def ones(*shape, device, dtype):
            devices.append(device)
            return torch.empty(*shape, dtype=dtype)  # a stand-in on the CPU

        with mock.patch("torch.nn.functional.linear", linear), \
                mock.patch("torch.ones", ones), mock.patch("torch.cuda.current_device", return_value=1):
            thread = start_cublas(torch.device("cuda"))
            self.assertTrue(thread.daemon)  # never holds the process's exit
            thread.join(30)
        self.assertEqual(seen, [("cpu", torch.float16, False)])
        # an unnumbered device is the caller's current GPU (torchrun's rank), not the new thread's default GPU 0
        self.assertEqual(devices, [torch.device("cuda", 1)])

    @unittest.skipUnless(torch.cuda.is_available(), "cuBLAS runs on a CUDA GPU")
    def test_later_products_on_the_main_thread_unchanged(self):
        a = torch.randn(64, 48, device="cuda", dtype=torch.float16)
        b = torch.randn(32, 48, device="cuda", dtype=torch.float16)
        thread = start_cublas(torch.device("cuda"))
        thread.join(60)
        self.assertFalse(thread.is_alive())
        torch.testing.assert_close(torch.nn.functional.linear(a, b).float(), a.float() @ b.float().T,
                                   rtol=1e-2, atol=1e-2)


if __name__ == "__main__":
    unittest.main()
