"""The capture gate: makes "is this stream capturing" one fact for ferry and for
the Runtime's own map of capturing streams (issue 41: ctypes drops the GIL during
a C call, so a check of the map and the call after it are not one step).

begin_capture and end_capture hold it alone across their C call and their update
of the map; a call a capture records over host memory (upload, copy_to_host,
launch) holds it shared from its look at the map to the end of its C call. Shared
holders run side by side; one waiting to hold it alone goes first, so a thread
that keeps copying cannot starve a capture.
"""
import contextlib
import threading


class CaptureGate:
    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._shared = 0
        self._alone = False
        self._waiting_alone = 0

    @contextlib.contextmanager
    def shared(self, what):
        # Before waiting: a launch callable must not wait on a holder that waits on
        # the very op it runs in.
        from . import _refuse_inside_callable
        _refuse_inside_callable(what)
        with self._cond:
            while self._alone or self._waiting_alone:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                if not self._shared:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self, what):
        from . import _refuse_inside_callable
        _refuse_inside_callable(what)
        with self._cond:
            self._waiting_alone += 1
            try:
                while self._alone or self._shared:
                    self._cond.wait()
            finally:
                self._waiting_alone -= 1
                self._cond.notify_all()  # shared waiters, when this wait was interrupted
            self._alone = True
        try:
            yield
        finally:
            with self._cond:
                self._alone = False
                self._cond.notify_all()
