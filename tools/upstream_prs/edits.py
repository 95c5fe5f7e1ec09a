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


def add_parameter(source: str, qualname: str, text: str, allow_kwargs: bool = False) -> str:
    """Append ``text`` (e.g. ``"flag: bool = False"``) as the last named parameter of ``qualname``.

    ``allow_kwargs``: add it before a ``**kwargs`` of ``qualname``, so that the name no longer reaches ``kwargs``
    (the caller has checked that this is meant).
    """
    func = find_def(source, qualname)
    if not isinstance(func, ast.FunctionDef):
        raise EditError(f"{qualname} is not a function")
    if func.args.vararg or (func.args.kwarg and not allow_kwargs):
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


def _import_order(name: str) -> tuple[int, str]:
    """isort's order of imported names: CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name.lower())


def add_from_import(source: str, module: str, names: list[str]) -> str:
    """Import ``names`` from ``module``: added to its top-level ``from module import ...``, or a new one.

    A new statement goes among the top-level ``from`` imports of the same top-level package, in alphabetical
    place; more than 120 characters are laid out one name per line, as black and isort do.
    """
    tree = ast.parse(source)
    level = len(module) - len(module.lstrip("."))
    if level:  # a relative import such as ``.inferer`` in a package's __init__: only added to an existing one
        same = next(
            (
                n
                for n in tree.body
                if isinstance(n, ast.ImportFrom) and n.level == level and n.module == module.lstrip(".")
            ),
            None,
        )
        if same is None:
            raise EditError(f"no top-level 'from {module} import ...' to add {names} to")
    else:
        froms = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module]
        same = next((n for n in froms if n.module == module), None)
    if same is not None:
        if any(a.asname for a in same.names):
            raise EditError(f"'from {module} import ...' renames a name; add {names} by hand")
        merged = sorted({a.name for a in same.names} | set(names), key=_import_order)
        return replace_span(source, node_span(source, same), _from_import(module, merged))
    package = [n for n in froms if n.module.split(".")[0] == module.split(".")[0]]  # type: ignore[union-attr]
    if not package:
        raise EditError(f"no top-level 'from {module.split('.')[0]}... import' to place 'from {module}' beside")
    after = [n for n in package if n.module < module]  # type: ignore[operator]
    text = _from_import(module, sorted(names, key=_import_order))
    if after:
        end = node_span(source, after[-1])[1]
        return replace_span(source, (end, end), "\n" + text)
    start = _offset(source, package[0].lineno, 0)
    return replace_span(source, (start, start), text + "\n")


def _from_import(module: str, names: list[str]) -> str:
    line = f"from {module} import {', '.join(names)}"
    if len(line) <= 120:
        return line
    return f"from {module} import (\n" + "".join(f"    {n},\n" for n in names) + ")"


def extend_all(source: str, name: str) -> str:
    """Append ``name`` to the module's ``__all__ = [...]`` list."""
    node = next(
        (
            n
            for n in ast.parse(source).body
            if isinstance(n, ast.Assign)
            and [getattr(t, "id", None) for t in n.targets] == ["__all__"]
            and isinstance(n.value, ast.List)
        ),
        None,
    )
    if node is None:
        raise EditError("no top-level '__all__ = [...]' to add the new name to")
    items = [ast.literal_eval(e) for e in node.value.elts] + [name]  # type: ignore[attr-defined]
    return replace_span(source, node_span(source, node.value), "[" + ", ".join(f'"{i}"' for i in items) + "]")


def find_statements(source: str, qualname: str, match: Callable[[ast.stmt], bool]) -> list[ast.stmt]:
    """The statements anywhere inside ``qualname`` for which ``match`` is true, in source order."""
    found = [n for n in ast.walk(find_def(source, qualname)) if isinstance(n, ast.stmt) and match(n)]
    return sorted(found, key=lambda n: n.lineno)


def one_statement(source: str, qualname: str, match: Callable[[ast.stmt], bool], what: str) -> ast.stmt:
    """The single statement of ``qualname`` that ``match`` picks; ``EditError`` naming ``what`` otherwise."""
    found = find_statements(source, qualname, match)
    if len(found) != 1:
        raise EditError(f"{qualname}: {what} found {len(found)} times, expected once")
    return found[0]


def segment(source: str, node: ast.AST) -> str:
    """The source text of ``node``."""
    return source[slice(*node_span(source, node))]


def replace_statement(source: str, stmt: ast.stmt, code: str) -> str:
    """Replace statement ``stmt`` (all its lines) by ``code`` (dedented) at its indentation."""
    start = _offset(source, stmt.lineno, 0)
    end = node_span(source, stmt)[1]
    return replace_span(
        source, (start, end), textwrap.indent(textwrap.dedent(code).strip("\n"), _indent_of(source, stmt))
    )


def insert_elif(source: str, if_stmt: ast.If, condition: str, code: str) -> str:
    """Add ``elif condition: code`` to ``if_stmt`` just before its ``else:``."""
    if not if_stmt.orelse or (len(if_stmt.orelse) == 1 and isinstance(if_stmt.orelse[0], ast.If)):
        raise EditError("the if statement has no plain else: branch to put the new branch before")
    lines = source.splitlines(keepends=True)
    at = if_stmt.orelse[0].lineno - 2  # 0-based index of the line above the else branch's first statement
    while at > if_stmt.lineno - 1 and lines[at].strip() != "else:":
        at -= 1
    if lines[at].strip() != "else:":
        raise EditError("no 'else:' line found above the else branch")
    indent = _indent_of(source, if_stmt)
    body = textwrap.indent(textwrap.dedent(code).strip("\n"), indent + "    ")
    block = f"{indent}elif {condition}:\n{body}\n"
    start = sum(len(x) for x in lines[:at])
    return source[:start] + block + source[start:]


def wrap_in_else(source: str, first: ast.stmt, last: ast.stmt, condition: str, code: str) -> str:
    """Turn the statements ``first`` .. ``last`` (one block) into ``if condition: code`` ``else: <them>``."""
    indent = _indent_of(source, first)
    start = _offset(source, first.lineno, 0)
    end = node_span(source, last)[1]
    kept = textwrap.indent(source[start:end], "    ")
    new = textwrap.indent(textwrap.dedent(code).strip("\n"), indent + "    ")
    return replace_span(source, (start, end), f"{indent}if {condition}:\n{new}\n{indent}else:\n{kept}")
