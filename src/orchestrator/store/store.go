// Package store is the orchestrator's durable state: every runner it ever
// intended to make, the stemcells it uploaded and each group's drain flag,
// in one SQLite file (modernc.org/sqlite, pure Go; the embedded default)
// or in PostgreSQL (pgx), which replicas share. A runner's row is written
// BEFORE create_vm is called, so a crash mid-call leaves a record to
// recover from rather than an orphan.
package store

import (
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Runner states.
const (
	Spawning = "spawning" // intent recorded; create_vm may be in flight
	Idle     = "idle"     // VM exists, runner has not taken a job yet
	Busy     = "busy"     // runner is running JobID
	Deleting = "deleting" // reap decided; VM (if any) still to delete
	Deleted  = "deleted"  // terminal; kept for history
)

// Runner is one row.
type Runner struct {
	Name          string
	Group         string
	AgentID       string
	VMCID         string
	State         string
	TriggerJob    int64 // the queued job it was spawned for (dedup)
	JobID         int64 // the job it actually took
	JobRepo       string
	ForgeRunnerID int64
	Reason        string // why it is being / was deleted
	LastError     string
	CreatedAt     time.Time
	StateAt       time.Time // when State last changed
	VMCheckedAt   time.Time // last has_vm
	// OnlineAt: when the runner was first seen online at the forge or
	// running a job; zero while it boots (never reaped before its spawn
	// timeout then).
	OnlineAt time.Time
}

// Active reports whether the runner counts toward capacity: its VM may
// exist.
func (r Runner) Active() bool { return r.State != Deleted }

// Unassigned reports whether the runner is supply for a queued job.
func (r Runner) Unassigned() bool { return r.State == Spawning || r.State == Idle }

// Store is the database.
type Store struct {
	db    *sql.DB
	pg    bool            // PostgreSQL: $n placeholders
	pgcfg *pgx.ConnConfig // PostgreSQL: for sessions of its own (LISTEN)
	path  string          // SQLite
	file  os.FileInfo     // SQLite: the file opened; a replaced or deleted one is noticed
	id    string
	fence func() error // SetFence
}

// SetFence makes every write ask fence first (an error refuses it): a
// process that may no longer act writes nothing.
func (s *Store) SetFence(fence func() error) { s.fence = fence }

// One schema for both databases: BIGINT is SQLite's INTEGER, and the
// upserts are the ON CONFLICT form both understand.

const schema = `
CREATE TABLE IF NOT EXISTS runners (
  name TEXT PRIMARY KEY,
  grp TEXT NOT NULL,
  agent_id TEXT NOT NULL,
  vm_cid TEXT NOT NULL DEFAULT '',
  state TEXT NOT NULL,
  trigger_job BIGINT NOT NULL DEFAULT 0,
  job_id BIGINT NOT NULL DEFAULT 0,
  job_repo TEXT NOT NULL DEFAULT '',
  forge_runner_id BIGINT NOT NULL DEFAULT 0,
  reason TEXT NOT NULL DEFAULT '',
  last_error TEXT NOT NULL DEFAULT '',
  created_at BIGINT NOT NULL,
  state_at BIGINT NOT NULL,
  vm_checked_at BIGINT NOT NULL DEFAULT 0,
  online_at BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runners_grp_state ON runners (grp, state);
CREATE TABLE IF NOT EXISTS stemcells (key TEXT PRIMARY KEY, cid TEXT NOT NULL, created_at BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS groups (name TEXT PRIMARY KEY, drained INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
`

// addedColumns came after the first schema: stores made before get them
// by ALTER TABLE (SQLite has no ADD COLUMN IF NOT EXISTS).
var addedColumns = []struct{ name, def string }{{"online_at", "BIGINT NOT NULL DEFAULT 0"}}

func sqliteMigrate(db *sql.DB) error {
	for _, c := range addedColumns {
		var n int
		if err := db.QueryRow(`SELECT COUNT(*) FROM pragma_table_info('runners') WHERE name = ?`, c.name).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			if _, err := db.Exec(`ALTER TABLE runners ADD COLUMN ` + c.name + ` ` + c.def); err != nil {
				return err
			}
		}
	}
	return nil
}

