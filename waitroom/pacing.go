package waitroom

import (
	"cmp"
	"slices"
	"time"
)

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

// frontFirst moves the k entries of due with the smallest places to
// due[:k], in place order, and leaves the rest in due[k:] in no order. A
// tick that can send k of n due statuses needs only those k: selecting
// them costs O(n) where sorting all n, as an opening's tick has tens of
// thousands, cost O(n log n) of the CPU the purchases need.
func frontFirst(due []dueStatus, k int) {
	if k <= 0 || len(due) == 0 {
		return
	}
	if k < len(due) {
		lo, hi := 0, len(due)-1
		for lo < hi {
			p := partitionByPlace(due, lo, hi)
			switch {
			case p == k-1:
				lo = hi // done: due[:k] holds the k smallest
			case p < k-1:
				lo = p + 1
			default:
				hi = p - 1
			}
		}
		due = due[:k]
	}
	slices.SortFunc(due, func(a, b dueStatus) int { return cmp.Compare(a.c.place, b.c.place) })
}

// partitionByPlace partitions due[lo:hi+1] around the median of its first,
// middle and last places (Lomuto) and returns the pivot's final index:
// every entry before it has a place ≤ the pivot's, every entry after it ≥.
func partitionByPlace(due []dueStatus, lo, hi int) int {
	mid := lo + (hi-lo)/2
	if due[mid].c.place < due[lo].c.place {
		due[mid], due[lo] = due[lo], due[mid]
	}
	if due[hi].c.place < due[lo].c.place {
		due[hi], due[lo] = due[lo], due[hi]
	}
	if due[mid].c.place < due[hi].c.place {
		due[mid], due[hi] = due[hi], due[mid]
	}
	pivot := due[hi].c.place // the median of the three
	i := lo
	for j := lo; j < hi; j++ {
		if due[j].c.place < pivot {
			due[i], due[j] = due[j], due[i]
			i++
		}
	}
	due[i], due[hi] = due[hi], due[i]
	return i
}
