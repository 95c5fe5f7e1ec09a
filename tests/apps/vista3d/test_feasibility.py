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
"""What cannot run is refused before the first image, with one line (issue 34, item 5)."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path
from unittest import mock

import nibabel as nib
import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.core import feasibility
from monai.apps.vista3d.core.checkpoint import load_checkpoint
from monai.apps.vista3d.core.feasibility import failure_reason
from monai.apps.vista3d.core.pipeline import Vista3DPipeline
from monai.apps.vista3d.errors import CheckpointError, ResourceError
from monai.apps.vista3d.io.nifti import read_header
from monai.networks.nets import vista3d132
from tests.apps.vista3d.test_cli import TINY, run_main


def _save(path: Path, shape, spacing: float) -> Path:
    data = np.full(shape, 40, dtype=np.int16)
    nib.save(nib.Nifti1Image(data, np.diag([spacing] * 3 + [1.0])), path)
    return path


class TestFeasibility(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def test_window_the_network_cannot_downsample(self):
        with self.assertRaisesRegex(ResourceError, "one voxel at the network's deepest level"):
            feasibility.check_window((16, 16, 16), 8, "cpu")
        feasibility.check_window((16, 16, 32), 8, "cpu")  # two voxels at the deepest level run

    @parameterized.expand([((100000,) * 3, 8), ((4096,) * 3, 48)])
    def test_window_larger_than_memory(self, roi, width):
        with mock.patch.object(feasibility, "host_memory_available", return_value=64 * 2**30):
            with self.assertRaisesRegex(ResourceError, r"needs at least [\d.e+]+ GiB per window, cpu has 64 GiB"):
                feasibility.check_window(roi, width, "cpu")

    def test_width_larger_than_memory_is_counted_not_allocated(self):
        with mock.patch.object(feasibility, "host_memory_available", return_value=64 * 2**30):
            with self.assertRaisesRegex(ResourceError, "encoder_embed_dim=800000 needs .* GiB for its weights alone"):
                feasibility.check_network(800000, "cpu")
            feasibility.check_network(8, "cpu")

    @parameterized.expand([(8,), (16,), (48,), (96,), (256,)])
    def test_weights_counted_as_the_network_holds_them(self, width):
        with torch.device("meta"):
            built = vista3d132(encoder_embed_dim=width)
        self.assertEqual(feasibility.network_bytes(width), 4 * sum(p.numel() for p in built.parameters()))

    def test_width_checked_without_building_the_network(self):
        """The command line and the pipeline it builds both check the width: neither builds a network for it."""
        import monai.networks.nets as nets

        with mock.patch.object(nets, "vista3d132", wraps=nets.vista3d132) as build:
            feasibility.check_network(16, "cpu")
        build.assert_not_called()

    def test_pipeline_refuses_in_its_constructor(self):
        with self.assertRaisesRegex(ResourceError, "deepest level"):
            Vista3DPipeline(device="cpu", roi_size=16, network_kwargs={"encoder_embed_dim": 8}, warn_random=False)
        with mock.patch.object(feasibility, "host_memory_available", return_value=64 * 2**30):
            with self.assertRaisesRegex(ResourceError, "weights alone"):
                Vista3DPipeline(device="cpu", network_kwargs={"encoder_embed_dim": 800000}, warn_random=False)

    def test_resampled_volume_larger_than_memory(self):
        """A 20 mm pixdim resampled to 1.5 mm: refused from the header, saying how much it needs and why."""
        src = _save(self.dir / "coarse.nii.gz", (16, 16, 8), 20.0)
        with mock.patch.object(feasibility, "host_memory_available", return_value=2**25):
            with self.assertRaises(ResourceError) as ctx:
                feasibility.check_image(src, "cpu")
        self.assertRegex(str(ctx.exception), r"needs at least [\d.]+ GiB of cpu memory \(the image, 16 x 16 x 8 voxels "
                                             r"of 20 x 20 x 20 mm, resampled to 1.5 mm: 214 x 214 x 107 voxels\), "
                                             r"0.0312 GiB are available")
        feasibility.check_image(src, "cpu")  # fits this machine

    @parameterized.expand([
        ("50 mm (cm or wrong)", 50.0, "voxel spacing 50 x 50 x 50 mm is no CT's", "1600 x 1600 x 1067"),
        ("0.01 mm (microns)", 0.01, "voxel spacing 0.01 x 0.01 x 0.01 mm is no CT's", "1 x 1 x 1"),
        ("meters", 0.0008, "voxel spacing 0.0008 x 0.0008 x 0.0008 mm is no CT's", "1 x 1 x 1"),
    ])
    def test_spacing_no_ct_has(self, _, spacing, message, resampled):
        """Wrong units ran silently to 13 GB (50 mm) or were refused for their intensities (0.01 mm): both are named
        by their spacing before any work, whatever the memory."""
        src = _save(self.dir / "ct.nii.gz", (48, 48, 32), spacing)
        with self.assertRaises(ResourceError) as ctx:
            feasibility.check_image(src, "cpu")
        self.assertIn(message, str(ctx.exception))
        self.assertIn(f"resampled to 1.5 mm: {resampled} voxels", str(ctx.exception))
        self.assertIn("set it to the voxel size in mm", str(ctx.exception))
        for edge in feasibility.CT_SPACING_MM:  # the range's ends are CTs
            feasibility.check_image(_save(self.dir / "edge.nii.gz", (8, 8, 8), edge), "cpu")

    def test_spacing_of_the_affine(self):
        """The spacing the pipeline resamples by: the sform's, where the pixdim says another."""
        img = nib.Nifti1Image(np.zeros((8, 8, 8), np.int16), np.diag([50.0, 50.0, 50.0, 1.0]))
        img.header["pixdim"][1:4] = 1.0
        nib.save(img, self.dir / "sform.nii.gz")
        with self.assertRaisesRegex(ResourceError, "voxel spacing 50 x 50 x 50 mm"):
            feasibility.check_image(self.dir / "sform.nii.gz", "cpu")

    @parameterized.expand([
        ((300, 300, 300), 128, 0.25, 27, None),
        ((300, 300, 300), 128, 0.75, 343, None),
        ((300, 300, 300), 128, 0.9, 4096, "4,096 windows"),
        ((240, 240, 400), 32, 0.95, 209 * 209 * 369, "16,118,289 windows"),
        ((20, 20, 20), 32, 0.95, 1, None),  # one window holds it all
    ])
    def test_window_passes(self, shape, roi, overlap, count, refused):
        from monai.apps.vista3d.config import SettingError
        from monai.inferers import plan_sliding_windows

        if count < 10000:  # the count is the planner's
            self.assertEqual(plan_sliding_windows(shape, roi, overlap).num_windows, count)
        self.assertEqual(feasibility.window_count(shape, (roi,) * 3, overlap), count)
        if refused is None:
            feasibility.check_window_passes(shape, (roi,) * 3, overlap, "ct.nii.gz")
            return
        with self.assertRaises(SettingError) as ctx:
            feasibility.check_window_passes(shape, (roi,) * 3, overlap, "ct.nii.gz")
        self.assertEqual(ctx.exception.field, "overlap")
        self.assertIn(refused, str(ctx.exception))
        self.assertIn("use a smaller overlap (the bundle's 0.25) or a larger roi_size", str(ctx.exception))

    def test_cli_refuses_an_overlap_up_front(self):
        src = _save(self.dir / "ct.nii.gz", (160, 160, 120), 1.5)
        out = self.dir / "out"
        with mock.patch.object(Vista3DPipeline, "segment", side_effect=AssertionError("segmented")):
            code, _, err = run_main([src, "-o", out, *TINY, "--overlap", "0.95"])
        self.assertEqual(code, 2, err)
        lines = [ln for ln in err.splitlines() if not ln.startswith("WARNING: no --weights")]
        self.assertEqual(len(lines), 1, err)
        self.assertRegex(lines[0], r"^error: --overlap 0.95 with --roi-size 32 x 32 x 32 would run [\d,]+ windows on "
                                   r".*ct.nii.gz \([\d,]+ passes over each voxel, at most 100 are allowed\)")
        self.assertFalse(out.exists())

    def test_pipeline_refuses_the_overlap_before_the_windows(self):
        from monai.apps.vista3d.config import SettingError
        from tests.apps.vista3d.stub_vista import StubVista

        stub = StubVista({1: 300.0})
        pipe = Vista3DPipeline(stub, device="cpu", roi_size=32, overlap=0.95, warn_random=False)
        with self.assertRaisesRegex(SettingError, "overlap 0.95 with roi_size 32 x 32 x 32 would run"):
            pipe.segment(torch.full((1, 96, 96, 64), 40.0), np.diag([1.5, 1.5, 1.5, 1.0]), classes=[1])
        self.assertEqual(stub.calls, 0)

    def test_inflated_volume_larger_than_memory(self):
        """A header whose inflated data exceeds the memory there is (a gzip bomb) is refused before reading."""
        src = _save(self.dir / "bomb.nii.gz", (64, 64, 64), 1.5)
        with mock.patch.object(feasibility, "host_memory_available", return_value=2**20):
            with self.assertRaisesRegex(ResourceError, "bomb.nii.gz: segmenting it needs at least"):
                feasibility.check_image(src, "cpu")
        feasibility.check_image(src, "cpu")  # fits this machine

    def test_gzip_known_by_its_bytes_is_checked_as_gzip(self):
        """A gzip-compressed file named .nii (the reader inflates it, told by its bytes) is checked as the .nii.gz it
        is: its header is not taken for a truncated plain file, whose check the load would be left to."""
        src = _save(self.dir / "bomb.nii.gz", (64, 64, 64), 1.5).rename(self.dir / "bomb.nii")
        self.assertTrue(read_header(src).gz)
        with mock.patch.object(feasibility, "host_memory_available", return_value=2**20):
            with self.assertRaisesRegex(ResourceError, "bomb.nii: segmenting it needs at least"):
                feasibility.check_image(src, "cpu")

    def test_raw_allocator_errors_get_one_line(self):
        raw = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory")
        for e in (raw, MemoryError("Unable to allocate 12 GiB")):
            self.assertNotIn("DefaultCPUAllocator", failure_reason(e))
            self.assertIn("not enough memory", failure_reason(e))

    @parameterized.expand([
        (["--roi-size", "16"], "deepest level"),
        (["--roi-size", "100000"], "GiB per window"),
        (["--embed-dim", "800000"], "weights alone"),
    ])
    def test_cli_refuses_settings_before_the_first_image(self, flags, message):
        src = _save(self.dir / "ct.nii.gz", (24, 24, 16), 1.5)
        out = self.dir / "out"
        code, _, err = run_main([src, "-o", out, *TINY, *flags])
        self.assertEqual(code, 2)
        lines = [ln for ln in err.splitlines() if not ln.startswith("WARNING: no --weights")]
        self.assertEqual(len(lines), 1, err)
        self.assertIn(message, lines[0])
        self.assertFalse(out.exists())

    def test_cli_refuses_an_image_that_cannot_fit(self):
        src = _save(self.dir / "coarse.nii.gz", (16, 16, 8), 20.0)
        out = self.dir / "out"
        with mock.patch.object(feasibility, "host_memory_available", return_value=2**25):
            code, _, err = run_main([src, "-o", out, *TINY])
        self.assertEqual(code, 2)
        self.assertRegex(err, r"error: .*coarse.nii.gz: segmenting it needs at least")
        self.assertFalse(out.exists())


