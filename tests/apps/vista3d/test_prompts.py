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

from monai.apps.vista3d.core.prompts import parse_prompt
from monai.apps.vista3d.errors import PromptError


class TestParsedOnce(unittest.TestCase):
    def test_a_parsed_prompt_passes_through(self):
        prompt = parse_prompt("liver,3")
        self.assertIs(parse_prompt(prompt), prompt)
        self.assertEqual(list(prompt.label_ids), [1, 3])

    def test_points_given_twice_refused(self):
        prompt = parse_prompt(None, [[1, 2, 3]], [1])
        with self.assertRaisesRegex(PromptError, "not both"):
            parse_prompt(prompt, [[4, 5, 6]], [1])


if __name__ == "__main__":
    unittest.main()
