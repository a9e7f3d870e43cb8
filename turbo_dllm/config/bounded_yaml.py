"""The one YAML parser of turbo-dllm: PyYAML's safe loader with bounds on what a document may cost.

The safe loader runs no code, but it does not bound size. An alias shares its anchor's node, so a
few hundred bytes of nested anchors stand for billions of nodes as soon as anything walks the
result (the `--set` merge copies it, pydantic validates it); an alias may sit inside its own
anchor (a cycle that nothing can walk); nesting is composed recursively (`[[[...` a thousand deep
exhausts the stack); and Python refuses to convert an integer of 4300+ digits. This loader
measures every node while composing, before anything is built, and refuses documents past the
bounds below with a `DllmError` naming the line, column and key path. It also refuses NUL
characters (no path, name or value of a config may hold one, and the OS rejects them in paths)
and a key written twice in one mapping (the safe loader keeps the last without a word).

Numbers are read as YAML 1.2 reads them in one respect: a plain `12:30` (or `1:30.5`) is text,
not the base-60 number YAML 1.1 makes of it (750, 90.5), so a name or a time of day stays what
was written and an integer field given `1:00` says it got text instead of taking 60.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from turbo_dllm.errors import DllmError

__all__ = ["MAX_ALIAS_NODES", "MAX_DEPTH", "MAX_YAML_BYTES", "parse_yaml", "trailing_comment"]

MAX_YAML_BYTES = 4 << 20  # configs are kilobytes; this only stops a runaway file (/dev/zero)
MAX_DEPTH = 64  # config sections nest a handful of levels
MAX_ALIAS_NODES = 10_000  # how many nodes aliases may add to a document beyond its own
_MAX_INT_CHARS = 80  # a 64-bit integer in any YAML notation (even 0b...) is shorter
_INT_RANGE = (-(1 << 63), (1 << 64) - 1)  # int64 and uint64 values
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_STR_TAG = "tag:yaml.org,2002:str"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_MERGE_TAG = "tag:yaml.org,2002:merge"


# Hints shared by several refusals.
_TOO_DEEP = "a config nests a few sections deep: check the indentation of that line"
_BIG_INT = "write a number that fits in 64 bits, or quote it to keep it as text"


class _Refused(yaml.YAMLError):
    def __init__(
        self, mark, path: list[str], problem: str, in_file: str | None = None, *, hint: str
    ) -> None:
        """`in_file`: the problem as a file's error says it, where it may name other lines
        (a `--set` value has none); `hint`: what to do about it."""
        super().__init__(problem)
        self.hint = hint
        self.mark = mark
        parts = [part for part in path if part]
        if len(parts) > 8:  # a path 64 levels deep says no more than its ends
            parts = [*parts[:3], f"...({len(parts) - 5} more)...", *parts[-2:]]
        self.path = ".".join(parts) or "(top level)"
        self.problem = problem
        self.file_problem = in_file or problem


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._path: list[str] = []  # key path of the node being composed ("" for a key)
        self._open_anchors: set[str] = set()  # anchors whose node is still being composed
        self._measured: dict[int, tuple[int, int]] = {}  # id(node) -> (nodes, depth) expanded
        self._distinct = 0  # nodes composed, each counted once

    def resolve(self, kind, value, implicit):
        """A plain scalar's tag, without YAML 1.1's base-60 numbers: `12:30` was the integer
        750 (a name of `12:30` failed with "got 750") and `1:30.5` the float 90.5. Only those
        forms of int and float hold a colon; `!!int 1:00` still asks for one explicitly."""
        tag = super().resolve(kind, value, implicit)
        if tag in (_INT_TAG, _FLOAT_TAG) and implicit[0] and ":" in value:
            return _STR_TAG
        return tag

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(index, ScalarNode):  # a mapping value: its key names it
            part = str(index.value)
        else:  # a sequence item (its position), a key or the root
            part = "" if index is None else str(index)
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open_anchors:
                raise _Refused(
                    event.start_mark,
                    [*self._path, part],
                    f"alias *{event.anchor} lies inside its own anchor &{event.anchor} "
                    "(a recursive document)",
                    hint=f"an alias (*{event.anchor}) repeats a value written before it: write "
                    "that value out here instead",
                )
            return super().compose_node(parent, index)  # already measured
        if len(self._path) >= MAX_DEPTH:
            raise _Refused(
                event.start_mark,
                self._path,
                f"nested deeper than {MAX_DEPTH} levels",
                hint=_TOO_DEEP,
            )
        self._path.append(part)
        if event.anchor is not None:
            self._open_anchors.add(event.anchor)
        try:
            node = super().compose_node(parent, index)
            self._measure(node)
        finally:
            self._path.pop()
            self._open_anchors.discard(event.anchor)
        return node

    def _measure(self, node) -> None:
        if isinstance(node, ScalarNode):
            self._check_scalar(node)
            nodes, depth = 1, 1
        else:
            if isinstance(node, SequenceNode):
                children = node.value
            else:
                assert isinstance(node, MappingNode)
                self._check_keys(node)
                children = [child for pair in node.value for child in pair]
            sizes = [self._measured[id(child)] for child in children]
            nodes = 1 + sum(n for n, _ in sizes)
            depth = 1 + max((d for _, d in sizes), default=0)
        self._distinct += 1
        self._measured[id(node)] = (nodes, depth)
        if depth > MAX_DEPTH:
            raise _Refused(
                node.start_mark,
                self._path,
                f"nested deeper than {MAX_DEPTH} levels (via aliases)",
                hint=_TOO_DEEP,
            )
        if nodes - self._distinct > MAX_ALIAS_NODES:
            raise _Refused(
                node.start_mark,
                self._path,
                f"aliases expand this value to more than {MAX_ALIAS_NODES:,} extra nodes "
                "(an alias bomb?)",
                hint="write the value out without aliases that repeat aliases (a config needs "
                "no more than a few)",
            )

    def _check_keys(self, node: MappingNode) -> None:
        """Refuse a key written twice in one mapping: YAML loaders keep the last silently, so a
        second `training:` section dropped the whole first one. Keys a merge (`<<`) brings in
        may still be overridden, as YAML intends."""
        seen: dict[Any, Any] = {}
        for key, _ in node.value:
            if not isinstance(key, ScalarNode) or key.tag == _MERGE_TAG:
                continue
            try:
                identity = (key.tag, self.construct_object(key))  # `1` and `0x1` are one key
                hash(identity)
            except (yaml.YAMLError, TypeError, ValueError):
                identity = (key.tag, key.value)
            if identity in seen:
                first = seen[identity]
                raise _Refused(
                    key.start_mark,
                    [*self._path, str(key.value)],
                    f"duplicate key {key.value!r}: YAML keeps only the last one; write it once",
                    in_file=f"duplicate key {key.value!r} (first at line {first.line + 1}, "
                    f"column {first.column + 1}): YAML keeps only the last one; write it once",
                    hint=f"write {key.value}: once (a section: one block holding all its fields)",
                )
            seen[identity] = key.start_mark

    def _check_scalar(self, node: ScalarNode) -> None:
        if "\x00" in node.value:
            raise _Refused(
                node.start_mark,
                self._path,
                "a NUL character is not allowed",
                hint="remove it (a NUL byte in a config is a copy or an editor gone wrong)",
            )
        if node.tag == _INT_TAG:
            if len(node.value) > _MAX_INT_CHARS:
                raise _Refused(
                    node.start_mark,
                    self._path,
                    f"integer of {len(node.value)} characters is out of range "
                    "(config integers fit in 64 bits)",
                    hint=_BIG_INT,
                )
            value = self.construct_yaml_int(node)
            if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
                raise _Refused(
                    node.start_mark,
                    self._path,
                    f"integer {value} is out of range (config integers fit in 64 bits)",
                    hint=_BIG_INT,
                )
        elif node.tag == _TIMESTAMP_TAG:
            try:
                self.construct_yaml_timestamp(node)
            except ValueError as error:  # 2026-13-45 looks like a date but is none
                raise _Refused(
                    node.start_mark,
                    self._path,
                    f"invalid date {node.value!r}: {error}",
                    hint=f"quote it to keep it as text ('{node.value}'), or write a real date "
                    "(YYYY-MM-DD)",
                ) from None


def parse_yaml(text: str, source: str, *, key: str | None = None) -> Any:
    """The document in `text`, or a `DllmError` naming `source` and where in it.

    `key` marks a `--set KEY=VALUE` value (`source` then names the key): problems name no line,
    and a syntax error is left to the caller (an unparsable value is taken as a plain string).
    """
    if len(text) > MAX_YAML_BYTES:
        raise DllmError(
            f"{source}: larger than {MAX_YAML_BYTES >> 20} MiB; not a config file",
            hint="pass the YAML config itself (a RunSpec or prepare.yaml is a few KiB)",
        )
    loader = None
    try:
        loader = _BoundedLoader(text)  # its reader already refuses control characters
        return loader.get_single_data()
    except _Refused as refused:
        if key is not None:
            inner = "" if refused.path == "(top level)" else f".{refused.path}"
            raise DllmError(f"{source}{inner}: {refused.problem}", hint=refused.hint) from None
        mark = refused.mark
        raise DllmError(
            f"{source}:{mark.line + 1}:{mark.column + 1}: {refused.path}: {refused.file_problem}",
            hint=refused.hint,
        ) from None
    except yaml.reader.ReaderError as error:
        if key is not None:
            raise
        # A control character: PyYAML names its offset in the text, not its line.
        before = text[: error.position]
        line = before.count("\n") + 1
        column = len(before) - before.rfind("\n")
        character = error.character
        code = character if isinstance(character, int) else ord(character)
        raise DllmError(
            f"{source}:{line}:{column}: control character #x{code:04x} is not allowed in YAML",
            hint="remove it (in a double-quoted string, write it as an escape such as \\t)",
        ) from None
    except yaml.YAMLError as error:
        if key is not None:
            raise
        mark = getattr(error, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(error, "problem", None) or str(error)
        tab = _a_tab(text, mark, problem)
        if tab is not None:
            raise DllmError(f"YAML syntax error at {where}: {tab[0]}", hint=tab[1]) from None
        # Where the construct the problem is in began (an unclosed `[` or quote): the problem's
        # own mark is often past it, at the end of the file ("got '<stream end>'" on a line the
        # file does not have), so "check that line" sent the user to nothing.
        context, opened = getattr(error, "context", None), getattr(error, "context_mark", None)
        hint = "check indentation and quoting on that line"
        if context and opened is not None and mark is not None and opened.line != mark.line:
            began = f"line {opened.line + 1}, column {opened.column + 1}"
            problem = f"{problem} ({context} at {began})"
            hint = f"check indentation, brackets and quoting from {began} to that line"
        raise DllmError(f"YAML syntax error at {where}: {problem}", hint=hint) from None
    finally:
        if loader is not None:
            loader.dispose()


def _a_tab(text: str, mark, problem: str) -> tuple[str, str] | None:
    """(problem, hint) for a syntax error a tab causes, or None: PyYAML says only "found
    character '\\t' that cannot start any token", of a character most editors do not show."""
    if mark is None:
        return None
    lines = text.splitlines()
    line = lines[mark.line] if mark.line < len(lines) else ""
    indent = line[: len(line) - len(line.lstrip(" \t"))]
    if "\t" in indent and mark.column <= len(indent):
        return (
            f"a tab indents line {mark.line + 1}: YAML forbids tabs for indentation",
            "indent with spaces (an editor's 'convert tabs to spaces' does it)",
        )
    if "'\\t'" in problem:
        return (
            f"a tab at line {mark.line + 1}, column {mark.column + 1}, where YAML takes no tab",
            "use spaces between a key and its value, and to indent",
        )
    return None


def trailing_comment(text: str) -> str | None:
    """The comment after the last token of `text` (`'# x'` in `3  # x`), or None: what YAML
    drops without a word from a one-line value such as a `--set` one. Tokens only (the scanner;
    nothing is composed or built); text that does not scan has none."""
    if "#" not in text:
        return None
    scanner = yaml.SafeLoader(text)
    try:
        end = 0
        while not scanner.check_token(yaml.StreamEndToken):
            end = max(end, scanner.get_token().end_mark.index)
    except yaml.YAMLError:
        return None
    finally:
        scanner.dispose()
    rest = text[end:].strip()
    return rest if rest.startswith("#") else None