class TestWeightsErrors(unittest.TestCase):
    @parameterized.expand([("nan", float("nan")), ("inf", float("inf")), ("overflowing sum", 3e38)])
    def test_non_finite_weights_refused(self, _, value):
        from monai.networks.nets import vista3d132

        with tempfile.TemporaryDirectory() as tmp:
            sd = vista3d132(encoder_embed_dim=8).state_dict()
            key = "image_encoder.encoder.conv_init.weight"
            sd[key] = torch.full_like(sd[key], value)
            path = Path(tmp) / "model.pt"
            torch.save(sd, path)
            if value == 3e38:  # finite values whose float32 sum overflows: loaded
                load_checkpoint(vista3d132(encoder_embed_dim=8), path)
                return
            with self.assertRaises(CheckpointError) as ctx:
                load_checkpoint(vista3d132(encoder_embed_dim=8), path)
            self.assertIn(f"holds NaN or Inf weights in 1 tensor(s): {key}; it is damaged", str(ctx.exception))

    def test_cli_refuses_nan_weights(self):
        from monai.networks.nets import vista3d132

        with tempfile.TemporaryDirectory() as tmp:
            sd = vista3d132(encoder_embed_dim=8).state_dict()
            for key in list(sd)[:3]:
                if sd[key].is_floating_point():
                    sd[key] = torch.full_like(sd[key], float("nan"))
            weights, out = Path(tmp) / "model.pt", Path(tmp) / "o"
            src = _save(Path(tmp) / "ct.nii.gz", (24, 24, 16), 1.5)
            torch.save(sd, weights)
            code, _, err = run_main([src, "-o", out, *TINY, "--weights", weights])
            self.assertEqual(code, 1, err)
            self.assertEqual(len(err.strip().splitlines()), 1, err)
            self.assertRegex(err, r"^error: checkpoint .*model.pt' holds NaN or Inf weights in \d tensor\(s\)")
            self.assertFalse(any(out.rglob("*.nii.gz")))

    def test_random_bytes_are_not_called_a_pickled_network(self):
        from monai.networks.nets import vista3d132

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.pt"
            path.write_bytes(np.random.default_rng(0).bytes(1 << 20))
            with self.assertRaisesRegex(CheckpointError, "not a torch checkpoint.*random or damaged bytes") as ctx:
                load_checkpoint(vista3d132(encoder_embed_dim=8), path)
            self.assertNotIn("torch.save(model)", str(ctx.exception))

    def test_one_wrongly_shaped_tensor_is_not_another_width(self):
        from monai.networks.nets import vista3d132

        with tempfile.TemporaryDirectory() as tmp:
            net = vista3d132(encoder_embed_dim=8)
            sd = net.state_dict()
            sd["image_encoder.encoder.conv_init.weight"] = torch.zeros(3, 1, 3, 3, 3)
            path = Path(tmp) / "model.pt"
            torch.save(sd, path)
            with self.assertRaisesRegex(CheckpointError, r"1 shape mismatches: image_encoder.encoder.conv_init") as ctx:
                load_checkpoint(net, path)
            self.assertNotIn("set encoder_embed_dim", str(ctx.exception))


if __name__ == "__main__":
    unittest.main()
