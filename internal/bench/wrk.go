package bench

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// WrkResult is what one wrk run printed.
type WrkResult struct {
	Requests     int64
	RPS          float64
	LatencyAvg   string
	LatencyP99   string // with --latency only
	Non2xx       int64
	SocketErrors string // "" when none
}

var (
	reRPS      = regexp.MustCompile(`(?m)^Requests/sec:\s+([0-9.]+)`)
	reRequests = regexp.MustCompile(`(?m)^\s*([0-9]+) requests in `)
	reNon2xx   = regexp.MustCompile(`(?m)^\s*Non-2xx or 3xx responses:\s+([0-9]+)`)
	reSocket   = regexp.MustCompile(`(?m)^\s*Socket errors:\s+(.*)$`)
	reLatency  = regexp.MustCompile(`(?m)^\s*Latency\s+(\S+)`)
	reP99      = regexp.MustCompile(`(?m)^\s*99%\s+(\S+)`)
)

// ParseWrk reads wrk's standard report.
func ParseWrk(out string) (WrkResult, error) {
	var r WrkResult
	m := reRPS.FindStringSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("bench.ParseWrk: no Requests/sec in wrk output:\n%s", out)
	}
	r.RPS, _ = strconv.ParseFloat(m[1], 64)
	if m := reRequests.FindStringSubmatch(out); m != nil {
		r.Requests, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := reNon2xx.FindStringSubmatch(out); m != nil {
		r.Non2xx, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := reSocket.FindStringSubmatch(out); m != nil {
		r.SocketErrors = strings.TrimSpace(m[1])
	}
	if m := reLatency.FindStringSubmatch(out); m != nil {
		r.LatencyAvg = m[1]
	}
	if m := reP99.FindStringSubmatch(out); m != nil {
		r.LatencyP99 = m[1]
	}
	return r, nil
}
