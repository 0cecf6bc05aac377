package flashsale

import (
	"errors"
	"fmt"
)

// Code is a machine-readable error code of the public contract.
type Code string

// Error codes of CONTRACT.md.
const (
	CodeInvalid          Code = "INVALID"
	CodeUnauthenticated  Code = "UNAUTHENTICATED"
	CodeForbidden        Code = "FORBIDDEN"
	CodeNotAdmitted      Code = "NOT_ADMITTED"
	CodeBlocked          Code = "BLOCKED"
	CodeNotFound         Code = "NOT_FOUND"
	CodeTooLarge         Code = "TOO_LARGE"
	CodeRateLimited      Code = "RATE_LIMITED"
	CodeUnavailable      Code = "UNAVAILABLE"
	CodeSoldOut          Code = "SOLD_OUT"
	CodeAlreadyPurchased Code = "ALREADY_PURCHASED"
	CodeOrderExpired     Code = "ORDER_EXPIRED"
	CodeOrderCancelled   Code = "ORDER_CANCELLED"
	CodeOrderPaid        Code = "ORDER_PAID"
	CodeNotPayableYet    Code = "NOT_PAYABLE_YET"
	CodeBadSignature     Code = "BAD_SIGNATURE"    // a payment callback's signature is missing, malformed or wrong
	CodeStaleSignature   Code = "STALE_SIGNATURE"  // a payment callback signed too long ago or ahead
	CodeReplayed         Code = "REPLAYED"         // a payment callback's exact signature was accepted before
	CodePaymentMismatch  Code = "PAYMENT_MISMATCH" // a payment callback's amount or currency is not the order's
	CodeInternal         Code = "INTERNAL"
	// CodeNotDrawn: a sale's public draw record before its draw.
	CodeNotDrawn Code = "NOT_DRAWN"
	// CodeChoiceClosed: a shopper's item choice after their turn came (a
	// unit is held for them, or about to be): the choice is fixed.
	CodeChoiceClosed Code = "CHOICE_CLOSED"
	// CodeDuplicateIdentity: a join whose identity key (the access
	// token's idk claim) holds a place in the sale under another user.
	CodeDuplicateIdentity Code = "DUPLICATE_IDENTITY"
	// CodeNotInvited: a join of a codes or allowlist sale by a shopper
	// the rule does not let in (no code, not on the list, no trusted
	// tier), before the sale's publicFrom if it has one.
	CodeNotInvited Code = "NOT_INVITED"
	// CodeCodeInvalid: a join with an invitation code the sale does not
	// have (unknown, or another sale's).
	CodeCodeInvalid Code = "CODE_INVALID"
	// CodeCodeUsed: a join with an invitation code that has been used
	// as many times as it may be.
	CodeCodeUsed Code = "CODE_USED"
	// CodeNotYet: a join before the shopper's tier, or the public, may
	// join (the message says when).
	CodeNotYet Code = "NOT_YET"
)

// Error is the one domain error type. Message is safe to show a user.
// OrderID is set for ALREADY_PURCHASED.
type Error struct {
	Code    Code
	Message string
	OrderID string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Code, e.Message) }

// Errorf returns a domain error with a formatted, user-safe message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Invalid returns an INVALID error about one field of a request: the
// message begins with the field's name so a caller can tell what to fix.
func Invalid(field, format string, args ...any) *Error {
	return &Error{Code: CodeInvalid, Message: field + ": " + fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the first *Error in err's chain, CodeInternal
// for any other non-nil error and "" for nil.
func ErrorCode(err error) Code {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// ErrorMessage returns the user-safe message of err: the domain message, or a
// generic text for internal errors (whose details must not leak).
func ErrorMessage(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return "internal error"
}

// Shadow is a join check's verdict that the shopper goes to the sale's
// shadow queue rather than being refused (the bot defense's shadowQueue
// settings): Rule names what judged them. The waiting room acts on it and
// never shows it to the shopper, who sees a waiting page like anyone's.
type Shadow struct {
	Rule string
}

func (s *Shadow) Error() string { return "shadowed by " + s.Rule }
