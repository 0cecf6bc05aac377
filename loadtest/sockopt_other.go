//go:build !linux

package loadtest

import "syscall"

func bindNoPort(_, _ string, _ syscall.RawConn) error { return nil }
