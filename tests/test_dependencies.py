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
"""The dependency rules of docs/architecture.md, read from every import in monai/ (function-level ones too)."""

from __future__ import annotations

import ast
import unittest
from pathlib import Path

from parameterized import parameterized

ROOT = Path(__file__).resolve().parents[1] / "monai"

# package -> packages it must never import (its own layer and those below are allowed)
FORBIDDEN = [
    ("monai.utils", ("monai.networks", "monai.inferers", "monai.transforms", "monai.apps")),
    ("monai.transforms", ("monai.networks", "monai.inferers", "monai.apps")),
    ("monai.networks.kernels", ("monai.networks.layers", "monai.networks.blocks", "monai.networks.nets", "monai.inferers", "monai.transforms", "monai.apps")),
    ("monai.networks.layers", ("monai.networks.blocks", "monai.networks.nets", "monai.transforms", "monai.apps")),
    ("monai.networks.blocks", ("monai.networks.nets", "monai.inferers", "monai.transforms", "monai.apps")),
    ("monai.networks.nets", ("monai.inferers", "monai.transforms", "monai.apps")),
    ("monai.inferers", ("monai.networks", "monai.transforms", "monai.apps")),
]


def _imports(path: Path) -> set[str]:
    """Absolute names of the monai modules that ``path`` imports."""
    package = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names)
    return {n for n in names if n.startswith("monai.")}


class TestDependencies(unittest.TestCase):
    @parameterized.expand(FORBIDDEN)
    def test_points_downwards(self, package, forbidden):
        folder = ROOT.parent.joinpath(*package.split("."))
        bad = []
        for path in sorted(folder.rglob("*.py")):
            for name in _imports(path):
                if any(name == f or name.startswith(f + ".") for f in forbidden):
                    bad.append(f"{path.relative_to(ROOT.parent)} imports {name}")
        self.assertEqual(bad, [])

    def test_inferers_name_no_app(self):
        """Not even in a docstring: the window loop serves the apps without knowing them."""
        named = [p.name for p in sorted((ROOT / "inferers").rglob("*.py")) if "apps" in p.read_text()]
        self.assertEqual(named, [])

    def test_apps_use_public_inferer_names(self):
        private = [
            f"{path.relative_to(ROOT.parent)} imports {name}"
            for path in sorted((ROOT / "apps").rglob("*.py"))
            for name in _imports(path)
            if name.startswith("monai.inferers.") and name.rsplit(".", 1)[-1].startswith("_")
        ]
        self.assertEqual(private, [])

    def test_cli_uses_public_names(self):
        """The command reaches the package through its public names. The standard library's way out of a process
        (``os._exit``, and ``atexit._run_exitfuncs`` before it: ``cli.main.run``) is not the package's."""
        tree = ast.parse((ROOT / "apps" / "vista3d" / "cli" / "main.py").read_text())
        private = [
            f"{node.value.id}.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
        ]
        private = [name for name in private if name not in ("os._exit", "atexit._run_exitfuncs")]
        imported = [
            a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names
            if a.name.startswith("_")
        ]
        self.assertEqual((private, imported), ([], []))



# The rooms of monai.apps.vista3d from the bottom up: a module imports only from its own room and those below it.
APP = "monai.apps.vista3d"
APP_ROOMS = ("errors", "inferer", "labels", "config", "io", "core", "batch", "server", "cli")


def _room(module: str) -> str | None:
    """The room of an app module (``monai.apps.vista3d.io.nifti`` -> ``io``); None for the package face."""
    rest = module[len(APP) + 1:].split(".") if module.startswith(APP + ".") else []
    return rest[0] if rest else None


def _is_upstream_stub(path: Path) -> bool:
    """Whether ``path`` is the stub of an upstream module the fork lacks: it only raises ``not_carried_error``."""
    last = ast.parse(path.read_text()).body[-1]
    return (isinstance(last, ast.Raise) and isinstance(last.exc, ast.Call) and isinstance(last.exc.func, ast.Name)
            and last.exc.func.id == "not_carried_error")


class TestAppLayers(unittest.TestCase):
    def _modules(self):
        """The app's modules, without the stubs of upstream's (``sampler``, ``transforms``), which are no room."""
        for path in sorted((ROOT / "apps" / "vista3d").rglob("*.py")):
            if _is_upstream_stub(path):
                continue
            module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
            yield path, module.removesuffix(".__init__")

    def test_upstream_stubs(self):
        stubs = sorted(p.stem for p in (ROOT / "apps" / "vista3d").rglob("*.py") if _is_upstream_stub(p))
        self.assertEqual(stubs, ["sampler", "transforms"])

    def test_every_module_has_a_room(self):
        rooms = {_room(m) for _, m in self._modules()} - {None, "__main__"}
        self.assertEqual(rooms - set(APP_ROOMS), set())

    def test_imports_only_downward(self):
        bad = []
        for path, module in self._modules():
            room = _room(module)
            if room in (None, "__main__"):  # the package's face and ``python -m`` name what they hand on
                continue
            for name in _imports(path):
                other = _room(name)
                if other in APP_ROOMS and APP_ROOMS.index(other) > APP_ROOMS.index(room):
                    bad.append(f"{module} imports {name}")
        self.assertEqual(bad, [])

    def test_no_private_name_of_another_module(self):
        bad = []
        for path, module in self._modules():
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and (node.level or node.module.startswith(APP)):
                    bad += [f"{module} imports {node.module}.{a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
        self.assertEqual(bad, [])

if __name__ == "__main__":
    unittest.main()
