"""A signal held while a store write runs (runner.signals.held) is then handled as the block
around it would have handled it: deferred to the next safe point inside a deferring block (so a
stop is checkpointed where the state is consistent), raised at once elsewhere."""

from __future__ import annotations

import os
import signal

import pytest

from runner.signals import (
    Interrupted,
    agreeing,
    held,
    raise_if_stopped,
    stop_if_signalled,
    stop_on_signals,
)

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


def test_a_signal_held_part_way_through_a_refit_stops_there_unless_ranks_agree():
    """Alone, a held signal stops at the refit's next step (not safe: no checkpoint there);
    where torchrun's ranks vote at every safe point, it waits for the next one, where every
    rank stops together."""
    with pytest.raises(Interrupted) as stopped, stop_on_signals(deferred=True):
        os.kill(os.getpid(), signal.SIGTERM)
        stop_if_signalled()
    assert not stopped.value.safe
    votes: list[int] = []

    def agree(signum: int) -> int:
        votes.append(signum)
        return signum

    with pytest.raises(Interrupted) as voted, stop_on_signals(deferred=True), agreeing(agree):
        os.kill(os.getpid(), signal.SIGTERM)
        stop_if_signalled()  # held: the ranks have not voted
        raise_if_stopped()
    assert voted.value.safe and votes == [signal.SIGTERM]
