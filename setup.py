"""Packaging for the VISTA3D fork of MONAI.

The distribution is named ``monai`` so that code written for upstream MONAI imports it unchanged; the
local version label says which upstream release it tracks.
"""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent


def _requirements(name: str) -> list[str]:
    lines = (HERE / name).read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith(("#", "-r"))]


setup(
    name="monai",
    version="1.6.1+vista3d",
    description="A fast VISTA3D inference stack, API- and checkpoint-compatible with MONAI 1.6.1",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    packages=find_packages(include=["monai", "monai.*"]),
    package_data={"monai.apps.vista3d": ["vista3d_labels.json"]},
    install_requires=_requirements("requirements.txt"),
    extras_require={
        "dev": _requirements("requirements-dev.txt") + _requirements("requirements-serve.txt")
        + _requirements("requirements-dicom.txt"),  # -r is skipped
        "tqdm": ["tqdm"],
        "scipy": ["scipy>=1.10"],
        "isal": ["isal>=1.6"],
        "rapidgzip": ["rapidgzip>=0.16"],  # where requirements.txt does not install it (no wheels)
        "serve": _requirements("requirements-serve.txt"),  # vista3d serve: the HTTP server
        "nrrd": ["pynrrd>=1.0"],  # NRRD inputs of vista3d serve (its NRRD answers are written by the app)
        "dicom": _requirements("requirements-dicom.txt"),  # DICOM series in, DICOM SEG out
        "preview": ["pillow>=9"],  # vista3d --preview (the 'dicom' extra brings it too)
    },
    entry_points={"console_scripts": ["vista3d=monai.apps.vista3d.cli.main:run"]},
)