// Open opens (creating if needed) the SQLite database at path.
func Open(path string) (*Store, error) {
	dsn := "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("state store %s: %w", path, err)
	}
	// One writer connection: SQLite serialises writes anyway, and one
	// connection means no SQLITE_BUSY between our own goroutines.
	db.SetMaxOpenConns(1)
	s := &Store{db: db, path: path}
	create := func() error {
		if _, err := db.Exec(schema); err != nil {
			return err
		}
		return sqliteMigrate(db)
	}
	if err := s.init(create); err != nil {
		db.Close()
		return nil, fmt.Errorf("state store %s: %w", path, err)
	}
	if s.file, err = os.Stat(path); err != nil {
		db.Close()
		return nil, fmt.Errorf("state store %s: %w", path, err)
	}
	return s, nil
}

// init creates the schema and reads (or makes) the store's identity: VMs
// are tagged with it, so a store made anew (the old one deleted) never
// takes the old one's VMs for strays.
func (s *Store) init(create func() error) error {
	if err := create(); err != nil {
		return err
	}
	if _, err := s.exec(`INSERT INTO meta (k, v) VALUES ('store_id', ?) ON CONFLICT (k) DO NOTHING`, uuid.NewString()); err != nil {
		return err
	}
	return s.db.QueryRow(`SELECT v FROM meta WHERE k = 'store_id'`).Scan(&s.id)
}

