package bench

import (
	"strings"
	"testing"
)

const wrkSample = `Running 10s test @ http://127.0.0.1:8080/api/flash-sales/items/2/purchase
  2 threads and 256 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     5.12ms    2.01ms  40.00ms   80.00%
    Req/Sec    25.10k     1.20k   28.00k    70.00%
  Latency Distribution
     50%    4.90ms
     75%    6.00ms
     90%    7.50ms
     99%   12.30ms
  499512 requests in 10.00s, 70.12MB read
  Socket errors: connect 0, read 0, write 0, timeout 12
  Non-2xx or 3xx responses: 499512
Requests/sec:  49951.20
Transfer/sec:      7.01MB
`

func TestParseWrk(t *testing.T) {
	got, err := ParseWrk(wrkSample)
	if err != nil {
		t.Fatal(err)
	}
	want := WrkResult{Requests: 499512, RPS: 49951.20, LatencyAvg: "5.12ms", LatencyP99: "12.30ms", Non2xx: 499512,
		SocketErrors: "connect 0, read 0, write 0, timeout 12"}
	if got != want {
		t.Errorf("ParseWrk = %+v, want %+v", got, want)
	}
	if _, err := ParseWrk("garbage"); err == nil {
		t.Error("ParseWrk(garbage) = nil error, want one")
	}
}

func TestMediansAndSummary(t *testing.T) {
	samples := []Sample{
		{Scenario: Baseline, Wrk: WrkResult{RPS: 100, Requests: 1000}},
		{Scenario: SoldOut, Wrk: WrkResult{RPS: 90, Requests: 900}, RedisCommands: 70, PrevBaseline: 100, Codes: map[string]int64{"410": 900}},
		{Scenario: Baseline, Wrk: WrkResult{RPS: 80, Requests: 800}},
		{Scenario: SoldOut, Wrk: WrkResult{RPS: 60, Requests: 600}, RedisCommands: 70, PrevBaseline: 80},
		{Scenario: Idle, RedisCommands: 70},
	}
	if got, want := Medians(samples), "baseline 90\nsold-out 75\nidle 70\n"; got != want {
		t.Errorf("Medians = %q, want %q", got, want)
	}
	sum := Summarize(samples, Options{})
	// median 75 / median baseline 90 = 83.3%, paired median of 0.9 and 0.75 = 82.5%
	for _, want := range []string{"83.3%", "82.5%", "missed", "410:900", "0.0000"} {
		if !strings.Contains(sum, want) {
			t.Errorf("summary has no %q:\n%s", want, sum)
		}
	}
}
