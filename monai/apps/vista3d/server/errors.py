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
"""The one error the server's rooms raise (an HTTP status, one message, and the headers it needs), and the refusals
that several rooms word alike."""

from __future__ import annotations

__all__ = ["ServeError", "too_many_voxels"]


class ServeError(Exception):
    """A request the server answers with ``status`` and ``{"detail": message}``.

    Args:
        status: the HTTP status (4xx for the client's input, 5xx for the server's state).
        message: one line: what is wrong and what to do about it.
        headers: extra response headers (``Retry-After``, ``WWW-Authenticate``).
    """

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


def too_many_voxels(voxels: int, max_voxels: int, counted: str) -> ServeError:
    """The 413 for an image over ``--max-voxels``, found from its header (or a zip's DICOM headers) before any of its
    voxels is read: a NIfTI, NRRD or zipped DICOM image is refused in the same words.

    Args:
        voxels: the voxels counted.
        max_voxels: the server's ``--max-voxels``.
        counted: how ``voxels`` was counted, in a few words (the image's shape; for a zip, that counting stopped at
            the first DICOM file past the limit).
    """
    return ServeError(413, f"the image has {voxels} voxels ({counted}), more than --max-voxels {max_voxels}; "
                           "refused before any voxel was read")
