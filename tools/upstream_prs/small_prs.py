"""The edits of the small PRs: the class head, the cache option, the bottleneck copy, the meta-device build.

Each function takes the text of one upstream file and returns it edited; every place is found by class and
function name (``edits.py``), so a moved upstream function is reported, never patched in the wrong spot.
"""

from __future__ import annotations

import ast

from tools.upstream_prs.edits import (
    EditError,
    add_docstring_arg,
    add_parameter,
    append_to_body,
    edit_calls,
    find_def,
    guard_statements,
    insert_after,
    insert_before,
    node_span,
    one_statement,
    replace_statement,
    segment,
)

# --- the class head keeps its [K, C] matrix whatever K and C are ------------------------------------------------


def class_head_reshape(source: str) -> str:
    """``ClassMappingClassify.forward``: ``emb.squeeze()`` -> ``emb.reshape(-1, c)``, ``c`` the channel count."""
    func = find_def(source, "ClassMappingClassify.forward")
    unpack = next(
        (
            n
            for n in ast.walk(func)
            if isinstance(n, ast.Assign)
            and isinstance(n.targets[0], ast.Tuple)
            and isinstance(n.value, ast.Attribute)
            and n.value.attr == "shape"
        ),
        None,
    )
    if unpack is None or len(unpack.targets[0].elts) != 5:  # type: ignore[attr-defined]
        raise EditError("ClassMappingClassify.forward no longer unpacks the 5-d feature shape")
    channels = unpack.targets[0].elts[1].id  # type: ignore[attr-defined]

    def rewrite(text: str, call: ast.Call) -> str:
        receiver = text[slice(*node_span(text, call.func.value))]  # type: ignore[attr-defined]
        return f"{receiver}.reshape(-1, {channels})"

    source = edit_calls(source, "ClassMappingClassify.forward", "squeeze", rewrite, nargs=0)
    func = find_def(source, "ClassMappingClassify.forward")
    product = next(s for s in func.body if "reshape(-1" in (ast.get_source_segment(source, s) or ""))
    return insert_before(
        source, product, "# reshape, not squeeze(): [K, 1, C] -> [K, C] also when K or C is 1, one matmul for all"
    )


# --- VISTA3D(release_cached_memory=True): 1.6.1's empty_cache() calls by default, skipped when asked -----------

_RELEASE_PROPERTY = '''
@property
def release_cached_memory(self) -> bool:
    """Whether forward calls ``torch.cuda.empty_cache()`` between its stages (see the class arguments)."""
    return self._release_cached_memory

@release_cached_memory.setter
def release_cached_memory(self, value: bool) -> None:
    self._release_cached_memory = bool(value)
    if hasattr(self.point_head, "release_cached_memory"):  # the point head empties the cache too
        self.point_head.release_cached_memory = bool(value)
'''


def vista3d_release_option(source: str) -> str:
    source = guard_statements(source, "VISTA3D.forward", "empty_cache", "self.release_cached_memory")
    source = guard_statements(source, "PointMappingSAM.forward", "empty_cache", "self.release_cached_memory")
    source = append_to_body(source, "PointMappingSAM.__init__", "self.release_cached_memory = True")
    source = add_parameter(source, "VISTA3D.__init__", "release_cached_memory: bool = True")
    source = append_to_body(source, "VISTA3D.__init__", "self.release_cached_memory = release_cached_memory")
    source = add_docstring_arg(
        source,
        "VISTA3D",
        "release_cached_memory: whether each forward calls ``torch.cuda.empty_cache()`` after the image encoder "
        "and between the point head's prompt chunks, which keeps the memory reserved by the CUDA caching "
        "allocator low. Set it to False for repeated calls (e.g. sliding-window inference) where the cached "
        "blocks are reused by the next call. Defaults to True.",
    )
    return insert_after(source, "VISTA3D.__init__", _RELEASE_PROPERTY)


# --- SegResNetDS2: both decoders read the bottleneck, neither writes it: no copy --------------------------------


def _is_bottleneck_copy(stmt: ast.stmt) -> bool:
    """``if with_label: <name> = <tensor>.clone()``."""
    return (
        isinstance(stmt, ast.If)
        and isinstance(stmt.test, ast.Name)
        and stmt.test.id == "with_label"
        and not stmt.orelse
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], ast.Assign)
        and isinstance(stmt.body[0].value, ast.Call)
        and isinstance(stmt.body[0].value.func, ast.Attribute)
        and stmt.body[0].value.func.attr == "clone"
    )


def segresnet_shared_bottleneck(source: str) -> str:
    """``SegResNetDS2.forward``: drop the conditional copy of the bottleneck; the plain assignment before it stays."""
    stmt = one_statement(source, "SegResNetDS2.forward", _is_bottleneck_copy, "the bottleneck's conditional clone()")
    return replace_statement(
        source,
        stmt,
        "# no copy for the class decoder: the decoder layers return new tensors and never write into their input",
    )


# --- VISTA3D built on the meta device draws no random values -----------------------------------------------------

_EMBEDDING = '''
def _normal_embedding(num_embeddings: int, embedding_dim: int) -> nn.Embedding:
    """
    ``nn.Embedding(num_embeddings, embedding_dim)``, its weight drawn from N(0, 1) only off the meta device.

    On the meta device (a network built only for its shapes, or to take a checkpoint's tensors with
    ``load_state_dict(..., assign=True)``) there is nothing to draw, and torch's meta-device random number
    functions import sympy and ``torch._dynamo`` on first use, about a second. Elsewhere the weight is drawn as
    ``nn.Embedding`` draws it, so a seeded build gives the same values.
    """
    weight = torch.empty((num_embeddings, embedding_dim))
    if not weight.is_meta:
        nn.init.normal_(weight)
    return nn.Embedding(num_embeddings, embedding_dim, _weight=weight)
'''


def vista3d_meta_build(source: str) -> str:
    def rewrite(text: str, call: ast.Call) -> str:
        args = [text[slice(*node_span(text, a))] for a in call.args]
        if len(args) != 2 or call.keywords:
            raise EditError(f"an nn.Embedding call with other arguments than (num, dim): {args}")
        return f"_normal_embedding({', '.join(args)})"

    for owner in ("PointMappingSAM.__init__", "ClassMappingClassify.__init__"):
        source = edit_calls(source, owner, "Embedding", rewrite, nargs=2)
    source = _positional_frequencies_off_meta(source)
    return insert_after(source, "vista3d132", _EMBEDDING)


def _positional_frequencies_off_meta(source: str) -> str:
    """``PositionEmbeddingRandom.__init__``: the buffer's ``randn`` frequencies drawn only off the meta device."""

    def is_buffer(stmt: ast.stmt) -> bool:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        return isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "register_buffer"

    stmt = one_statement(source, "PositionEmbeddingRandom.__init__", is_buffer, "register_buffer(...)")
    name, value = stmt.value.args  # type: ignore[attr-defined]
    randn = [n for n in ast.walk(value) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "randn"]
    if len(randn) != 1 or len(randn[0].args) != 1:
        raise EditError("PositionEmbeddingRandom.__init__: the buffer is no longer drawn by one randn(shape)")
    shape = segment(source, randn[0].args[0])
    return replace_statement(
        source,
        stmt,
        f"""
        gaussian = torch.empty({shape})
        if not gaussian.is_meta:  # see _normal_embedding: nothing to draw on the meta device
            gaussian = {segment(source, value)}
        self.register_buffer({segment(source, name)}, gaussian)
        """,
    )
