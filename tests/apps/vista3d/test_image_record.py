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
"""An image's record in a batch run, and its entry in summary.json."""

from __future__ import annotations

import json
import unittest
from pathlib import Path

from monai.apps.vista3d.batch.image_record import ImageRecord

BASE = ["index", "image", "output", "rank", "voxels", "status", "error", "seconds", "windows"]


class TestImageRecord(unittest.TestCase):
    def test_new_has_the_base_fields_only(self):
        entry = ImageRecord.new(3, Path("in/ct.nii.gz"), Path("out/ct/ct_trans.nii.gz"), 1, 1000).as_dict()
        self.assertEqual(list(entry), BASE)
        self.assertEqual(entry, {"index": 3, "image": "in/ct.nii.gz", "output": "out/ct/ct_trans.nii.gz", "rank": 1,
                                 "voxels": 1000, "status": None, "error": None, "seconds": 0.0, "windows": None})

    def test_segmented_then_saved(self):
        rec = ImageRecord.new(0, Path("a.nii.gz"), Path("o/a/a_trans.nii.gz"), 0, 8)
        rec.load_seconds = 0.5
        rec.segmented(0.5, 2.25, {"windows": 27, "sw_batch_size": 4, "stages": {"preprocess": 0.1, "inference": 2.0}})
        self.assertIsNone(rec.status)  # open until its file is written
        rec.saved(0.75)
        entry = rec.as_dict()
        self.assertEqual(entry["status"], "done")
        self.assertEqual(entry["seconds"], 3.5)  # load + segment + save
        self.assertEqual(entry["stages"], {"load": 0.5, "preprocess": 0.1, "inference": 2.0, "save": 0.75})
        self.assertEqual((entry["windows"], entry["sw_batch_size"], entry["segment_seconds"]), (27, 4, 2.25))
        self.assertNotIn("note", entry)
        self.assertEqual(json.loads(json.dumps(entry)), entry)  # what summary.json holds

    def test_a_caller_function_without_batch_size(self):
        rec = ImageRecord.new(0, Path("a.nii.gz"), Path("b.nii.gz"), 0, 8)
        rec.segmented(0.1, 0.2, {"windows": None, "stages": {}})
        self.assertNotIn("sw_batch_size", rec.as_dict())
        self.assertEqual(rec.as_dict()["stages"], {"load": 0.1})


if __name__ == "__main__":
    unittest.main()
