package testenv

import (
	"fmt"
	"testing"
	"time"
)

// Eventually waits until cond holds: it checks at once, then at intervals
// that grow from 5 ms to 100 ms, and fails t with what when cond still
// does not hold after timeout. It is the one way the tests wait for
// something another goroutine or process does; the timeout only guards
// against a hang, so it is generous. A test that needs time to pass
// advances its injected clock instead.
func Eventually(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	EventuallyF(t, func() string { return what }, timeout, cond)
}

// EventuallyF is Eventually with the failure's description built when it
// fails (it may report the state cond saw last).
func EventuallyF(t testing.TB, what func() string, timeout time.Duration, cond func() bool) {
	t.Helper()
	if !Wait(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what())
	}
}

// EventuallyValue waits as Eventually does until f reports ok and returns
// the value it returned with it; the failure names what and the value f
// returned last.
func EventuallyValue[T any](t testing.TB, what string, timeout time.Duration, f func() (T, bool)) T {
	t.Helper()
	var v T
	EventuallyF(t, func() string { return fmt.Sprintf("%s (last: %+v)", what, v) }, timeout, func() bool {
		var ok bool
		v, ok = f()
		return ok
	})
	return v
}

// Wait checks cond as Eventually does and reports whether it held before
// timeout, for a test that goes on either way (it tries something else,
// or checks what it got with a message of its own).
func Wait(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	wait := 5 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait)
		wait = min(2*wait, 100*time.Millisecond)
	}
	return true
}
