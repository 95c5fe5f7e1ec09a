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
"""The errors of the VISTA3D app, in one place.

Every error is a :class:`Vista3DInputError` (a ``ValueError``) whose message is one line: what is wrong and
how to fix it. Callers that only want to report bad input catch that base class.
"""

from __future__ import annotations

__all__ = [
    "Vista3DInputError",
    "Vista3DOutputError",
    "PromptError",
    "ClassPromptError",
    "CheckpointError",
    "EmptyForegroundError",
    "OutputPathError",
    "OutputCollisionError",
    "ResourceError",
    "DicomChoiceError",
    "WorkerError",
    "first_line",
]


class Vista3DInputError(ValueError):
    """An input the VISTA3D pipeline cannot use (file, image, prompt or option); the message says why."""


class Vista3DOutputError(Vista3DInputError):
    """An output that cannot be written where asked (unwritable folder, output equal to the input, ...)."""


class PromptError(Vista3DInputError):
    """Point or class prompts that cannot be used (outside the image, labels missing, ...)."""


class ClassPromptError(Vista3DInputError):
    """A class prompt names a label that VISTA3D does not know."""


class CheckpointError(Vista3DInputError):
    """A checkpoint that does not fit the network (missing/unexpected keys, other shapes) or cannot be read."""


class EmptyForegroundError(Vista3DInputError):
    """The image has no voxel above the foreground threshold, so there is nothing to crop or segment."""


class OutputPathError(Vista3DOutputError):
    """The output cannot be written where asked (not writable, or it would overwrite the input)."""


class OutputCollisionError(Vista3DOutputError):
    """Two different inputs would be written to the same output file; raised before any work starts."""


class ResourceError(Vista3DInputError):
    """Settings or an image that cannot run here (a window the network cannot take, not enough memory); raised
    before any work, with what it needs."""


class DicomChoiceError(Vista3DInputError):
    """A DICOM input that a reading option would let through: several series (``option`` is ``"series"``, which
    picks one) or a modality other than CT (``"allow_modality"``).

    Args:
        message: the whole line, naming the option as the command line spells it.
        problem: what the input holds, without the path and the remedy (``"holds 2 series: ..."``), for front
            ends that word their own (the server, which takes no such option).
        option: the :class:`~monai.apps.vista3d.config.DicomOptions` field that would let it through.
    """

    def __init__(self, message: str, problem: str, option: str):
        super().__init__(message)
        self.problem = problem
        self.option = option


class WorkerError(RuntimeError):
    """A background thread of the run ended without handing on its result or its error."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none): what a one-line report shows
    of an error raised by another library."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
