package waitroom

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Durable keeps what of a queue must outlive a Redis loss: the tickets in
// join order (so the draw's membership, tickets 0..n-1) with their
// holders' tiers, the pre-queue size n, whether the draw is by tier, and
// the cursor. The leader of a sale checkpoints it (Room's
// checkpoint loop, Config.CheckpointEvery); a gateway that finds the queue
// gone from Redis, or behind what it knows, restores it from here plus
// its own connections (Room.restore). Tickets handed out after the last
// checkpoint are known only to the gateways that hold their connections.
type Durable interface {
	// Saved is the checkpoint's figures (found false: none yet). Seq is
	// the number of tickets saved.
	Saved(ctx context.Context, saleID int64) (st queueState, found bool, err error)
	// Save appends users as tickets first, first+1, ... with their tiers
	// (a digit each, nil: none; tickets below the saved count are
	// skipped, so a retry or a second leader is harmless), sets st.N and
	// st.Tiered (once) and raises the cursor to st.Serving. It returns
	// the saved count.
	Save(ctx context.Context, saleID, first int64, users []int64, tiers []byte, st queueState) (seq int64, err error)
	// Load returns the checkpoint: its figures, tickets 0..Seq-1 and
	// their tiers (a digit each; nil when none has a tier).
	Load(ctx context.Context, saleID int64) (st queueState, users []int64, tiers []byte, found bool, err error)
}

// PGDurable is Durable in PostgreSQL (migration 0004): one queue_state row
// per sale, and the tickets as chunks, one row per checkpoint, so a
// checkpoint of any size is one row and a restore one query.
type PGDurable struct{ pool *pgxpool.Pool }

// NewPGDurable returns the PostgreSQL Durable.
func NewPGDurable(pool *pgxpool.Pool) *PGDurable { return &PGDurable{pool: pool} }

// Saved implements Durable.
func (d *PGDurable) Saved(ctx context.Context, saleID int64) (queueState, bool, error) {
	var st queueState
	err := d.pool.QueryRow(ctx, `SELECT seq, n, serving, tiered FROM queue_state WHERE sale_id = $1`, saleID).Scan(&st.Seq, &st.N, &st.Serving, &st.Tiered)
	if errors.Is(err, pgx.ErrNoRows) {
		return queueState{N: -1}, false, nil
	}
	if err != nil {
		return queueState{}, false, fmt.Errorf("waitroom.Saved: %w", err)
	}
	return st, true, nil
}

// Save implements Durable.
func (d *PGDurable) Save(ctx context.Context, saleID, first int64, users []int64, tiers []byte, st queueState) (int64, error) {
	var seq int64
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO queue_state (sale_id) VALUES ($1) ON CONFLICT (sale_id) DO NOTHING`, saleID); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT seq FROM queue_state WHERE sale_id = $1 FOR UPDATE`, saleID).Scan(&seq); err != nil {
			return err
		}
		if first <= seq && first+int64(len(users)) > seq {
			rest := users[seq-first:]
			if _, err := tx.Exec(ctx, `INSERT INTO queue_tickets (sale_id, first_ticket, users, tiers) VALUES ($1, $2, $3, $4)`,
				saleID, seq, rest, chunkTiers(tiers, seq-first, len(rest))); err != nil {
				return err
			}
			seq += int64(len(rest))
		}
		_, err := tx.Exec(ctx, `UPDATE queue_state SET seq = $2,
			tiered = CASE WHEN n < 0 AND $3 >= 0 THEN $5 ELSE tiered END,
			n = CASE WHEN n < 0 THEN $3 ELSE n END,
			serving = GREATEST(serving, $4), saved_at = now()
			WHERE sale_id = $1`, saleID, seq, st.N, st.Serving, st.Tiered)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("waitroom.Save: %w", err)
	}
	return seq, nil
}

// chunkTiers is the tiers column of a row of k tickets from offset off of
// a checkpoint's tiers: nil (NULL) when none of them has a tier.
func chunkTiers(tiers []byte, off int64, k int) *string {
	b := tierDigits(tiers, int(off), k)
	if bytes.Count(b, []byte{'0'}) == len(b) {
		return nil
	}
	s := string(b)
	return &s
}

// Load implements Durable.
func (d *PGDurable) Load(ctx context.Context, saleID int64) (queueState, []int64, []byte, bool, error) {
	st, found, err := d.Saved(ctx, saleID)
	if err != nil || !found {
		return st, nil, nil, found, err
	}
	rows, err := d.pool.Query(ctx, `SELECT first_ticket, users, tiers FROM queue_tickets
		WHERE sale_id = $1 AND first_ticket < $2 ORDER BY first_ticket`, saleID, st.Seq)
	if err != nil {
		return queueState{}, nil, nil, false, fmt.Errorf("waitroom.Load: %w", err)
	}
	users := make([]int64, 0, st.Seq)
	var tiers []byte // nil until a row has a tier
	var first int64
	var chunk []int64
	var chunkT *string
	_, err = pgx.ForEachRow(rows, []any{&first, &chunk, &chunkT}, func() error {
		if first != int64(len(users)) {
			return fmt.Errorf("tickets from %d missing (have %d)", len(users), first)
		}
		if chunkT != nil && tiers == nil {
			tiers = bytes.Repeat([]byte{'0'}, len(users))
		}
		users = append(users, chunk...)
		if tiers != nil {
			var t []byte
			if chunkT != nil {
				t = []byte(*chunkT)
			}
			tiers = append(tiers, tierDigits(t, 0, len(chunk))...)
		}
		return nil
	})
	if err != nil {
		return queueState{}, nil, nil, false, fmt.Errorf("waitroom.Load: %w", err)
	}
	if int64(len(users)) > st.Seq {
		users = users[:st.Seq]
		if tiers != nil {
			tiers = tiers[:st.Seq]
		}
	}
	st.Seq = int64(len(users))
	return st, users, tiers, true, nil
}
