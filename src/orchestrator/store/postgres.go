package store

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// schemaLock serialises schema creation between replicas starting at once
// (concurrent CREATE TABLE IF NOT EXISTS can collide in pg_type).
const schemaLock = 0x72756e776179 // "runway"

// OpenPostgres opens the store in the PostgreSQL database dsn names,
// creating the schema if needed. Errors never carry the DSN (it may hold
// a password).
func OpenPostgres(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(8)
	db.SetConnMaxIdleTime(time.Minute)
	s := &Store{db: db, pg: true, pgcfg: cfg}
	err = s.init(func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(schemaLock)); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, schema); err != nil {
			return err
		}
		for _, c := range addedColumns {
			if _, err := tx.ExecContext(ctx, `ALTER TABLE runners ADD COLUMN IF NOT EXISTS `+c.name+` `+c.def); err != nil {
				return err
			}
		}
		return tx.Commit()
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("state store (postgres): %w", err)
	}
	return s, nil
}

func parseDSN(dsn string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		// pgx's parse errors quote the DSN: say only that it is malformed.
		return nil, errors.New("state store (postgres): the DSN does not parse (see https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-CONNSTRING)")
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	return cfg, nil
}

// Leadership decides which replica acts for each group: the one holding
// the group's PostgreSQL session-level advisory lock. The database is the
// coordinator: a replica that dies (or whose session ends) loses its
// locks at once, and another one's next try takes them. All of one
// replica's locks live on one dedicated session, and every check is a
// query on that session (a pgx.Conn never reconnects by itself), so a
// replica that lost it cannot believe it still leads.
type Leadership struct {
	cfg *pgx.ConnConfig

	mu   sync.Mutex
	conn *pgx.Conn
	held map[string]bool
}

// leadershipApp names the leadership sessions (application_name), for
// EndOthers.
const leadershipApp = "runway-leadership"

// Leadership prepares leadership on the store's database; it connects on
// first use. Only for PostgreSQL.
func (s *Store) Leadership() *Leadership {
	cfg := s.pgcfg.Copy()
	cfg.RuntimeParams["application_name"] = leadershipApp
	return &Leadership{cfg: cfg}
}

// EndOthers ends every other leadership session of the database (the
// role may end its own sessions): a replica that an outside lease says
// no longer leads — frozen, its connection still up — loses its locks
// now, not when its connection dies. It answers how many it ended.
func (l *Leadership) EndOthers(ctx context.Context) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	own := uint32(0)
	if l.conn != nil {
		own = l.conn.PgConn().PID()
	}
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1 AND pid <> pg_backend_pid() AND pid <> $2) AS ended`,
		leadershipApp, int64(own)).Scan(&n)
	return n, err
}

// lockKey is the group's advisory lock id.
func lockKey(group string) int64 {
	h := fnv.New64a()
	h.Write([]byte("runway group " + group))
	return int64(h.Sum64())
}

// Lead reports whether this replica leads group now, taking the lead if
// no one holds it. An error means "not leading": the caller must not act.
func (l *Leadership) Lead(ctx context.Context, group string) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if l.conn == nil {
		c, err := pgx.ConnectConfig(ctx, l.cfg)
		if err != nil {
			return false, fmt.Errorf("leadership session: %w", err)
		}
		l.conn, l.held = c, map[string]bool{}
	}
	var ok bool
	var err error
	if l.held[group] {
		// The session that took the lock still answers: it still holds it.
		_, err = l.conn.Exec(ctx, `SELECT 1`)
		ok = err == nil
	} else {
		err = l.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, lockKey(group)).Scan(&ok)
	}
	if err != nil {
		l.dropLocked()
		return false, fmt.Errorf("leadership session: %w", err)
	}
	l.held[group] = ok
	return ok, nil
}

// dropLocked ends the session: every lock it held is released.
func (l *Leadership) dropLocked() {
	if l.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		l.conn.Close(ctx)
		cancel()
	}
	l.conn, l.held = nil, nil
}

// Close ends the session, releasing every group this replica led.
func (l *Leadership) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropLocked()
}

// Notify sends payload to every replica listening on channel.
func (s *Store) Notify(ctx context.Context, channel, payload string) error {
	if !s.pg {
		return nil
	}
	_, err := s.db.ExecContext(ctx, `SELECT pg_notify($1, $2)`, channel, payload)
	return err
}

// Listen calls fn with every payload sent on channel until ctx ends,
// reconnecting (after a pause) when its session is lost. Only for
// PostgreSQL.
func (s *Store) Listen(ctx context.Context, channel string, fn func(string), onErr func(error)) {
	if !s.pg {
		return
	}
	for ctx.Err() == nil {
		err := s.listen(ctx, channel, fn)
		if ctx.Err() != nil {
			return
		}
		onErr(err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (s *Store) listen(ctx context.Context, channel string, fn func(string)) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := pgx.ConnectConfig(cctx, s.pgcfg)
	cancel()
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		fn(n.Payload)
	}
}
