"""Source edits located by name: a function's span, a call inside it, a parameter, an import.

Every edit finds its place with Python's ``ast`` (a class, a function, a call by its attribute name) and raises
``EditError`` with a one-line reason when the place is not there, so that a moved upstream function is reported
instead of patched in the wrong spot.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Callable


class EditError(RuntimeError):
    """The code an edit is meant for is not where the edit looks for it."""


def find_def(source: str, qualname: str) -> ast.FunctionDef | ast.ClassDef:
    """The ``def``/``class`` node named ``qualname`` ("Class.method", "Class" or "function")."""
    body = ast.parse(source).body
    node = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if node is None:
            raise EditError(f"{qualname} not found")
        body = node.body
    return node  # type: ignore[return-value]


def _offset(source: str, line: int, col: int) -> int:
    """Character offset of ast position (1-based line, 0-based utf-8 byte column)."""
    lines = source.splitlines(keepends=True)
    prefix = lines[line - 1].encode()[:col].decode()
    return sum(len(x) for x in lines[: line - 1]) + len(prefix)


def node_span(source: str, node: ast.AST) -> tuple[int, int]:
    """Character span ``[start, end)`` of ``node`` in ``source``."""
    start = _offset(source, node.lineno, node.col_offset)  # type: ignore[attr-defined]
    end = _offset(source, node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
    return start, end


def replace_span(source: str, span: tuple[int, int], text: str) -> str:
    return source[: span[0]] + text + source[span[1] :]


def _indent_of(source: str, node: ast.AST) -> str:
    line = source.splitlines()[node.lineno - 1]  # type: ignore[attr-defined]
    return line[: len(line) - len(line.lstrip())]


def _is_call(node: ast.AST, attr: str, nargs: int | None = None) -> bool:
    """``node`` is a call of a method or function whose last name is ``attr``."""
    if not isinstance(node, ast.Call):
        return False
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
    return name == attr and (nargs is None or len(node.args) + len(node.keywords) == nargs)


def find_calls(source: str, qualname: str, attr: str, nargs: int | None = None) -> list[ast.Call]:
    """Calls of ``*.attr(...)`` (or ``attr(...)``) inside ``qualname``, in source order."""
    calls = [n for n in ast.walk(find_def(source, qualname)) if _is_call(n, attr, nargs)]
    return sorted(calls, key=lambda n: (n.lineno, n.col_offset))  # type: ignore[misc]


def edit_calls(source: str, qualname: str, attr: str, rewrite: Callable[[str, ast.Call], str], nargs=None) -> str:
    """Replace each call of ``attr`` in ``qualname`` by ``rewrite(source, call)``; at least one must exist."""
    calls = find_calls(source, qualname, attr, nargs)
    if not calls:
        raise EditError(f"{qualname} has no call of {attr}()")
    for call in reversed(calls):  # from the end so that earlier spans stay valid
        source = replace_span(source, node_span(source, call), rewrite(source, call))
    return source


def guard_statements(source: str, qualname: str, attr: str, condition: str) -> str:
    """Put every expression statement calling ``attr`` in ``qualname`` under ``if condition:``."""
    func = find_def(source, qualname)
    stmts = [n for n in ast.walk(func) if isinstance(n, ast.Expr) and _is_call(n.value, attr)]
    if not stmts:
        raise EditError(f"{qualname} has no statement calling {attr}()")
    for stmt in sorted(stmts, key=lambda n: n.lineno, reverse=True):
        start, end = node_span(source, stmt)
        indent = _indent_of(source, stmt)
        text = f"if {condition}:\n{indent}    {source[start:end]}"
        source = replace_span(source, (start, end), text)
    return source


def add_parameter(source: str, qualname: str, text: str) -> str:
    """Append ``text`` (e.g. ``"flag: bool = False"``) as the last named parameter of ``qualname``."""
    func = find_def(source, qualname)
    if not isinstance(func, ast.FunctionDef):
        raise EditError(f"{qualname} is not a function")
    if func.args.vararg or func.args.kwarg:
        raise EditError(f"{qualname} takes *args/**kwargs; a new parameter would change their meaning")
    last = (func.args.args + func.args.kwonlyargs)[-1]
    defaults = func.args.defaults + [d for d in func.args.kw_defaults if d is not None]
    end_node = defaults[-1] if defaults and node_span(source, defaults[-1])[0] > node_span(source, last)[0] else last
    end = node_span(source, end_node)[1]
    if "\n" in source[node_span(source, func)[0] : end]:  # one parameter per line: keep that layout
        indent = _indent_of(source, last)
        return replace_span(source, (end, end), f",\n{indent}{text}")
    one_line = source.splitlines()[func.lineno - 1]
    if len(one_line) + len(text) + 2 <= 120:
        return replace_span(source, (end, end), f", {text}")
    # too long for one line: one parameter per line, as black would lay it out
    first = node_span(source, (func.args.posonlyargs + func.args.args + func.args.kwonlyargs)[0])[0]
    params = [p.strip() for p in _split_params(source[first:end])] + [text]
    indent = _indent_of(source, func)
    block = "".join(f"\n{indent}    {p}," for p in params) + f"\n{indent}"
    return replace_span(source, (first, end), block)


def _split_params(text: str) -> list[str]:
    """Split a parameter list at its top-level commas."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def append_to_body(source: str, qualname: str, code: str) -> str:
    """Add ``code`` (dedented) as the last statements of function ``qualname``."""
    func = find_def(source, qualname)
    indent = _indent_of(source, func.body[-1])
    end = node_span(source, func.body[-1])[1]
    block = textwrap.indent(textwrap.dedent(code).strip("\n"), indent)
    return replace_span(source, (end, end), "\n" + block)


