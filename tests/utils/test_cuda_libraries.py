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

import threading
import unittest
from unittest import mock

import torch

from monai.utils.cuda_libraries import start_cuda_libraries, start_first_calls


class TestStartCudaLibraries(unittest.TestCase):
    def test_nothing_off_cuda(self):
        with mock.patch("threading.Thread") as thread:
            self.assertIsNone(start_cuda_libraries(torch.device("cpu")))
        thread.assert_not_called()

    def test_multiplies_and_convolves_on_the_device_on_a_daemon_thread(self):
        seen = []

        def linear(a, b):
            seen.append(("linear", a.dtype, torch.is_grad_enabled()))
            return a

        def conv3d(x, w, padding):
            seen.append(("conv3d", x.dtype, torch.is_grad_enabled()))
            # the fused network's layout: channels-last input and weights
            self.assertTrue(x.is_contiguous(memory_format=torch.channels_last_3d))
            self.assertTrue(w.is_contiguous(memory_format=torch.channels_last_3d))
            return x

        devices = []

        def ones(*shape, device, dtype):
            devices.append(device)
            return torch.empty(*shape, dtype=dtype)  # a stand-in on the CPU

        with mock.patch("torch.nn.functional.linear", linear), mock.patch("torch.nn.functional.conv3d", conv3d), \
                mock.patch("torch.ones", ones), mock.patch("torch.cuda.current_device", return_value=1):
            thread = start_cuda_libraries(torch.device("cuda"))
            self.assertTrue(thread.daemon)  # never holds the process's exit
            thread.join(30)
        self.assertEqual(seen, [("linear", torch.float16, False), ("conv3d", torch.float16, False)])
        # an unnumbered device is the caller's current GPU (torchrun's rank), not the new thread's default GPU 0
        self.assertEqual(set(devices), {torch.device("cuda", 1)})

    def test_first_calls_on_a_named_daemon_thread_without_gradients(self):
        seen = []

        def calls(device):
            seen.append((device, torch.is_grad_enabled(), threading.current_thread().name))

        self.assertIsNone(start_first_calls(torch.device("cpu"), calls, "x"))
        with mock.patch("torch.cuda.current_device", return_value=2):
            thread = start_first_calls(torch.device("cuda"), calls, "label-map-start")
            self.assertTrue(thread.daemon)
            thread.join(30)
        self.assertEqual(seen, [(torch.device("cuda", 2), False, "label-map-start")])

    @unittest.skipUnless(torch.cuda.is_available(), "cuBLAS and cuDNN run on a CUDA GPU")
    def test_later_work_on_the_main_thread_unchanged(self):
        a = torch.randn(64, 48, device="cuda", dtype=torch.float16)
        b = torch.randn(32, 48, device="cuda", dtype=torch.float16)
        x = torch.randn(1, 4, 6, 6, 6, device="cuda")
        w = torch.randn(2, 4, 3, 3, 3, device="cuda")
        thread = start_cuda_libraries(torch.device("cuda"))
        thread.join(60)
        self.assertFalse(thread.is_alive())
        torch.testing.assert_close(torch.nn.functional.linear(a, b).float(), a.float() @ b.float().T,
                                   rtol=1e-2, atol=1e-2)
        expected = torch.nn.functional.conv3d(x.double().cpu(), w.double().cpu(), padding=1)
        # (cuDNN may compute in TF32: 10 mantissa bits over 108 products)
        torch.testing.assert_close(torch.nn.functional.conv3d(x, w, padding=1).double().cpu(), expected,
                                   rtol=1e-2, atol=5e-2)


if __name__ == "__main__":
    unittest.main()