// rebind turns ? placeholders into PostgreSQL's $n (no query here has a
// literal question mark).
func (s *Store) rebind(q string) string {
	if !s.pg {
		return q
	}
	var b strings.Builder
	n := 0
	for _, c := range q {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

func (s *Store) exec(q string, args ...any) (sql.Result, error) {
	if s.fence != nil {
		if err := s.fence(); err != nil {
			return nil, err
		}
	}
	return s.db.Exec(s.rebind(q), args...)
}

func (s *Store) query(q string, args ...any) (*sql.Rows, error) {
	return s.db.Query(s.rebind(q), args...)
}

func (s *Store) queryRow(q string, args ...any) *sql.Row { return s.db.QueryRow(s.rebind(q), args...) }

// ID is the store's identity, made with the file.
func (s *Store) ID() string { return s.id }

// Check reports whether the store is still the database it opened:
// for SQLite the same readable file (a database deleted or replaced under
// a running daemon keeps answering from the open descriptor, and
// everything written from then on is lost); for PostgreSQL a database
// that answers with the same store id (not one recreated empty).
func (s *Store) Check() error {
	where := s.path
	if s.pg {
		where = "(postgres)"
	} else {
		now, err := os.Stat(s.path)
		if err != nil {
			return fmt.Errorf("state store %s: %w", s.path, err)
		}
		if !os.SameFile(s.file, now) {
			return fmt.Errorf("state store %s was replaced by another file", s.path)
		}
		f, err := os.Open(s.path)
		if err != nil {
			return fmt.Errorf("state store %s: %w", s.path, err)
		}
		f.Close()
	}
	var id string
	if err := s.db.QueryRow(`SELECT v FROM meta WHERE k = 'store_id'`).Scan(&id); err != nil {
		return fmt.Errorf("state store %s: %w", where, err)
	}
	if id != s.id {
		return fmt.Errorf("state store %s is another store now (id %s, opened as %s)", where, id, s.id)
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMilli(v)
}

// Save inserts or replaces a runner row (durably, before returning).
func (s *Store) Save(r Runner) error {
	_, err := s.exec(`INSERT INTO runners (name, grp, agent_id, vm_cid, state, trigger_job, job_id, job_repo,
		forge_runner_id, reason, last_error, created_at, state_at, vm_checked_at, online_at)
		VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
		ON CONFLICT(name) DO UPDATE SET grp=excluded.grp, agent_id=excluded.agent_id, vm_cid=excluded.vm_cid,
		state=excluded.state, trigger_job=excluded.trigger_job, job_id=excluded.job_id, job_repo=excluded.job_repo,
		forge_runner_id=excluded.forge_runner_id, reason=excluded.reason, last_error=excluded.last_error,
		state_at=excluded.state_at, vm_checked_at=excluded.vm_checked_at, online_at=excluded.online_at`,
		r.Name, r.Group, r.AgentID, r.VMCID, r.State, r.TriggerJob, r.JobID, r.JobRepo, r.ForgeRunnerID,
		r.Reason, r.LastError, ms(r.CreatedAt), ms(r.StateAt), ms(r.VMCheckedAt), ms(r.OnlineAt))
	if err != nil {
		return fmt.Errorf("saving runner %s: %w", r.Name, err)
	}
	return nil
}

const cols = `name, grp, agent_id, vm_cid, state, trigger_job, job_id, job_repo, forge_runner_id, reason,
	last_error, created_at, state_at, vm_checked_at, online_at`

func scan(rows *sql.Rows) ([]Runner, error) {
	defer rows.Close()
	var out []Runner
	for rows.Next() {
		var r Runner
		var c, sa, vc, on int64
		if err := rows.Scan(&r.Name, &r.Group, &r.AgentID, &r.VMCID, &r.State, &r.TriggerJob, &r.JobID, &r.JobRepo,
			&r.ForgeRunnerID, &r.Reason, &r.LastError, &c, &sa, &vc, &on); err != nil {
			return nil, err
		}
		r.CreatedAt, r.StateAt, r.VMCheckedAt, r.OnlineAt = fromMS(c), fromMS(sa), fromMS(vc), fromMS(on)
		out = append(out, r)
	}
	return out, rows.Err()
}

// Active lists a group's runners that are not deleted ("" = every group).
func (s *Store) Active(group string) ([]Runner, error) {
	q, args := `SELECT `+cols+` FROM runners WHERE state != ?`, []any{Deleted}
	if group != "" {
		q += ` AND grp = ?`
		args = append(args, group)
	}
	rows, err := s.query(q+` ORDER BY created_at, name`, args...)
	if err != nil {
		return nil, err
	}
	return scan(rows)
}

// All lists every runner, newest first, up to limit.
func (s *Store) All(limit int) ([]Runner, error) {
	rows, err := s.query(`SELECT `+cols+` FROM runners ORDER BY created_at DESC, name LIMIT ?`, limit)
	if err != nil {
		return nil, err
	}
	return scan(rows)
}

// Get returns one runner.
func (s *Store) Get(name string) (Runner, error) {
	rows, err := s.query(`SELECT `+cols+` FROM runners WHERE name = ?`, name)
	if err != nil {
		return Runner{}, err
	}
	rs, err := scan(rows)
	if err != nil {
		return Runner{}, err
	}
	if len(rs) == 0 {
		return Runner{}, ErrNotFound
	}
	return rs[0], nil
}

// ErrNotFound is returned by Get for an unknown name.
var ErrNotFound = errors.New("not found")

// Purge drops deleted rows older than before.
func (s *Store) Purge(before time.Time) (int64, error) {
	res, err := s.exec(`DELETE FROM runners WHERE state = ? AND state_at < ?`, Deleted, ms(before))
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Stemcell returns the CID recorded for key.
func (s *Store) Stemcell(key string) (string, bool, error) {
	var cid string
	err := s.queryRow(`SELECT cid FROM stemcells WHERE key = ?`, key).Scan(&cid)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	return cid, err == nil, err
}

// PutStemcell records an uploaded stemcell and returns the CID the store
// keeps for key: another replica's, when it recorded one first.
func (s *Store) PutStemcell(key, cid string) (string, error) {
	if _, err := s.exec(`INSERT INTO stemcells (key, cid, created_at) VALUES (?,?,?) ON CONFLICT (key) DO NOTHING`,
		key, cid, ms(time.Now())); err != nil {
		return "", err
	}
	var kept string
	err := s.queryRow(`SELECT cid FROM stemcells WHERE key = ?`, key).Scan(&kept)
	return kept, err
}

// SetDrained records a group's drain flag.
func (s *Store) SetDrained(group string, drained bool) error {
	v := 0
	if drained {
		v = 1
	}
	_, err := s.exec(`INSERT INTO groups (name, drained) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET drained = excluded.drained`, group, v)
	return err
}

// Drained reads a group's drain flag.
func (s *Store) Drained(group string) (bool, error) {
	var v int
	err := s.queryRow(`SELECT drained FROM groups WHERE name = ?`, group).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return v == 1, err
}

// Meta reads a value kept under key ("" when there is none). The
// store's id lives there too; callers keep to keys of their own.
func (s *Store) Meta(key string) (string, error) {
	var v string
	err := s.queryRow(`SELECT v FROM meta WHERE k = ?`, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return v, err
}

// SetMeta keeps v under key ("" removes it).
func (s *Store) SetMeta(key, v string) error {
	if key == "store_id" {
		return errors.New("store: the store id is not set by SetMeta")
	}
	var err error
	if v == "" {
		_, err = s.exec(`DELETE FROM meta WHERE k = ?`, key)
	} else {
		_, err = s.exec(`INSERT INTO meta (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v`, key, v)
	}
	return err
}
