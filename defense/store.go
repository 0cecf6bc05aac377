package defense

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/lua"
)

// settingsLock is the advisory lock that serializes settings changes.
const settingsLock = 4_263_001

// Audit actions.
const (
	ActionPut    = "settings.put"
	ActionPreset = "settings.preset"
)

// AuditEntry is one settings change. Body is {"before": Settings, "after":
// Settings} (plus "preset" for ActionPreset).
type AuditEntry struct {
	ID     int64           `json:"id"`
	At     time.Time       `json:"at"`
	Actor  string          `json:"actor"`
	Action string          `json:"action"`
	Body   json.RawMessage `json:"body"`
}

// Store keeps the settings in PostgreSQL (table settings, one row with a
// version), writes an audit_log row for every change in the same
// transaction, and announces each change on Redis (lua.SettingsChannel,
// payload: the new version).
type Store struct {
	pool   *pgxpool.Pool
	rdb    redis.UniversalClient
	logger *slog.Logger
}

// NewStore returns a Store. rdb may be nil (no announcements; gateways
// then see changes by polling); logger may be nil.
func NewStore(pool *pgxpool.Pool, rdb redis.UniversalClient, logger *slog.Logger) *Store {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Store{pool: pool, rdb: rdb, logger: logger.With("component", "defense")}
}

// Get returns the stored settings with their Version, or DefaultSettings
// (Version 0, preset "normal") when none were ever stored.
func (s *Store) Get(ctx context.Context) (_ Settings, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	st, err := s.get(ctx, s.pool)
	if err != nil {
		return Settings{}, fmt.Errorf("defense.Store.Get: %w", err)
	}
	return st, nil
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (s *Store) get(ctx context.Context, q querier) (Settings, error) {
	var (
		body    []byte
		version int64
	)
	err := q.QueryRow(ctx, `SELECT body, version FROM settings WHERE id = 1`).Scan(&body, &version)
	if errors.Is(err, pgx.ErrNoRows) {
		st := DefaultSettings()
		st.Preset = PresetNormal
		return st, nil
	}
	if err != nil {
		return Settings{}, err
	}
	st, err := decodeSettings(body, false)
	if err != nil {
		return Settings{}, fmt.Errorf("stored settings: %w", err)
	}
	if err := st.normalize(); err != nil {
		return Settings{}, fmt.Errorf("stored settings: %w", err)
	}
	st.Version = version
	return st, nil
}

// Version returns the stored version (0: none stored); Guard.Run polls it.
func (s *Store) Version(ctx context.Context) (_ int64, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	var v int64
	err = s.pool.QueryRow(ctx, `SELECT version FROM settings WHERE id = 1`).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("defense.Store.Version: %w", err)
	}
	return v, nil
}

// Put validates and stores st as the whole new settings (Preset and Version
// in st are ignored: the preset name is derived from the knobs), records
// the change in the audit log as actor, and announces it. It returns the
// stored settings. Invalid settings are an INVALID *flashsale.Error naming
// the field.
func (s *Store) Put(ctx context.Context, actor string, st Settings) (_ Settings, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	return s.PutIf(ctx, actor, -1, st)
}

// errConflict: the settings changed since the operator read them.
var errConflict = &flashsale.Error{Code: flashsale.CodeVersionConflict,
	Message: "the settings were changed by someone else since you read them; nothing changed (the current settings are in \"current\")"}

// PutIf is Put applied only while the stored version is ifVersion (the
// defaults, never stored, are version 0; negative: any version, as Put):
// VERSION_CONFLICT otherwise, nothing changed.
// The check runs under the lock that serializes changes, so of two writes
// naming one version exactly one applies.
func (s *Store) PutIf(ctx context.Context, actor string, ifVersion int64, st Settings) (_ Settings, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	st = st.clone()
	st.Preset, st.Version = "", 0
	if err := st.normalize(); err != nil {
		return Settings{}, err
	}
	st.Preset = presetName(st)
	out, err := s.write(ctx, actor, ActionPut, "", ifVersion, func(Settings) Settings { return st })
	if flashsale.ErrorCode(err) == flashsale.CodeVersionConflict {
		return Settings{}, err
	}
	if err != nil {
		return Settings{}, fmt.Errorf("defense.Store.Put: %w", err)
	}
	return out, nil
}

// ApplyPreset switches every knob to the named preset, keeping the
// blocklist. An unknown name is a NOT_FOUND *flashsale.Error.
func (s *Store) ApplyPreset(ctx context.Context, actor, name string) (_ Settings, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	p, ok := Presets()[name]
	if !ok {
		names := []string{PresetDrop, PresetNormal, PresetUnderAttack}
		return Settings{}, flashsale.Errorf(flashsale.CodeNotFound, "preset: %q is not one of %s", truncate(name, 40), strings.Join(names, ", "))
	}
	out, err := s.write(ctx, actor, ActionPreset, name, -1, func(before Settings) Settings {
		st := p.clone()
		st.Blocklist = before.Blocklist
		return st
	})
	if err != nil {
		return Settings{}, fmt.Errorf("defense.Store.ApplyPreset: %w", err)
	}
	return out, nil
}

