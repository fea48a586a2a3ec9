"""When `run` starts a session of warm ranks by itself: pure logic, no ranks started."""

from __future__ import annotations

import pytest

from ddplab.launch import reuse


@pytest.mark.parametrize("warm, env, expected", [(True, "", True), (False, "1", False), (None, "1", True),
                                                 (None, "0", False), (None, "off", False), (None, "", False)])
def test_whether_a_run_starts_a_session(monkeypatch, warm, env, expected):
    monkeypatch.setenv("DDPLAB_WARM", env)
    assert reuse.wanted(warm) is expected   # outside a kernel the default is cold


def test_the_default_is_warm_in_a_jupyter_kernel(monkeypatch):
    from ddplab.launch import progress

    monkeypatch.delenv("DDPLAB_WARM", raising=False)
    monkeypatch.setattr(progress, "in_notebook", lambda: True)
    assert reuse.wanted(None) is True
    monkeypatch.setattr(progress, "in_notebook", lambda: False)
    assert reuse.wanted(None) is False
