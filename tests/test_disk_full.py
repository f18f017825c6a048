"""A full disk is found along both links of an exception's chain (``refexp/record/disk_full.py``): ``__cause__``
(``raise ... from e``) and ``__context__`` (an error raised while handling another, without ``from``)."""

from __future__ import annotations

import errno

import pytest

from refexp.record.disk_full import describe_error, disk_full


def _full() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", "metrics.jsonl")


def _context_only() -> BaseException:
    """A RuntimeError raised while handling the full disk, without ``from``: only ``__context__`` links them."""
    try:
        try:
            raise _full()
        except OSError:
            raise RuntimeError("closing the metrics file failed")
    except RuntimeError as e:
        assert e.__cause__ is None and isinstance(e.__context__, OSError)
        return e


def _cause_only() -> BaseException:
    """A RuntimeError whose ``__cause__`` is the full disk, raised outside any handler: no ``__context__``."""
    error = RuntimeError("writing the checkpoint failed")
    error.__cause__ = _full()
    assert error.__context__ is None
    return error


def _cause_then_context() -> BaseException:
    """Both links on the way: a ValueError caused by a TypeError raised while handling the full disk."""
    try:
        raise _full()
    except OSError:
        middle = TypeError("while handling it")
        middle.__context__ = _full()
    outer = ValueError("outer")
    outer.__cause__ = middle
    return outer


def _cause_beside_context() -> BaseException:
    """``raise ... from other`` while handling the full disk: the cause is another error, the full disk is the
    context."""
    try:
        try:
            raise _full()
        except OSError:
            raise RuntimeError("the checkpoint's cleanup failed") from KeyError("step-4")
    except RuntimeError as e:
        assert isinstance(e.__cause__, KeyError) and isinstance(e.__context__, OSError)
        return e


@pytest.mark.parametrize("make", [_context_only, _cause_only, _cause_then_context, _cause_beside_context])
def test_a_full_disk_is_found_along_cause_and_context(make):
    error = make()
    assert disk_full(error)
    assert describe_error(error).startswith(f"No space left on device: {type(error).__name__}: ")


def test_an_error_without_a_full_disk_in_its_chain_is_not_one():
    try:
        try:
            raise OSError(errno.EACCES, "Permission denied", "metrics.jsonl")
        except OSError:
            raise RuntimeError("closing the metrics file failed")
    except RuntimeError as e:
        assert not disk_full(e)
        assert describe_error(e) == "RuntimeError: closing the metrics file failed"
