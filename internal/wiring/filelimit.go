package wiring

import "syscall"

// fdReserve is how many file descriptors a gateway keeps for everything but
// WebSockets: Redis, PostgreSQL and Kafka connections, plain HTTP clients.
const fdReserve = 1024

// maxWebSockets is this process's WebSocket cap: its open-file limit less
// the reserve, at least 64 (0: unknown, no cap).
func maxWebSockets() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 0
	}
	return max(64, int(rl.Cur)-fdReserve)
}

// RaiseFileLimit lifts the soft open-file limit to the hard one (a gateway
// holds one descriptor per waiting shopper).
func RaiseFileLimit() {
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil && rl.Cur < rl.Max {
		rl.Cur = rl.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
}
