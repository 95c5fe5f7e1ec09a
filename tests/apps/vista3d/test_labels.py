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
"""Class names: VISTA3D's, spelt with underscores (the mask files' names), and TotalSegmentator's as aliases."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

from parameterized import parameterized

from monai.apps.vista3d.errors import ClassPromptError
from monai.apps.vista3d.io.paths import class_file_name
from monai.apps.vista3d.labels import label_names, parse_classes, totalsegmentator_aliases
from tests.apps.vista3d.test_cli import TINY, _write_ct, run_main

# TotalSegmentator v2 ("total" task) names as its files are named, and the VISTA3D label of the same structure
TOTALSEGMENTATOR = [
    ("kidney_right", 5), ("kidney_left", 14), ("adrenal_gland_right", 8), ("adrenal_gland_left", 9),
    ("lung_upper_lobe_left", 28), ("lung_lower_lobe_left", 29), ("lung_upper_lobe_right", 30),
    ("lung_middle_lobe_right", 31), ("lung_lower_lobe_right", 32), ("urinary_bladder", 15),
    ("kidney_cyst_left", 116), ("kidney_cyst_right", 117), ("subclavian_artery_right", 124),
    ("subclavian_artery_left", 123), ("common_carotid_artery_right", 113), ("common_carotid_artery_left", 112),
    ("brachiocephalic_vein_left", 110), ("brachiocephalic_vein_right", 111), ("atrial_appendage_left", 108),
    ("iliac_artery_left", 58), ("iliac_artery_right", 59), ("iliac_vena_left", 60), ("iliac_vena_right", 61),
    ("humerus_left", 87), ("scapula_right", 90), ("clavicula_left", 91), ("femur_right", 94), ("hip_left", 95),
    ("gluteus_maximus_left", 98), ("gluteus_medius_right", 101), ("gluteus_minimus_left", 102),
    ("autochthon_right", 105), ("iliopsoas_left", 106), ("rib_left_1", 63), ("rib_left_12", 74),
    ("rib_right_1", 75), ("rib_right_12", 86),
    # spelt alike once underscores are spaces: no alias needed
    ("spleen", 3), ("thyroid_gland", 126), ("small_bowel", 19), ("vertebrae_L1", 37), ("vertebrae_S1", 127),
    ("vertebrae_C1", 56), ("inferior_vena_cava", 7), ("portal_vein_and_splenic_vein", 17), ("spinal_cord", 121),
    ("costal_cartilages", 114), ("superior_vena_cava", 125), ("brachiocephalic_trunk", 109),
]


class TestClassNames(unittest.TestCase):
    @parameterized.expand(TOTALSEGMENTATOR)
    def test_totalsegmentator_names(self, name, label_id):
        self.assertEqual(parse_classes(name), [label_id])
        self.assertEqual(parse_classes(name.upper()), [label_id])

    def test_every_mask_file_name_is_a_class_name(self):
        """``--per-class`` writes ``right_kidney.nii.gz``: that name prompts the same class again."""
        for label_id, name in label_names().items():
            if label_id:
                stem = class_file_name(label_id)[: -len(".nii.gz")]
                self.assertEqual(parse_classes(stem, expand_subclasses=False), [label_id], stem)
                self.assertEqual(parse_classes(name, expand_subclasses=False), [label_id], name)

    def test_aliases_map_one_to_one(self):
        names = {v.lower(): k for k, v in label_names().items()}
        aliases = totalsegmentator_aliases()
        self.assertEqual(len(set(aliases.values())), len(aliases))  # no two aliases for one label
        for alias, target in aliases.items():
            self.assertIn(target, names, alias)  # every alias names a VISTA3D label
            self.assertNotIn(alias, names, alias)  # and never shadows another one's name

    @parameterized.expand([
        ("kidny_right", "did you mean 'right kidney'"),
        ("heart_myocardium", "or TotalSegmentator's, e.g. 'kidney_left'"),  # no VISTA3D label: refused
        ("atrial_appendage_right", "unknown class name 'atrial_appendage_right'"),
    ])
    def test_unknown_names(self, name, message):
        with self.assertRaises(ClassPromptError) as ctx:
            parse_classes(name)
        self.assertIn(message, str(ctx.exception))

    def test_command_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            ct = _write_ct(Path(tmp) / "ct.nii.gz")
            flags = list(TINY)
            flags[flags.index("--classes") + 1] = "kidney_right,right_kidney,liver"
            code, _, err = run_main(["-i", ct, "-o", Path(tmp) / "out", *flags, "--per-class"])
            self.assertEqual(code, 0, err)
            self.assertEqual(sorted(p.name for p in (Path(tmp) / "out" / "ct").iterdir()),
                             ["ct_trans.nii.gz", "liver.nii.gz", "right_kidney.nii.gz"])


if __name__ == "__main__":
    unittest.main()
