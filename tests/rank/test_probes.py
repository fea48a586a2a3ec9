"""The probe lifecycle's attachment rules (pure logic; the probes themselves run in tests of real runs)."""

from __future__ import annotations

from ddplab.rank.probes import ORDER, attach_order, registry
from ddplab.spec.experiment import PROBES


def test_every_probe_the_spec_accepts_is_registered_in_the_lifecycle_order():
    assert set(registry()) == set(PROBES) == set(ORDER)
    for name, cls in registry().items():
        assert all(ORDER.index(dep) < ORDER.index(name) for dep in cls.needs), name


def test_probes_nest_the_same_way_however_they_are_listed():
    classes = registry()
    a, _ = attach_order(("readiness", "bytes"), classes)
    b, _ = attach_order(("bytes", "readiness"), classes)
    assert a == b == ["buckets", "bytes", "readiness"]   # the bytes count wraps the ready-time window


def test_a_probe_attached_for_another_records_nothing_unless_shown():
    classes = registry()
    order, recorded = attach_order(("memory",), classes)
    assert order == ["buckets", "activations", "memory"] and recorded == {"memory"}
    order, recorded = attach_order(("readiness",), classes)
    assert order == ["buckets", "readiness"] and recorded == {"readiness", "buckets"}
