package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flashsale/flashsale"
)

// ErrUnavailable is what a caller sees while a store cannot be reached:
// the gateway answers it 503 with Retry-After.
var ErrUnavailable = flashsale.Errorf(flashsale.CodeUnavailable, "temporarily unavailable; retry shortly")

// Outage is how a store classifies the errors it returns: one that means
// the store is down or too slow (Unavailable: PostgreSQL's connection and
// shutdown errors, a refused or broken connection, a deadline) becomes
// UNAVAILABLE (ErrUnavailable, wrapping err), so that an outage is
// answered 503 with Retry-After, never 500. Domain answers and other
// errors (a bug) pass unchanged, as does nil. Every exported method of a
// store behind the gateway returns its error through Outage.
func Outage(err error) error {
	if err == nil || flashsale.ErrorCode(err) != flashsale.CodeInternal || !Unavailable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// Unavailable reports whether err means the database could not be reached
// or could not answer now (down, restarting, overloaded, too slow), as
// opposed to the database answering that a statement is wrong. Callers
// answer the first kind "unavailable, retry shortly", never an internal
// error: a stopped PostgreSQL is an outage, not a bug.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.SQLState()[:2] {
		case "08", // connection exception
			"53", // insufficient resources (too many connections, disk full)
			"57", // operator intervention: shutdown, crash, cannot connect now
			"58": // system error (I/O)
			return true
		}
		return pe.Code == "40001" || pe.Code == "40P01" // serialization failure, deadlock: retryable
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ce),
		errors.As(err, &ne),
		pgconn.Timeout(err),
		pgconn.SafeToRetry(err),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE):
		return true
	}
	return isClosedConn(err)
}

// isClosedConn matches pgx's untyped errors for a connection that broke
// while in use, or a pool closed at shutdown.
func isClosedConn(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		switch e.Error() {
		case "conn closed", "conn busy", "closed pool":
			return true
		}
	}
	return false
}

// MarkOutage applies Outage to a method's named error result, deferred at
// the method's top: defer postgres.MarkOutage(&err).
func MarkOutage(err *error) { *err = Outage(*err) }
