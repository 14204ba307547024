"""StopListener: chat messages queue in order, StopAnswer cuts one answer, StopJob or EOF end a session."""

from __future__ import annotations

import io

from backend.core.protocol import ChatMessage, StopAnswer, StopJob, encode
from backend.runtime.stop_listener import StopListener

HI = [{"role": "user", "content": "hi"}]


def listen(*lines: str) -> StopListener:
    listener = StopListener(io.StringIO("".join(lines))).start()
    listener._thread.join(timeout=10)
    return listener


def test_messages_come_in_order_and_a_cut_belongs_to_the_answer_before():
    listener = listen(encode(ChatMessage(messages=HI, max_new_tokens=1)), encode(StopAnswer()),
                      encode(ChatMessage(messages=HI, max_new_tokens=2)), "not json\n")
    assert listener.cut_requested and not listener.requested
    first = listener.next_message(timeout=1)
    assert isinstance(first, ChatMessage) and first.max_new_tokens == 1 and not listener.cut_requested
    assert listener.next_message(timeout=1).max_new_tokens == 2
    refused = listener.next_message(timeout=1)
    assert isinstance(refused, str) and "could not read" in refused and "not JSON" in refused
    assert listener.closed and listener.next_message(timeout=1) is None  # stdin closed: the session ends


def test_stop_job_ends_the_session_and_cuts_the_answer():
    listener = listen(encode(StopJob(save=False)), encode(ChatMessage(messages=HI)))
    assert listener.requested and listener.cut_requested and listener.save is False
    assert listener.next_message(timeout=1) is None
