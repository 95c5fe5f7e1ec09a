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
"""The batch's label map is cast to the narrow type where it is and crosses to the host once, slab by slab."""

from __future__ import annotations

import pathlib
import tempfile
import unittest
from unittest import mock

import nibabel as nib
import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.batch import workers as batch_workers
from monai.apps.vista3d.batch.run import run_batch
from monai.apps.vista3d.cli.phantom import write_phantom
from monai.apps.vista3d.io import label_transfer
from tests.apps.vista3d.stub_vista import stub_job

SHAPE = (24, 20, 16)


class TestLabelMapToTheSaver(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = pathlib.Path(self._tmp.name)
        self.images = [write_phantom(self.tmp / f"ct{i}.nii.gz", SHAPE, seed=i) for i in range(2)]

    def _run(self, output_dtype: str, off_host: bool):
        """run_batch with the label map treated as on a GPU (``off_host``): every host copy of the whole label map
        or of a file-order slab of it (its z-slices), every device cast, and what the saver was handed."""
        copies, casts, saved = [], [], []
        real_cpu, real_save = torch.Tensor.cpu, batch_workers.save_label_map
        real_cast = label_transfer.to_device_file_order

        def counted_cpu(t, *a, **k):
            if tuple(t.shape) in (SHAPE, (1, *SHAPE)):
                copies.append((t.dtype, "the whole map"))
            elif t.ndim == 3 and tuple(t.shape[1:]) == (SHAPE[1], SHAPE[0]):  # a file-order slab [z, Y, X]
                copies.append((t.dtype, int(t.shape[0])))
            return real_cpu(t, *a, **k)

        def counted_cast(t, dtype):
            out = real_cast(t, dtype)
            casts.append((t.dtype, out.data.dtype))
            return out

        def recorded_save(labels, geometry, path, **kw):
            saved.append((type(labels).__name__, getattr(labels, "dtype", None), kw.get("dtype")))
            return real_save(labels, geometry, path, **kw)

        with mock.patch.object(torch.Tensor, "cpu", counted_cpu), \
                mock.patch.object(label_transfer, "to_device_file_order", counted_cast), \
                mock.patch.object(batch_workers, "save_label_map", recorded_save), \
                mock.patch.object(batch_workers, "_on_device", lambda labels: off_host):
            result = run_batch(self.images, self.tmp / f"{output_dtype}-{off_host}",
                               stub_job([1, 20], output_dtype=output_dtype))
        self.assertEqual(result.done, 2, result.records)
        return copies, casts, saved, [pathlib.Path(r["output"]) for r in result.records]

    @parameterized.expand([("uint8",), ("int16",), ("float32",)])
    def test_label_map_crosses_once_as_uint8(self, output_dtype):
        copies, casts, saved, outputs = self._run(output_dtype, off_host=True)
        # one cast per image where the map is, to one byte a voxel (every label id fits uint8) ...
        self.assertEqual(casts, [(torch.int16, torch.uint8)] * 2)
        # ... and the only host copies of a label map are slabs of that uint8 one, every z-slice once per image
        self.assertEqual({dtype for dtype, _ in copies}, {torch.uint8})
        self.assertEqual(sum(slices for _, slices in copies), 2 * SHAPE[2])
        self.assertEqual(saved, [("DeviceLabelMap", None, output_dtype)] * 2)
        _, _, _, on_host = self._run(output_dtype, off_host=False)  # the same run with the map on the host
        for out, ref in zip(outputs, on_host):
            written = nib.load(str(out))
            self.assertEqual(written.get_data_dtype(), np.dtype(output_dtype))
            self.assertGreater(len(np.unique(np.asarray(written.dataobj))), 1)  # labels, not all background
            np.testing.assert_array_equal(np.asarray(written.dataobj), np.asarray(nib.load(str(ref)).dataobj))

    def test_host_label_map_is_not_copied(self):
        _, casts, saved, _ = self._run("uint8", off_host=False)
        self.assertEqual(casts, [])  # a CPU map is handed to the saver as it is
        self.assertEqual([s[0] for s in saved], ["Tensor"] * 2)


if __name__ == "__main__":
    unittest.main()
