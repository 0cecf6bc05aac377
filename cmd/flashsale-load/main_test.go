package main

import (
	"context"
	"io"
	"strings"
	"testing"
)

// TestLoadtestServerPIDsFlag: a bad --server-pids list is refused with
// the reason before the run starts (nothing is sent).
func TestLoadtestServerPIDsFlag(t *testing.T) {
	for _, bad := range []string{"gateway", "gateway=abc", "load=12", "a=5,b=5"} {
		err := cmdLoadtest(context.Background(), []string{"--secret", "s", "--url", "http://127.0.0.1:1", "--server-pids", bad,
			"--json", "", "--html", ""}, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "ParseServerPIDs") {
			t.Errorf("--server-pids %q: %v, want the list refused", bad, err)
		}
	}
}
