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
"""Record the public names of upstream MONAI's carried modules, and the names of all its public modules, into
``upstream_public_names.json`` (names only).

Run with upstream MONAI 1.6.1 installed (e.g. ``pip install --target /tmp/up monai==1.6.1``) and from a directory
where this fork's ``monai`` is not importable::

    cd /tmp && PYTHONPATH=/tmp/up python /path/to/fork/tests/testing_data/record_upstream_names.py

A module's public names are its ``__all__``, else the names of ``dir(module)`` without a leading underscore; of
those that are modules only its own submodules count (not e.g. ``torch``), and ``annotations`` (the
``from __future__`` feature) is left out. Each name is stored with its kind: module, class, function or value.
``submodules`` lists every module and subpackage of upstream's ``monai`` whose dotted name has no part with a
leading underscore, as found in its folders (none of them is imported for it).
tests/test_upstream_names.py checks every one against the fork.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import pkgutil
import types

MODULES = (
    "monai.apps.vista3d",
    "monai.inferers",
    "monai.networks.blocks",
    "monai.networks.layers",
    "monai.networks.nets",
    "monai.transforms.utils",
    "monai.utils",
    "monai.utils.profiling",
)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "upstream_public_names.json")


def kind_of(obj) -> str:
    if isinstance(obj, types.ModuleType):
        return "module"
    if inspect.isclass(obj):
        return "class"
    return "function" if callable(obj) else "value"


def public_names(module_name: str) -> dict[str, str]:
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
    found = {}
    for name in sorted(set(names) - {"annotations"}):
        obj = getattr(module, name)
        if isinstance(obj, types.ModuleType) and not obj.__name__.startswith(f"{module_name}."):
            continue  # a module it imported, not one of its own
        found[name] = kind_of(obj)
    return found


def submodule_names(package_name: str, folder: str) -> list[str]:
    """The public modules and subpackages under ``folder`` (the package ``package_name``), at every depth."""
    found = []
    for info in pkgutil.iter_modules([folder]):
        if info.name.startswith("_"):
            continue
        name = f"{package_name}.{info.name}"
        found.append(name)
        if info.ispkg:
            found += submodule_names(name, os.path.join(folder, info.name))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    import monai

    if monai.__version__ != "1.6.1":
        raise SystemExit(f"needs upstream MONAI 1.6.1 on the path, found {monai.__version__} at {monai.__file__}")
    record = {
        "monai_version": monai.__version__,
        "modules": {m: public_names(m) for m in MODULES},
        "submodules": sorted(submodule_names("monai", os.path.dirname(monai.__file__))),
    }
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    names = sum(map(len, record["modules"].values()))
    print(f"{names} names of {len(MODULES)} modules, {len(record['submodules'])} module names -> {args.out}")


if __name__ == "__main__":
    main()
