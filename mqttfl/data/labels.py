"""Label resolution for ``mqttfl data prepare``: one label per recording.

Accepted ``--label`` forms (``spec``):

* a plain value (``walk``, ``3``): every input gets it;
* ``filename``: the activity word in the file name (tokens split on ``_-.``), from
  :data:`ACTIVITIES` (the intel5300-activity recordings) or ``--classes``;
* ``regex:PATTERN``: searched in the input path; the named group ``label``, else
  group 1, else the whole match;
* ``map:FILE`` (or any existing ``.json``/``.csv`` file): a JSON object or CSV rows
  ``file,label``; keys are paths relative to the mapping file, or bare file names.

Label names become integers in a way that is the same for every client: integers
stay as they are; names are indexed in ``--classes`` when given, else in
:data:`ACTIVITIES` when they all belong to it, else in their sorted order (recorded
in the shard meta; pass ``--classes`` when clients are prepared separately).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from mqttfl.errors import DataError

# The activity vocabulary of the intel5300-activity recordings; the index is the label.
ACTIVITIES: tuple[str, ...] = (
    "brushteeth",
    "cook",
    "getintobed",
    "sleeping",
    "walk",
    "washingdishes",
)

LabelSpec = str | int | Mapping[str, str | int]


def _load_mapping(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise DataError(path, f"unreadable label mapping: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise DataError(path, "label mapping is not a text file") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(
                path, f"label mapping is not valid JSON: {exc.msg} (line {exc.lineno})"
            ) from None
        if not isinstance(data, dict) or not all(isinstance(v, (str, int)) for v in data.values()):
            raise DataError(path, 'label mapping must be a JSON object {"file": "label", ...}')
        return {str(k): str(v) for k, v in data.items()}
    mapping: dict[str, str] = {}
    for lineno, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        row = [c.strip() for c in row]
        if not any(row):
            continue
        if len(row) != 2:
            raise DataError(path, f"line {lineno}: expected 'file,label', got {len(row)} columns")
        if lineno == 1 and row[1].lower() == "label":
            continue  # header
        mapping[row[0]] = row[1]
    if not mapping:
        raise DataError(path, "label mapping is empty")
    return mapping


class _MappingLookup:
    def __init__(self, mapping: Mapping[str, str | int], base: Path | None, source: str) -> None:
        self.source = source
        self.by_path: dict[Path, str] = {}
        self.by_name: dict[str, str] = {}
        for key, value in mapping.items():
            key_path = Path(key)
            full = key_path if key_path.is_absolute() or base is None else base / key_path
            self.by_path[full.resolve()] = str(value)
            if len(key_path.parts) == 1:
                self.by_name[key] = str(value)

    def __call__(self, path: Path) -> str:
        for candidate in (
            self.by_path.get(path.resolve()),
            self.by_name.get(path.name),
            self.by_name.get(path.stem),
        ):
            if candidate is not None:
                return candidate
        raise DataError(path, f"has no label in {self.source}")


def _filename_label(vocabulary: Sequence[str]) -> Callable[[Path], str]:
    words = {w.lower(): w for w in vocabulary}

    def infer(path: Path) -> str:
        tokens = [t for t in re.split(r"[^A-Za-z0-9]+", path.stem.lower()) if t]
        found = sorted({words[t] for t in tokens if t in words})
        if len(found) != 1:
            what = "no known activity" if not found else f"several activities ({', '.join(found)})"
            raise DataError(
                path,
                f"file name names {what}; known: {', '.join(vocabulary)} "
                "(use --classes, a mapping file or regex:PATTERN)",
            )
        return found[0]

    return infer


def _regex_label(pattern: str) -> Callable[[Path], str]:
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"bad label pattern {pattern!r}: {exc}") from None

    def infer(path: Path) -> str:
        match = regex.search(path.as_posix())
        if match is None:
            raise DataError(path, f"label pattern {pattern!r} does not match the file name")
        if "label" in regex.groupindex:
            value = match.group("label")
        elif regex.groups:
            value = match.group(1)
        else:
            value = match.group(0)
        if not value:
            raise DataError(path, f"label pattern {pattern!r} matched an empty label")
        return value

    return infer


def _label_function(spec: LabelSpec, classes: Sequence[str] | None) -> Callable[[Path], str]:
    if isinstance(spec, Mapping):
        return _MappingLookup(spec, None, "the label mapping")
    if isinstance(spec, bool):
        raise ValueError("label must be a value, 'filename', 'regex:...' or 'map:FILE'")
    if isinstance(spec, int):
        return lambda _path: str(spec)
    spec = str(spec)
    if spec in ("filename", "name"):
        return _filename_label(tuple(classes) if classes else ACTIVITIES)
    if spec.startswith("regex:"):
        return _regex_label(spec[len("regex:") :])
    mapping_path: Path | None = None
    if spec.startswith("map:"):
        mapping_path = Path(spec[len("map:") :])
        if not mapping_path.is_file():
            raise DataError(mapping_path, "label mapping file not found")
    elif Path(spec).suffix.lower() in (".json", ".csv") and Path(spec).is_file():
        mapping_path = Path(spec)
    if mapping_path is not None:
        mapping = _load_mapping(mapping_path)
        return _MappingLookup(mapping, mapping_path.parent, str(mapping_path))
    if not spec.strip():
        raise ValueError("empty label")
    return lambda _path: spec


def parse_classes(text: str) -> list[str]:
    """``--classes``: comma-separated names or integer ranges, ``0..10`` and ``0-10``
    inclusive (``0..3,7`` is 0, 1, 2, 3, 7). Raises ValueError on an empty range, an
    empty list or a repeated class."""
    items: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        match = re.fullmatch(r"(\d+)\s*(?:\.\.|-)\s*(\d+)", part)
        if match:
            lo, hi = int(match.group(1)), int(match.group(2))
            if hi < lo:
                raise ValueError(f"empty class range {part!r}")
            items.extend(str(i) for i in range(lo, hi + 1))
        else:
            items.append(part)
    if not items:
        raise ValueError("expected class names or a range like 0..10")
    repeated = sorted({c for c in items if items.count(c) > 1})
    if repeated:
        raise ValueError(f"classes repeat: {', '.join(repeated)}")
    return items


def describe_classes(classes: Sequence[str]) -> str:
    """``0..10 (11 classes)`` for a run of integers, else the names."""
    if len(classes) > 2 and labels_ordinal(classes):
        return f"{classes[0]}..{classes[-1]} ({len(classes)} classes)"
    return ", ".join(classes)


def labels_ordinal(classes: Sequence[str] | None) -> bool:
    """Whether labels are counts, so that an MAE means something: integer labels without
    class names, or class names that are consecutive integers (``--classes 0..10``)."""
    if classes is None:
        return True
    if not all(re.fullmatch(r"\d+", c) for c in classes):
        return False
    values = [int(c) for c in classes]
    return values == list(range(values[0], values[0] + len(values)))


def resolve_labels(
    spec: LabelSpec, paths: Sequence[Path], *, classes: Sequence[str] | None = None
) -> tuple[list[str], list[int], list[str] | None]:
    """Label name and integer label for each path, plus the class names (or None).

    See the module docstring for the accepted ``spec`` forms and the name -> integer rule.
    """
    func = _label_function(spec, classes)
    names = [func(p) for p in paths]
    if classes:
        class_list = [str(c) for c in classes]
        if len(set(class_list)) != len(class_list):
            raise ValueError("classes repeat")
        index = {c: i for i, c in enumerate(class_list)}
        ys = []
        for path, name in zip(paths, names, strict=True):
            if name not in index:
                raise DataError(
                    path,
                    f"label {name!r} is not one of the classes, which --classes gave as "
                    f"{describe_classes(class_list)}",
                )
            ys.append(index[name])
        return names, ys, class_list
    if all(re.fullmatch(r"\d+", n) for n in names):
        return names, [int(n) for n in names], None
    if all(n in ACTIVITIES for n in names):
        return names, [ACTIVITIES.index(n) for n in names], list(ACTIVITIES)
    class_list = sorted(set(names))
    return names, [class_list.index(n) for n in names], class_list
