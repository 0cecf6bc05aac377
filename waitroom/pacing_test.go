package waitroom

import (
	"testing"
	"time"
)

func TestWaitingBudget(t *testing.T) {
	const tick = 250 * time.Millisecond // a share of 250 at 1000/s, a tenth of 25
	tests := []struct {
		name      string
		perSecond int
		tick      time.Duration
		admitted  int
		competing int64
		want      int
	}{
		{name: "no cap", perSecond: -1, tick: tick, admitted: 10, competing: 1000, want: -1},
		{name: "quiet tick gets its share", perSecond: 1000, tick: tick, want: 250},
		{name: "admissions counted first", perSecond: 1000, tick: tick, admitted: 100, want: 150},
		{name: "admissions take the whole share", perSecond: 1000, tick: tick, admitted: 300, want: 0},
		{name: "competing requests lower the rest", perSecond: 1000, tick: tick, competing: 100, want: 150},
		{name: "more competing requests, less left", perSecond: 1000, tick: tick, competing: 200, want: 50},
		{name: "floor of a tenth", perSecond: 1000, tick: tick, competing: 240, want: 25},
		{name: "competing beyond the share keeps the floor", perSecond: 1000, tick: tick, competing: 1_000_000, want: 25},
		{name: "admissions and competing", perSecond: 1000, tick: tick, admitted: 200, competing: 100, want: 25},
		{name: "floor never raises what admissions left", perSecond: 1000, tick: tick, admitted: 240, competing: 50, want: 10},
		{name: "share is at least one", perSecond: 1, tick: tick, want: 1},
		{name: "share of one, competing", perSecond: 1, tick: tick, competing: 1, want: 0},
		{name: "longer tick, larger share", perSecond: 1000, tick: time.Second, admitted: 100, want: 900},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := waitingBudget(tt.perSecond, tt.tick, tt.admitted, tt.competing); got != tt.want {
				t.Errorf("waitingBudget(%d, %v, %d, %d) = %d, want %d",
					tt.perSecond, tt.tick, tt.admitted, tt.competing, got, tt.want)
			}
		})
	}
}

func TestCompetingBusy(t *testing.T) {
	const tick = 250 * time.Millisecond
	tests := []struct {
		name      string
		perSecond int
		competing int64
		want      bool
	}{
		{name: "no requests", perSecond: 1000, competing: 0, want: false},
		{name: "below a tenth of the share", perSecond: 1000, competing: 24, want: false},
		{name: "a tenth of the share", perSecond: 1000, competing: 25, want: true},
		{name: "above", perSecond: 1000, competing: 5000, want: true},
		{name: "no cap never busy", perSecond: -1, competing: 5000, want: false},
		{name: "share of one: any request", perSecond: 1, competing: 1, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := competingBusy(tt.perSecond, tick, tt.competing); got != tt.want {
				t.Errorf("competingBusy(%d, %v, %d) = %v, want %v", tt.perSecond, tick, tt.competing, got, tt.want)
			}
		})
	}
}
