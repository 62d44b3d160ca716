"""What the labels of a user's file mean: the task, decided once, never changed silently.

``decide_task`` turns the raw label column of a file into the labels a method
trains on and says, in words, what it decided and why (the console prints
it). The rules, in order:

* ``--positive-label V`` makes a binary task: V is +1, every other value -1
  (one-vs-rest). V must be one of the values; a file whose labels are all V,
  or none V, is refused.
* An explicit ``--task`` is obeyed: ``binary`` needs exactly two values (or
  ``--positive-label``), ``regression`` numeric labels, ``multiclass`` at
  least two classes.
* Otherwise the task is inferred: two values make a binary task (the larger
  value positive), a few integer values (at most ``MAX_INFERRED_CLASSES``) or
  text make a multi-class task, other numbers a regression target.
* A label column with a single value is refused whatever the task: there is
  nothing to learn from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .validation import VFLInputError

MAX_INFERRED_CLASSES = 10


@dataclass
class Labels:
    task: str
    y: np.ndarray | None
    y_test: np.ndarray | None
    classes: list | None
    note: str                 # what was decided and why, for the console and the JSON record


def _is_number(v) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


def _shown(values, k=8) -> str:
    return ", ".join(repr(v) if isinstance(v, str) else f"{v:g}" if isinstance(v, float) else str(v)
                     for v in values[:k]) + (", ..." if len(values) > k else "")


def _values(y) -> list:
    vals = [v.item() if hasattr(v, "item") else v for v in np.unique(np.asarray(y, dtype=object).astype(str)
                                                                      if _mixed(y) else np.asarray(y))]
    return sorted(vals, key=lambda v: (not _is_number(v), float(v) if _is_number(v) else 0.0, str(v)))


def _mixed(y) -> bool:
    y = np.asarray(y)
    return y.dtype == object and len({type(v) for v in y.tolist()}) > 1


def _missing(y, where, first_line):
    y = np.asarray(y)
    if y.dtype.kind in "fc":
        bad = np.flatnonzero(~np.isfinite(y))
    elif y.dtype == object:
        bad = np.flatnonzero([v is None or (isinstance(v, float) and not np.isfinite(v)) for v in y.tolist()])
    else:
        return
    if len(bad):
        raise VFLInputError(f"{where} has {len(bad)} missing or infinite label(s), the first at line "
                            f"{int(bad[0]) + first_line}: drop those rows or fill in their labels")


def _match(values, given):
    for v in values:
        if str(v) == str(given) or (_is_number(v) and _is_number(given) and float(v) == float(given)):
            return v
    return None


def decide_task(y, y_test=None, *, task=None, positive_label=None, where="the label column",
                first_line: int = 1) -> Labels:
    """The task and the training labels of a file (binary: -1/+1; multi-class: 0..K-1)."""
    if y is None:
        if positive_label is not None or task in ("binary", "regression", "multiclass"):
            option = "--positive-label" if positive_label is not None else f"--task {task}"
            raise VFLInputError(f"{option} needs labels, but {where} has no label column: name it with "
                                f"--label-column")
        return Labels("unsupervised", None, None, None, "no labels (unsupervised)")
    _missing(y, where, first_line)
    if y_test is not None:
        _missing(y_test, where.replace("the label column", "the test file's label column"), 1)
    values = _values(y if y_test is None else np.concatenate([np.asarray(y, dtype=object),
                                                               np.asarray(y_test, dtype=object)]))
    if len(values) < 2:
        raise VFLInputError(f"{where} holds a single value ({_shown(values)}) in all {len(y)} rows: there is "
                            f"nothing to learn. Check --label-column, or use a file with at least two classes")
    if positive_label is not None:
        if task not in (None, "binary"):
            raise VFLInputError(f"--positive-label makes a binary task, but --task {task} was given: drop one "
                                f"of the two")
        positive = _match(values, positive_label)
        if positive is None:
            raise VFLInputError(f"--positive-label {positive_label!r} is not one of the label values in {where}: "
                                f"{_shown(values, 12)}")
        return _binary(y, y_test, values, positive, where,
                       "given by --positive-label" + ("" if len(values) == 2 else
                                                      f", against the {len(values) - 1} other values"))
    if task is None:
        numeric = all(_is_number(v) for v in values)
        if len(values) == 2:
            positive = max(values, key=lambda v: (float(v) if _is_number(v) else float("-inf"), str(v)))
            return _binary(y, y_test, values, positive, where, "inferred: two label values, the larger "
                           "positive; --positive-label chooses")
        if numeric and not all(float(v).is_integer() for v in values):
            return _regression(y, y_test, where, f"inferred: {len(values)} distinct numeric label values; "
                                                 f"--task chooses")
        if numeric and len(values) > MAX_INFERRED_CLASSES:
            return _regression(y, y_test, where, f"inferred: {len(values)} distinct integer label values; "
                                                 f"--task chooses")
        return _multiclass(y, y_test, values, where, f"inferred: {len(values)} label values "
                                                      f"({_shown(values)}); --task or --positive-label chooses")
    if task == "binary":
        if len(values) != 2:
            raise VFLInputError(f"--task binary needs two label values, but {where} has {len(values)} "
                                f"({_shown(values)}): pass --positive-label VALUE to train VALUE against the "
                                f"rest, or --task multiclass")
        positive = max(values, key=lambda v: (float(v) if _is_number(v) else float("-inf"), str(v)))
        return _binary(y, y_test, values, positive, where, "--task binary, the larger value positive; "
                                                           "--positive-label chooses")
    if task == "regression":
        text = [v for v in values if not _is_number(v)]
        if text:
            row = int(np.flatnonzero(np.asarray(y, dtype=object).astype(str) == str(text[0]))[0]) \
                if str(text[0]) in np.asarray(y, dtype=object).astype(str) else 0
            raise VFLInputError(f"--task regression needs numeric labels, but {where} holds {text[0]!r} (line "
                                f"{row + first_line}): use --task binary / --positive-label, or --task multiclass")
        return _regression(y, y_test, where, "--task regression")
    if task == "multiclass":
        return _multiclass(y, y_test, values, where, f"--task multiclass: {len(values)} classes")
    raise VFLInputError(f"unknown task {task!r}: choose binary, regression or multiclass")


def _binary(y, y_test, values, positive, where, why) -> Labels:
    def code(a):
        a = np.asarray(a, dtype=object)
        return np.array([1.0 if (str(v) == str(positive) or (_is_number(v) and _is_number(positive)
                                                              and float(v) == float(positive))) else -1.0
                         for v in a.tolist()])
    yy = code(y)
    if (yy > 0).all() or (yy < 0).all():
        which = "positive" if (yy > 0).all() else "negative"
        raise VFLInputError(f"every training row of {where} is {which} for --positive-label {positive!r}: a "
                            f"binary task needs rows of both classes")
    negatives = [v for v in values if v != positive]
    negative_name = negatives[0] if len(negatives) == 1 else "rest"
    note = f"binary: {positive!r} positive (+1) vs {_shown(negatives, 4)} (-1) ({why})"
    return Labels("binary", yy, None if y_test is None else code(y_test), [negative_name, positive], note)


def _regression(y, y_test, where, why) -> Labels:
    yy = np.asarray(y, dtype=np.float64)
    return Labels("regression", yy, None if y_test is None else np.asarray(y_test, dtype=np.float64), None,
                  f"regression ({why})")


def _multiclass(y, y_test, values, where, why) -> Labels:
    key = {str(v): i for i, v in enumerate(values)}
    code = lambda a: np.array([key.get(str(v), -1) for v in np.asarray(a, dtype=object).tolist()],  # noqa: E731
                              dtype=np.int64)
    return Labels("multiclass", code(y), None if y_test is None else code(y_test), list(values),
                  f"multiclass ({why})")
