package loadtest

import "github.com/flashsale/flashsale/defense"

// defaultPowSolver answers waiting-room challenges (format: defense/POW.md).
var defaultPowSolver = defense.SolvePow
