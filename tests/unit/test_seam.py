"""kvfs/service.py's Seam: the one way a call goes up between layers. A call before the
factory bound it, or a second binding, is a wiring bug and raises; once bound, attribute
access and `later` hooks reach the upper end."""

from __future__ import annotations

import pytest

from kvfs.service import Seam, Seams


class Upper:
    def __init__(self):
        self.calls = []

    def kick(self, *args, **kw):
        self.calls.append((args, kw))
        return "kicked"


def test_an_unbound_seam_raises_naming_itself():
    seam = Seam("catalog -> write-back (on_unsynced)")
    hook = seam.later("kick")  # made before the upper end exists: fine
    with pytest.raises(RuntimeError, match="on_unsynced.*before the factory bound it"):
        hook()
    with pytest.raises(RuntimeError, match="before the factory bound it"):
        seam.kick


def test_a_bound_seam_forwards_attributes_and_hooks():
    seam, upper = Seam("test"), Upper()
    hook = seam.later("kick")
    seam.bind(upper)
    assert hook(1, two=2) == "kicked" and upper.calls == [((1,), {"two": 2})]
    assert seam.kick() == "kicked"
    with pytest.raises(AttributeError):
        seam.missing  # the upper end's own AttributeError


def test_a_seam_is_bound_once():
    seam = Seam("test")
    seam.bind(Upper())
    with pytest.raises(RuntimeError, match="bound twice"):
        seam.bind(Upper())


def test_each_service_gets_its_own_seams():
    a, b = Seams(), Seams()
    assert a.evictor is not b.evictor and a.changes is not a.writes