def insert_before(source: str, node: ast.stmt, code: str) -> str:
    """Insert ``code`` (dedented) as statements just before statement ``node``, at its indentation."""
    indent = _indent_of(source, node)
    start = _offset(source, node.lineno, 0)
    block = textwrap.indent(textwrap.dedent(code).strip("\n"), indent)
    return replace_span(source, (start, start), block + "\n")


def insert_after(source: str, qualname: str, code: str) -> str:
    """Insert ``code`` (dedented, at the definition's own indentation) after the definition ``qualname``."""
    node = find_def(source, qualname)
    indent = _indent_of(source, node)
    end = node_span(source, node)[1]
    block = textwrap.indent(textwrap.dedent(code).strip("\n"), indent)
    return replace_span(source, (end, end), "\n\n" + ("\n" if not indent else "") + block)


def add_docstring_arg(source: str, qualname: str, text: str) -> str:
    """Append an entry (``"name: what it does."``) to the ``Args:`` section of ``qualname``'s docstring."""
    node = find_def(source, qualname)
    doc = node.body[0] if node.body else None
    if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
        raise EditError(f"{qualname} has no docstring")
    lines = source.splitlines(keepends=True)
    first, last = doc.lineno - 1, doc.end_lineno - 1  # type: ignore[operator]
    args_at = next((i for i in range(first, last + 1) if lines[i].strip() == "Args:"), None)
    if args_at is None:
        raise EditError(f"{qualname}'s docstring has no Args: section")
    head = len(lines[args_at]) - len(lines[args_at].lstrip())
    end = args_at + 1
    while end < last and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > head):
        end += 1
    while not lines[end - 1].strip():  # keep the blank line that closes the section after the new entry
        end -= 1
    entry = textwrap.indent(textwrap.fill(text, 116 - head, subsequent_indent="    "), " " * (head + 4))
    return "".join(lines[:end]) + entry + "\n" + "".join(lines[end:])


def add_import(source: str, module: str) -> str:
    """Add ``import module`` among the module's top-level plain imports, in alphabetical place."""
    tree = ast.parse(source)
    plain = [n for n in tree.body if isinstance(n, ast.Import)]
    if any(a.name == module for n in plain for a in n.names):
        return source
    if not plain:
        raise EditError(f"no top-level 'import ...' statement to place 'import {module}' beside")
    before = [n for n in plain if n.names[0].name < module]
    anchor = before[-1] if before else plain[0]
    at = _offset(source, anchor.end_lineno if before else anchor.lineno, 0)  # type: ignore[arg-type]
    if before:
        at = _offset(source, anchor.end_lineno, 0) + len(source.splitlines(keepends=True)[anchor.end_lineno - 1])
    return source[:at] + f"import {module}\n" + source[at:]
