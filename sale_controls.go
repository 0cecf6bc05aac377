package flashsale

// Error codes of the operator's controls of a running sale (CONTRACT
// sections 3 and 5).
const (
	// CodeSalePaused: the operator paused the sale; a purchase waits for
	// the resume (the admission token stays valid).
	CodeSalePaused Code = "SALE_PAUSED"
	// CodeVersionConflict: an operator's write named a version (If-Match)
	// that is no longer the current one; nothing changed.
	CodeVersionConflict Code = "VERSION_CONFLICT"
)

// SaleAction is an operator's action on a running sale: the kill switch
// (pause, resume, end), a stock addition and a message to the queue.
type SaleAction struct {
	Kind  ActionKind
	Actor string // the operator's user id, for the audit log
	// IfVersion as in SaleUpdate.
	IfVersion int64
	ItemID    int64  // ActionStock
	Add       int64  // ActionStock: 1 to MaxStockAdd units
	Text      string // ActionMessage: ParseMessage's result ("" clears)
}

// ActionKind names a SaleAction; it is also the audit log's action.
type ActionKind string

// Sale actions.
const (
	ActionPause   ActionKind = "sale.pause"
	ActionResume  ActionKind = "sale.resume"
	ActionEnd     ActionKind = "sale.end"
	ActionStock   ActionKind = "sale.stock"
	ActionMessage ActionKind = "sale.message"
)
