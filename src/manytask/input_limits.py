"""Bounds on what a config may hold, checked while its YAML is read, before anything is built or written.

A config is a few kilobytes of text; these limits are far above any real one but stop inputs that would make
reading them take minutes or gigabytes:
- a config file is at most `MAX_CONFIG_BYTES` (1 MiB) of UTF-8 text;
- YAML aliases (`&a [x, x]`, `b: [*a, *a]`) may not expand a document past `MAX_NODES` values (a 400-byte
  "billion laughs" document expands to 10^9), nor refer to themselves;
- collections nest at most `MAX_DEPTH` levels;
- a key appears at most once in a mapping (YAML would silently keep the last one).
Errors name where the problem is and never echo the (possibly huge) input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from manytask.errors import ManytaskError, clipped

MAX_CONFIG_BYTES = 1 << 20
MAX_NODES = 100_000
MAX_DEPTH = 64
MAX_PATH_CHARS = 120


def shown_path(path: str | Path) -> str:
    """A user's path for an error message: whole when short, else its last `MAX_PATH_CHARS` characters (the file
    name is the telling part); characters that would break the one line show as '?'."""
    text = "".join(c if c.isprintable() else "?" for c in str(path))
    return text if len(text) <= MAX_PATH_CHARS else "..." + text[-(MAX_PATH_CHARS - 3):]


class LimitedLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses nesting deeper than `MAX_DEPTH` while composing and duplicate keys while
    constructing. `load_limited` adds the expansion check between the two."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _Refused(f"nests collections more than {MAX_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the constructor below says so
                continue
            if duplicate:
                line = key_node.start_mark.line + 1
                raise _Refused(f"gives the key '{clipped(key)}' twice (again on line {line}); keep one of them")
        return super().construct_mapping(node, deep=deep)


class _Refused(Exception):
    """A limit was hit; the message is the predicate of a sentence about the document."""


def load_limited(text: str, where: str) -> Any:
    """The YAML document in `text` as Python values, refusing documents over the limits above.

    `where` names the document as a sentence subject ("config file 'x.yaml'"); every problem, a YAML syntax error
    included, becomes one `ManytaskError` sentence starting with it."""
    loader = None
    try:
        loader = LimitedLoader(text)  # its reader checks the characters here
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    except _Refused as err:
        raise ManytaskError(f"{where} {err}.") from None
    except yaml.reader.ReaderError as err:
        raise ManytaskError(f"{where} is not YAML text (it holds the control character #x{err.character:02x})."
                            ) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        at = "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = clipped(" ".join((err.problem or err.context or "a syntax error").split()), 100)
        raise ManytaskError(f"{where} is not valid YAML{at} ({problem}).") from None
    except yaml.YAMLError as err:
        raise ManytaskError(f"{where} is not valid YAML ({clipped(str(err).splitlines()[0], 100)}).") from None
    except (ValueError, OverflowError) as err:  # e.g. an integer of more than 4300 digits
        raise ManytaskError(f"{where} holds a value YAML cannot convert ({clipped(err, 100)}).") from None
    finally:
        if loader is not None:
            loader.dispose()


def _check_expansion(root: Node) -> None:
    """Refuse a node graph whose tree (aliases expanded) has more than `MAX_NODES` nodes, is deeper than
    `MAX_DEPTH`, or has a cycle. Iterative and memoized per node, so checking costs O(distinct nodes)."""
    size: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded node count, depth)
    active: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            children = _children(node)
            count = 1 + sum(size[id(c)][0] for c in children)
            depth = 1 + max((size[id(c)][1] for c in children), default=0)
            active.discard(key)
            if count > MAX_NODES:
                raise _Refused(f"expands to more than {MAX_NODES:,} values through its aliases (&name ... *name); "
                               "write the values out instead")
            if depth > MAX_DEPTH:
                raise _Refused(f"nests collections more than {MAX_DEPTH} levels deep through its aliases")
            size[key] = (count, depth)
            continue
        if key in size:
            continue
        if key in active:
            raise _Refused("has an alias inside the collection it names (a recursive structure)")
        active.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in size)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def read_config_text(path: Path) -> str:
    """The text of a config file: at most `MAX_CONFIG_BYTES`, UTF-8; one sentence when it is not."""
    shown = shown_path(path)
    if path.is_dir():
        raise ManytaskError(f"config file '{shown}' is a directory; give a YAML file.")
    if not path.exists():
        raise ManytaskError(f"config file '{shown}' does not exist.")
    if not path.is_file():
        raise ManytaskError(f"config file '{shown}' is not a regular file; give a YAML file.")
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ManytaskError(f"config file '{shown}' cannot be read ({err.strerror or type(err).__name__}).") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ManytaskError(f"config file '{shown}' is larger than {MAX_CONFIG_BYTES >> 20} MiB, the limit for a "
                            "config file.")
    if b"\x00" in raw:
        raise ManytaskError(f"config file '{shown}' is not a YAML text file (it holds NUL bytes).")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ManytaskError(f"config file '{shown}' is not a YAML text file (byte {err.start} is not UTF-8 text)."
                            ) from None
