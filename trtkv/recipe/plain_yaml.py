"""Recipe YAML as plain data: `yaml.safe_load` semantics, bounded in bytes, nesting and aliases,
duplicate keys refused; pure data loading, no recipe semantics (the loader turns these errors into
RecipeErrors)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode
from yaml.resolver import Resolver

from trtkv.core.files import NotReadable, read_capped

# libyaml's parser (events with the same marks), ~4x faster than PyYAML's; composing stays in
# Python, bounded
try:
    from yaml._yaml import CParser as _CParser

    HAVE_LIBYAML = True
except ImportError:  # PyYAML built without libyaml
    HAVE_LIBYAML = False

MAX_FILE_BYTES = 1 << 20  # 1 MiB: the shipped recipes are ~1 KiB each
MAX_DEPTH = 32  # nested mappings/sequences; a recipe needs 3
MAX_ALIASES = 32  # `*name` references per document
# values the aliases add once expanded (an alias bomb expands exponentially)
MAX_ALIAS_NODES = 10_000


class YAMLLimitError(yaml.MarkedYAMLError):
    """YAML that parses but is not plain recipe data: a duplicate key, too deep, too many or
    recursive aliases."""


# a recipe file that cannot be read as text: missing, not a regular file, too large, a symlink
# loop, not UTF-8 (`problem` and `next_step` said to the user)
FileNotReadable = NotReadable


class _PlainData(Composer, SafeConstructor, Resolver):
    """SafeLoader's composer, constructor and resolver (same tags and resolution), counting depth
    and aliases while composing and refusing duplicate keys; mixed with a parser below."""

    if TYPE_CHECKING:  # from the parser mixed in below

        def peek_event(self) -> Any: ...
        def dispose(self) -> None: ...

    def _start(self) -> None:
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        Composer.__init__(self)
        self._depth = 0
        self._aliases = 0
        self._nodes = 0  # nodes composed, alias expansions included
        self._alias_nodes = 0  # of which added by aliases
        self._anchor_sizes: dict[str, int] = {}
        self._open_anchors: set[str] = set()

    def compose_node(self, parent: Node | None, index: Any) -> Node:  # type: ignore[override]
        event = self.peek_event()
        anchor = getattr(event, "anchor", None)
        mark: Any = event.start_mark
        if isinstance(event, yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise YAMLLimitError(
                    None,
                    None,
                    f"more than {MAX_ALIASES} aliases (*name); a recipe needs none",
                    mark,
                )
            if anchor in self._open_anchors:
                raise YAMLLimitError(
                    None,
                    None,
                    f"alias *{anchor} refers to a value that contains it (a recursive "
                    f"structure is not plain data)",
                    mark,
                )
            node = cast(Node, super().compose_node(parent, index))  # raises on an undefined alias
            size = self._anchor_sizes.get(str(anchor), 1)
            self._nodes += size
            self._alias_nodes += size
            if self._alias_nodes > MAX_ALIAS_NODES:
                raise YAMLLimitError(
                    None,
                    None,
                    f"the aliases expand to more than {MAX_ALIAS_NODES} values (an alias bomb?)",
                    mark,
                )
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise YAMLLimitError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
        start = self._nodes
        self._nodes += 1
        if anchor is not None:
            self._open_anchors.add(anchor)
        try:
            node = cast(Node, super().compose_node(parent, index))
        finally:
            self._depth -= 1
            if anchor is not None:
                self._open_anchors.discard(anchor)
        if anchor is not None:
            self._anchor_sizes[anchor] = self._nodes - start
        return node

    def compose_mapping_node(self, anchor: Any) -> MappingNode:
        node = super().compose_mapping_node(anchor)
        seen: dict[tuple[str, str], ScalarNode] = {}
        for key, _ in node.value:
            if not isinstance(key, ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            first = seen.setdefault((key.tag, key.value), key)
            if first is not key:
                raise YAMLLimitError(
                    f"key {key.value!r} first at line {first.start_mark.line + 1}",
                    first.start_mark,
                    f"duplicate key {key.value!r} at line {key.start_mark.line + 1} "
                    f"(first at line {first.start_mark.line + 1}; YAML would keep only the last)",
                    key.start_mark,
                )
        return node

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        # e.g. 2024-13-45 as a date, an int past Python's digit limit
        except (ValueError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"cannot read {node.value!r:.60} as {node.tag.rsplit(':', 1)[-1]}: {exc}",
                node.start_mark,
            ) from None


class _PyPlainDataLoader(_PlainData, yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser):
    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        self._start()


PlainDataLoader: type[_PlainData] = _PyPlainDataLoader
if HAVE_LIBYAML:
    # _PlainData first: its Python composer, not libyaml's
    class _CPlainDataLoader(_PlainData, _CParser):
        def __init__(self, stream: str) -> None:
            _CParser.__init__(self, stream)
            self._start()

    PlainDataLoader = _CPlainDataLoader


def load_yaml(text: str) -> Any:
    """One YAML document as plain data (yaml.safe_load semantics); yaml.YAMLError (YAMLLimitError
    for the limits)."""
    try:
        text.encode("utf-8")
    # a command-line argument that was not UTF-8 (surrogate escapes)
    except UnicodeEncodeError as exc:
        raise YAMLLimitError(None, None, f"character {exc.start} is not UTF-8 text", None) from None
    loader = PlainDataLoader(text)  # type: ignore[call-arg]
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_text(path: Path, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The file as UTF-8 text, reading at most max_bytes + 1 bytes of a regular file
    (trtkv.core.files.read_capped); FileNotReadable otherwise."""
    data = read_capped(path, max_bytes, "recipe file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise FileNotReadable(
            f"line {line} (byte {exc.start}) is not UTF-8 ({exc.reason})", "save the file as UTF-8"
        ) from None