// write runs one serialized change: read the current settings, compute the
// new ones, store them with version+1 and an audit entry, commit, announce.
func (s *Store) write(ctx context.Context, actor, action, preset string, ifVersion int64, next func(before Settings) Settings) (Settings, error) {
	actor = strings.TrimSpace(actor)
	if actor == "" || len(actor) > 200 {
		return Settings{}, flashsale.Errorf(flashsale.CodeInvalid, "actor: required (the operator's user id)")
	}
	var out Settings
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, settingsLock); err != nil {
			return err
		}
		before, err := s.get(ctx, tx)
		if err != nil {
			return err
		}
		if ifVersion >= 0 && before.Version != ifVersion {
			return errConflict
		}
		after := next(before)
		after.Version = 0
		body, err := json.Marshal(after)
		if err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `
			INSERT INTO settings (id, body, version, updated_at, updated_by)
			VALUES (1, $1, 1, now(), $2)
			ON CONFLICT (id) DO UPDATE
			SET body = EXCLUDED.body, version = settings.version + 1,
			    updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by
			RETURNING version`, body, actor).Scan(&after.Version); err != nil {
			return err
		}
		audit := map[string]any{"before": before, "after": after}
		if preset != "" {
			audit["preset"] = preset
		}
		ab, err := json.Marshal(audit)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO audit_log (actor, action, body) VALUES ($1, $2, $3)`, actor, action, ab); err != nil {
			return err
		}
		out = after
		return nil
	})
	if err != nil {
		return Settings{}, err
	}
	s.announce(ctx, out.Version)
	return out, nil
}

// announce publishes the new version. A failure is only logged: gateways
// poll the version and catch up within a poll interval.
func (s *Store) announce(ctx context.Context, version int64) {
	if s.rdb == nil {
		return
	}
	if err := s.rdb.Publish(ctx, lua.SettingsChannel, strconv.FormatInt(version, 10)).Err(); err != nil {
		s.logger.Warn("settings change not announced; gateways will poll it", "version", version, "err", err)
	}
}

// Audit returns up to limit audit entries, newest first (limit ≤ 0: 50,
// at most 1000).
func (s *Store) Audit(ctx context.Context, limit int) (_ []AuditEntry, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	if limit <= 0 {
		limit = 50
	}
	limit = min(limit, 1000)
	rows, err := s.pool.Query(ctx, `SELECT id, at, actor, action, body FROM audit_log ORDER BY id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("defense.Store.Audit: %w", err)
	}
	entries, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var e AuditEntry
		var body []byte
		if err := r.Scan(&e.ID, &e.At, &e.Actor, &e.Action, &body); err != nil {
			return e, err
		}
		e.At = e.At.UTC()
		e.Body = body
		return e, nil
	})
	if err != nil {
		return nil, fmt.Errorf("defense.Store.Audit: %w", err)
	}
	return entries, nil
}

// JSONStore is a Store that speaks JSON documents, for an HTTP layer that
// passes bodies through (the gateway's SettingsStore). Put parses the body
// with ParseSettings (unknown fields and bad values: INVALID naming the
// field); Audit answers a JSON array of AuditEntry, newest first.
type JSONStore struct{ Store *Store }

// JSON returns s as a JSONStore.
func (s *Store) JSON() JSONStore { return JSONStore{Store: s} }

// Get returns the stored settings document.
func (j JSONStore) Get(ctx context.Context) (json.RawMessage, error) {
	st, err := j.Store.Get(ctx)
	if err != nil {
		return nil, err
	}
	return marshalRaw(st)
}

// Put validates and stores a settings document; it returns the stored one.
func (j JSONStore) Put(ctx context.Context, actor string, body json.RawMessage) (json.RawMessage, error) {
	return j.PutIf(ctx, actor, -1, body)
}

// PutIf is Put while the stored version is ifVersion (Store.PutIf).
func (j JSONStore) PutIf(ctx context.Context, actor string, ifVersion int64, body json.RawMessage) (json.RawMessage, error) {
	st, err := ParseSettings(body)
	if err != nil {
		return nil, err
	}
	out, err := j.Store.PutIf(ctx, actor, ifVersion, st)
	if err != nil {
		return nil, err
	}
	return marshalRaw(out)
}

// ApplyPreset applies a named preset and returns the stored document.
func (j JSONStore) ApplyPreset(ctx context.Context, actor, name string) (json.RawMessage, error) {
	out, err := j.Store.ApplyPreset(ctx, actor, name)
	if err != nil {
		return nil, err
	}
	return marshalRaw(out)
}

// Audit returns a JSON array of up to limit entries, newest first.
func (j JSONStore) Audit(ctx context.Context, limit int) (json.RawMessage, error) {
	es, err := j.Store.Audit(ctx, limit)
	if err != nil {
		return nil, err
	}
	if es == nil {
		es = []AuditEntry{}
	}
	return marshalRaw(es)
}

func marshalRaw(v any) (json.RawMessage, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("defense: marshal: %w", err)
	}
	return b, nil
}
