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
"""What the network is fused with: one image on a GPU without CUDA graphs or cuDNN autotuning, the defaults
otherwise; the choice reaches ``VISTA3D.fuse`` and leaves the run's settings record as it was."""

from __future__ import annotations

import json
import unittest
from unittest import mock

import torch
from parameterized import parameterized

from monai.apps.vista3d.batch.provenance import Provenance
from monai.apps.vista3d.core.job import SegmentJob
from monai.apps.vista3d.core.network_ready import fused_for_images, on_device, ready_network
from monai.apps.vista3d.core.pipeline import Vista3DPipeline
from monai.networks.kernels.dispatch import FusedConfig
from monai.networks.nets import VISTA3D, vista3d132

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


class TestFusedForImages(unittest.TestCase):
    def test_one_image_on_a_gpu(self):
        config = fused_for_images(1, CUDA, True)
        self.assertIsInstance(config, FusedConfig)
        self.assertEqual((config.graph_max_windows, config.cudnn_autotune), (0, False))
        self.assertEqual(config.kernels, FusedConfig().kernels)  # nothing else differs from the defaults

    @parameterized.expand([("two images", 2, CUDA, True), ("the cpu", 1, CPU, True), ("no fuse", 1, CUDA, False)])
    def test_otherwise_as_given(self, _, images, device, fuse):
        self.assertIs(fused_for_images(images, device, fuse), fuse)

    def test_a_given_config_is_kept(self):
        mine = FusedConfig(graph_max_windows=2)
        self.assertIs(fused_for_images(1, CUDA, mine), mine)


class TestOnDevice(unittest.TestCase):
    @parameterized.expand([("config", FusedConfig(graph_max_windows=0, cudnn_autotune=False)), ("default", True)])
    def test_the_choice_reaches_fuse(self, _, fuse):
        net = vista3d132(encoder_embed_dim=8)
        with mock.patch.object(VISTA3D, "fused_unavailable_reason", return_value=None), \
                mock.patch.object(VISTA3D, "fuse") as fused:
            on_device(net, CPU, fuse)
        fused.assert_called_once_with(None if fuse is True else fuse)

    def test_no_fuse(self):
        with mock.patch.object(VISTA3D, "fused_unavailable_reason", return_value=None), \
                mock.patch.object(VISTA3D, "fuse") as fused:
            on_device(vista3d132(encoder_embed_dim=8), CPU, False)
        fused.assert_not_called()


class TestTritonKeyFirst(unittest.TestCase):
    @parameterized.expand([("fused", True, True, 1), ("no fuse", False, True, 0), ("cannot fuse here", True, False, 0)])
    def test_started_before_the_network_only_where_it_fuses(self, _, fuse, fuses_here, starts):
        calls = []
        reason = None if fuses_here else "not here"
        with mock.patch.object(VISTA3D, "fused_unavailable_reason", return_value=reason), \
                mock.patch.object(VISTA3D, "fuse"), \
                mock.patch("monai.utils.triton_cache_key.prefetch_cache_key", side_effect=lambda: calls.append("key")), \
                mock.patch("monai.apps.vista3d.core.network_ready.build_network",
                           side_effect=lambda kw: calls.append("network") or vista3d132(**kw)):
            ready_network(None, None, {"encoder_embed_dim": 8}, CPU, fuse)
        self.assertEqual(calls, ["key"] * starts + ["network"])


class TestCudaLibrariesFirst(unittest.TestCase):
    @parameterized.expand([("cpu", "cpu"), ("cuda", "cuda")])
    def test_started_for_the_device_before_the_network(self, _, device):
        calls = []
        with mock.patch("monai.apps.vista3d.core.network_ready.start_cuda_libraries",
                        side_effect=lambda d: calls.append(("libraries", d.type))), \
                mock.patch("monai.apps.vista3d.core.network_ready.on_device", side_effect=lambda n, d, f: n), \
                mock.patch("monai.apps.vista3d.core.network_ready.build_network",
                           side_effect=lambda kw: calls.append("network") or vista3d132(**kw)):
            ready_network(None, None, {"encoder_embed_dim": 8}, torch.device(device), False)
        self.assertEqual(calls, [("libraries", device), "network"])


class TestFirstStreamedPassStarted(unittest.TestCase):
    @parameterized.expand([(None, False), (True, True), (False, False)])
    def test_pipeline_starts_the_passes_first_calls_before_its_network(self, amp, resolved):
        """The tiny pass runs on a thread before the network is built, with the amp the pipeline resolves."""
        from monai.apps.vista3d.core import pipeline as pipeline_module
        from monai.apps.vista3d.core.streaming import first_streamed_pass

        calls = []
        real_ready = pipeline_module.ready_network
        with mock.patch.object(pipeline_module, "start_first_calls",
                               side_effect=lambda d, fn, name: calls.append((fn.func, fn.keywords, d.type, name))), \
                mock.patch.object(pipeline_module, "ready_network",
                                  side_effect=lambda *a: calls.append("network") or real_ready(*a)):
            pipe = Vista3DPipeline(device="cpu", network_kwargs={"encoder_embed_dim": 8}, warn_random=False, amp=amp)
        self.assertEqual(calls, [(first_streamed_pass, {"amp": resolved}, "cpu", "streamed-pass-start"), "network"])
        self.assertEqual(pipe.amp, resolved)


class TestRecord(unittest.TestCase):
    def test_summary_says_fused_not_how(self):
        # the record a run writes (summary.json) keeps the user's choice; graphs and autotuning are the process's
        job = SegmentJob(device="cpu", network_kwargs={"encoder_embed_dim": 8}, warn_random=False,
                         fuse=FusedConfig(graph_max_windows=0, cudnn_autotune=False))
        record = Provenance(job).record()
        self.assertIs(record["fuse"], True)
        json.dumps(record)  # written as JSON


if __name__ == "__main__":
    unittest.main()
