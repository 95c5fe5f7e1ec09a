"""look_up_option: matches as in MONAI 1.6.1, and its error suggests the closest option."""

from __future__ import annotations

import unittest
from enum import Enum

from parameterized import parameterized

from monai.utils import BlendMode, StrEnum, look_up_option
from monai.utils.misc import edit_distance


class Colour(Enum):
    RED = "red"
    BLUE = "blue"


class Other(Enum):
    RED = "red"


class Mode(StrEnum):
    FAST = "fast"


class TestLookUpOption(unittest.TestCase):
    @parameterized.expand(
        [
            ["tuple", "b", ("a", "b"), "b"],
            ["set_spaces", "  a ", {"a", "b"}, "a"],
            ["mapping", 2, {1: "one", 2: "two"}, "two"],
            ["enum_value", "blue", Colour, Colour.BLUE],
            ["enum_member", Colour.RED, Colour, Colour.RED],
            ["str_enum", "fast", Mode, Mode.FAST],
        ]
    )
    def test_found(self, _, option, supported, expected):
        self.assertEqual(look_up_option(option, supported), expected)

    @parameterized.expand(
        [
            ["misspelt_norm", "GROP", ("INSTANCE", "BATCH", "GROUP"), r"did you mean 'GROUP'\?"],
            ["misspelt_enum", "gausian", BlendMode, r"did you mean 'gaussian'\?"],
            ["number_in_mapping", 3, {1: "a", 2: "b", "c": 3}, r"did you mean '1'\?"],
            ["swapped_letters", "rde", Colour, r"did you mean 'red'\?"],
        ]
    )
    def test_suggestion(self, _, option, supported, message):
        with self.assertRaisesRegex(ValueError, f"Unsupported option '{option}', {message} Available options"):
            look_up_option(option, supported)

    @parameterized.expand(
        [
            ["far_from_all", "not here", {"a": 1, "b": 2}],
            ["member_of_another_enum", Other.RED, Colour],
            ["none_in_enum", None, BlendMode],
        ]
    )
    def test_unsupported_without_suggestion(self, _, option, supported):
        with self.assertRaisesRegex(ValueError, "Unsupported option") as ctx:
            look_up_option(option, supported)
        self.assertNotIn("did you mean", str(ctx.exception))

    def test_options_listed_only_when_asked(self):
        with self.assertRaises(ValueError) as ctx:
            look_up_option("x", ["abcdef"], print_all_options=False)
        self.assertNotIn("abcdef", str(ctx.exception))

    @parameterized.expand([["none", None], ["empty", ()]])
    def test_no_options(self, _, supported):
        with self.assertRaisesRegex(ValueError, "No options available"):
            look_up_option("a", supported)

    def test_unhashable(self):
        with self.assertRaisesRegex(ValueError, "Unrecognized option type"):
            look_up_option(["a"], {"a": 1})

    def test_default(self):
        self.assertIsNone(look_up_option("zz", {"a"}, default=None))

    @parameterized.expand(
        [["same", "abc", "abc", 0], ["insert", "abc", "abxc", 1], ["empty", "", "abc", 3], ["swap", "abcd", "acbd", 1],
         ["kitten", "kitten", "sitting", 3]]
    )
    def test_edit_distance(self, _, a, b, expected):
        self.assertEqual(edit_distance(a, b), expected)
        self.assertEqual(edit_distance(b, a), expected)


if __name__ == "__main__":
    unittest.main()
