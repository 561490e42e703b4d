"""Forcing one interleaving of two threads in a test, with no sleeps: a
thread stops at a chosen point until the other has either finished or
had to wait for a lock (watch_locks), so the test runs the same way on
a loaded machine. Every wait is bounded (WAIT_S), so a test whose threads
would hang fails instead."""
import threading

WAIT_S = 60.0


class WatchedLock:
    """A threading Lock or RLock that sets `waiting` (an Event) when a
    thread finds it held by another and has to wait for it."""

    def __init__(self, real, waiting):
        self._real, self._waiting = real, waiting

    def acquire(self, blocking=True, timeout=-1):
        if self._real.acquire(False):
            return True
        if not blocking:
            return False
        self._waiting.set()
        return self._real.acquire(True, timeout)

    def release(self):
        self._real.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


class _WatchedThreading:
    """The threading module, as a module under test sees it, whose Lock()
    and RLock() are watched."""

    def __init__(self, waiting):
        self._waiting = waiting

    def Lock(self):  # noqa: N802 - threading's name
        return WatchedLock(threading.Lock(), self._waiting)

    def RLock(self):  # noqa: N802 - threading's name
        return WatchedLock(threading.RLock(), self._waiting)

    def __getattr__(self, name):
        return getattr(threading, name)


def watch_locks(monkeypatch, module, waiting):
    """Makes the locks `module` creates from now on set `waiting` when a
    thread has to wait for one. A module that takes no lock (the code
    before a fix) is given the name all the same, and never uses it."""
    monkeypatch.setattr(module, "threading", _WatchedThreading(waiting), raising=False)


class Runner(threading.Thread):
    """fn() on a thread of its own. done (an Event, optional) is set when
    it returns or raises; outcome() gives its result or raises its error
    here."""

    def __init__(self, fn, done=None):
        super().__init__(daemon=True)  # one a failed test leaves waiting must not hold pytest
        self._fn, self._done = fn, done
        self.result = self.error = None

    def run(self):
        try:
            self.result = self._fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test by outcome()
            self.error = e
        finally:
            if self._done is not None:
                self._done.set()

    def outcome(self, what):
        self.join(WAIT_S)
        assert not self.is_alive(), "%s did not return within %.0f s" % (what, WAIT_S)
        if self.error is not None:
            raise self.error
        return self.result


def wait_for(event, what):
    assert event.wait(WAIT_S), "%s did not happen within %.0f s" % (what, WAIT_S)


def second_while_first_stopped(first, second_fn, first_stopped, either, what):
    """Starts `first` (a Runner), waits until it has stopped at its point
    (first_stopped), then runs second_fn on another thread, which sets
    `either` when it returns (the first waits for either, or for a watched
    lock to make the second wait). Returns both outcomes, first's first."""
    first.start()
    wait_for(first_stopped, "the first %s stopping at its point" % what)
    second = Runner(second_fn, done=either)
    second.start()
    return first.outcome("the first " + what), second.outcome("the second " + what)

