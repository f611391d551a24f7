"""The loopback chat server with faults injected, for the tests of the ``openai`` reader: a
:class:`~memalpha_lab.reader_server.ChatCompletionServer` whose :meth:`intercept` delays the next
requests, answers them with an HTTP error status or a malformed body, or stops listening as one
arrives (as a crashed server would), and counts the authorised chat requests it saw."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from memalpha_lab.reader_server import ChatCompletionServer


@dataclass
class Fault:
    delay_s: float
    status: int | None
    body: bytes | None
    die: bool
    skip: int
    remaining: int


class FaultyServer(ChatCompletionServer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.requests_seen = 0
        self._fault: Fault | None = None
        self._fault_lock = threading.Lock()

    def inject_fault(
        self,
        delay_s: float = 0.0,
        status: int | None = None,
        count: int = 1,
        *,
        body: bytes | None = None,
        die: bool = False,
        after: int = 0,
    ) -> None:
        """Make ``count`` chat requests, after letting the next ``after`` through, misbehave.

        Each waits ``delay_s``, then: with ``status`` it is answered with that HTTP status; with
        ``body`` it is answered 200 with these raw bytes (a malformed reply); with ``die`` the
        server stops listening and hangs up without a reply, so later requests are refused
        until :meth:`start`; with none of them it is answered normally. ``count=0`` clears the fault.
        """
        if sum((status is not None, body is not None, die)) > 1:
            raise ValueError("inject_fault: give at most one of status, body and die")
        with self._fault_lock:
            self._fault = Fault(delay_s, status, body, die, after, count) if count > 0 else None

    def _take_fault(self) -> Fault | None:
        with self._fault_lock:
            self.requests_seen += 1
            fault = self._fault
            if fault is None:
                return None
            if fault.skip > 0:
                fault.skip -= 1
                return None
            fault.remaining -= 1
            if fault.remaining <= 0:
                self._fault = None
            return fault

    def intercept(self, handler) -> bool:
        fault = self._take_fault()
        if fault is None:
            return False
        time.sleep(fault.delay_s)
        if fault.status is not None:
            handler._error(fault.status, "injected fault", "server_error")
            return True
        if fault.body is not None:
            handler._send_raw(200, fault.body)
            return True
        if fault.die:
            handler.close_connection = True
            self.stop()
            return True
        return False  # only delayed: answered normally
