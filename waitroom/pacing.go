package waitroom

import "time"

// The pacing of WAITING statuses (Config.WaitingPushes, Config.Competing):
// pure arithmetic, applied by broadcast once a tick.

// tickShare is one tick's share of a per-second budget, at least 1.
func tickShare(perSecond int, tick time.Duration) int {
	return max(1, int(float64(perSecond)*tick.Seconds()))
}

// waitingBudget is how many WAITING statuses one tick may push (-1: no
// cap). perSecond is Config.WaitingPushes (≤ 0: no cap), admitted the
// admissions this tick queues and competing the sale's requests since the
// last regular tick. The tick's share goes to the admissions first, so a
// paced status never delays a winner; the competing requests lower what is
// left, but not below a tenth of the share, so that the purchases get the
// CPU while the positions still move.
func waitingBudget(perSecond int, tick time.Duration, admitted int, competing int64) int {
	if perSecond <= 0 {
		return -1
	}
	full := tickShare(perSecond, tick)
	budget := max(0, full-admitted)
	if competing > 0 {
		budget = max(min(budget, full/10), budget-int(min(competing, int64(full))))
	}
	return budget
}

// competingBusy reports whether the sale's requests since the last regular
// tick reach a tenth of the tick's WAITING share: then a connection's ping
// may wait one ping period. With no cap on WAITING statuses no ping waits.
func competingBusy(perSecond int, tick time.Duration, competing int64) bool {
	return perSecond > 0 && competing > 0 && competing >= int64(tickShare(perSecond, tick)/10)
}
