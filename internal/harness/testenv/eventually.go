package testenv

import (
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
	deadline := time.Now().Add(timeout)
	wait := 5 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what())
		}
		time.Sleep(wait)
		wait = min(2*wait, 100*time.Millisecond)
	}
}
