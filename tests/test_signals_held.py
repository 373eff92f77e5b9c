"""A signal held while a store write runs (runner.signals.held) is then handled as the block
around it would have handled it: deferred to the next safe point inside a deferring block (so a
stop is checkpointed where the state is consistent), raised at once elsewhere."""

from __future__ import annotations

import os
import signal

import pytest

from runner.signals import Interrupted, held, raise_if_stopped, stop_on_signals

pytestmark = pytest.mark.unit  # real signals to this process, main thread


def test_inside_a_deferring_block_a_held_signal_waits_for_the_safe_point():
    with pytest.raises(Interrupted) as stopped, stop_on_signals(deferred=True):
        with held():
            os.kill(os.getpid(), signal.SIGTERM)
        reached = True  # the write's block ended without raising
        raise_if_stopped()
    assert reached and stopped.value.safe and stopped.value.signum == signal.SIGTERM


def test_elsewhere_a_held_signal_stops_when_the_block_ends():
    for around in (stop_on_signals, None):
        with pytest.raises(Interrupted) as stopped:
            if around is None:
                with held():
                    os.kill(os.getpid(), signal.SIGINT)
            else:
                with around(), held():
                    os.kill(os.getpid(), signal.SIGINT)
        assert not stopped.value.safe and stopped.value.signum == signal.SIGINT


def test_a_signal_held_inside_a_held_block_waits_for_the_outer_one():
    """A run's final writes (flush, then the status) hold signals around store calls that hold
    them too: the status is still written before the signal stops anything."""
    written = []
    with pytest.raises(Interrupted), held():
        with held():
            os.kill(os.getpid(), signal.SIGTERM)
        written.append("status")
    assert written == ["status"]
