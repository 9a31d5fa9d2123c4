package store

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/runway-cpi/runway/src/testkit/pgtest"
)

// backends runs one test against each database the store supports; open
// opens (again) the same store.
func backends(t *testing.T, test func(t *testing.T, open func() *Store)) {
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "runway.db")
		test(t, func() *Store {
			s, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			return s
		})
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := pgtest.Database(t)
		test(t, func() *Store {
			s, err := OpenPostgres(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			return s
		})
	})
}

func TestRunnersSurviveReopen(t *testing.T) {
	backends(t, func(t *testing.T, open func() *Store) {
		s := open()
		id := s.ID()
		now := time.UnixMilli(time.Now().UnixMilli())
		r := Runner{Name: "g-1", Group: "g", AgentID: "g-1", State: Spawning, TriggerJob: 1 << 40, JobRepo: "acme/app",
			ForgeRunnerID: 1<<33 + 7, CreatedAt: now, StateAt: now}
		if err := s.Save(r); err != nil {
			t.Fatal(err)
		}
		r.State, r.VMCID, r.VMCheckedAt, r.OnlineAt = Idle, "vm-1", now.Add(time.Second), now.Add(2*time.Second)
		if err := s.Save(r); err != nil {
			t.Fatal(err)
		}
		if err := s.Save(Runner{Name: "g-2", Group: "g", AgentID: "g-2", State: Deleted, CreatedAt: now, StateAt: now.Add(-48 * time.Hour)}); err != nil {
			t.Fatal(err)
		}
		if err := s.Save(Runner{Name: "h-1", Group: "h", AgentID: "h-1", State: Busy, CreatedAt: now.Add(time.Minute), StateAt: now}); err != nil {
			t.Fatal(err)
		}
		if err := s.SetDrained("g", true); err != nil {
			t.Fatal(err)
		}
		s.Close()

		s = open()
		defer s.Close()
		if s.ID() != id {
			t.Errorf("store id changed on reopen: %s, was %s", s.ID(), id)
		}
		got, err := s.Get("g-1")
		if err != nil || got != r {
			t.Fatalf("after reopen: %+v (%v), want %+v", got, err, r)
		}
		active, _ := s.Active("g")
		if len(active) != 1 || active[0].Name != "g-1" {
			t.Errorf("active in g: %+v", active)
		}
		if all, _ := s.Active(""); len(all) != 2 || all[0].Name != "g-1" || all[1].Name != "h-1" {
			t.Errorf("active everywhere, oldest first: %+v", all)
		}
		if rs, _ := s.All(1); len(rs) != 1 || rs[0].Name != "h-1" {
			t.Errorf("All(1), newest first: %+v", rs)
		}
		if d, _ := s.Drained("g"); !d {
			t.Error("drain flag lost")
		}
		if d, _ := s.Drained("h"); d {
			t.Error("h drained without being asked")
		}
		if n, _ := s.Purge(now.Add(-24 * time.Hour)); n != 1 {
			t.Errorf("purged %d", n)
		}
		if _, err := s.Get("g-2"); err != ErrNotFound {
			t.Errorf("purged row: %v", err)
		}
		if err := s.Check(); err != nil {
			t.Errorf("Check on a sound store: %v", err)
		}
	})
}

// A store made before a column was added opens with it added, its rows
// kept: runway.db files and PostgreSQL databases outlive upgrades.
func TestOldStoreGainsAddedColumns(t *testing.T) {
	old := schema
	for _, c := range addedColumns {
		old = strings.Replace(old, ",\n  "+c.name+" "+c.def, "", 1)
	}
	if old == schema {
		t.Fatal("the test's old schema is the current one")
	}
	const row = `INSERT INTO runners (name, grp, agent_id, state, created_at, state_at) VALUES ('g-1', 'g', 'g-1', 'idle', 1, 1)`
	check := func(t *testing.T, s *Store) {
		defer s.Close()
		r, err := s.Get("g-1")
		if err != nil || r.State != Idle || !r.OnlineAt.IsZero() {
			t.Fatalf("the old row: %+v (%v)", r, err)
		}
		r.OnlineAt = time.UnixMilli(5000)
		if err := s.Save(r); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Get("g-1"); !got.OnlineAt.Equal(r.OnlineAt) {
			t.Errorf("online_at after save: %v", got.OnlineAt)
		}
	}
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "runway.db")
		db, err := sql.Open("sqlite", path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(old + row); err != nil {
			t.Fatal(err)
		}
		db.Close()
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		check(t, s)
		// Opened again: the column is there, nothing to add.
		s, err = Open(path)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := pgtest.Database(t)
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		db := stdlib.OpenDB(*cfg)
		if _, err := db.Exec(old); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(row); err != nil {
			t.Fatal(err)
		}
		db.Close()
		s, err := OpenPostgres(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		check(t, s)
	})
}

// Two replicas uploading the same image: the first record stands, and
// the second learns which CID to use (and that its own is spare).
func TestFirstStemcellRecordWins(t *testing.T) {
	backends(t, func(t *testing.T, open func() *Store) {
		s := open()
		defer s.Close()
		if _, ok, err := s.Stemcell("k"); ok || err != nil {
			t.Fatalf("empty store has a stemcell: %v %v", ok, err)
		}
		if kept, err := s.PutStemcell("k", "sc-1"); err != nil || kept != "sc-1" {
			t.Fatalf("first record: %q %v", kept, err)
		}
		if kept, err := s.PutStemcell("k", "sc-2"); err != nil || kept != "sc-1" {
			t.Fatalf("second record: kept %q (%v), want sc-1", kept, err)
		}
		if cid, ok, _ := s.Stemcell("k"); !ok || cid != "sc-1" {
			t.Errorf("stemcell k = %q", cid)
		}
	})
}

// A PostgreSQL database emptied and re-made under a running daemon is
// another store: Check says so, so the daemon stops acting.
func TestCheckNoticesAnotherPostgresStore(t *testing.T) {
	s, dsn := openPostgres(t)
	s2, err := OpenPostgres(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	if s2.ID() != s.ID() {
		t.Fatalf("two opens of one database: ids %s and %s", s.ID(), s2.ID())
	}
	s2.Close()
	if _, err := s.db.Exec(`DROP TABLE meta`); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(); err == nil {
		t.Fatal("Check passed with the meta table gone")
	}
	if s3, err := OpenPostgres(context.Background(), dsn); err != nil {
		t.Fatal(err)
	} else {
		s3.Close()
	}
	if err := s.Check(); err == nil {
		t.Fatal("Check passed on a store made anew")
	}
}

func TestOpenPostgresErrorsKeepTheDSNSecret(t *testing.T) {
	for _, dsn := range []string{"postgres://runway:s3cr3t-pw@127.0.0.1:1/x?sslmode=disable&connect_timeout=2", "postgres://runway:s3cr3t-pw@[::1"} {
		_, err := OpenPostgres(context.Background(), dsn)
		if err == nil {
			t.Fatalf("%q opened", dsn)
		}
		if msg := err.Error(); strings.Contains(msg, "s3cr3t-pw") {
			t.Errorf("error shows the password: %s", msg)
		}
	}
}

// openPostgres opens a store on a database of its own, closed when the
// test ends; dsn is the database's.
func openPostgres(t *testing.T) (s *Store, dsn string) {
	dsn = pgtest.Database(t)
	s, err := OpenPostgres(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dsn
}

func mustConfig(t *testing.T, dsn string) *pgx.ConnConfig {
	c, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// One replica leads a group at a time; a lead ends with its session
// (closed, or ended by the server), and then another replica takes it.
func TestLeadershipIsExclusiveAndEndsWithTheSession(t *testing.T) {
	ctx := context.Background()
	st, dsn := openPostgres(t)
	a := st.Leadership()
	defer a.Close()
	b := st.Leadership()
	defer b.Close()
	lead := func(l *Leadership, g string) bool {
		t.Helper()
		ok, err := l.Lead(ctx, g)
		if err != nil {
			t.Fatalf("Lead(%s): %v", g, err)
		}
		return ok
	}
	if !lead(a, "g") || lead(b, "g") {
		t.Fatal("g: want a leading, b not")
	}
	if !lead(b, "h") || lead(a, "h") {
		t.Fatal("h: want b leading, a not")
	}
	if !lead(a, "g") || lead(b, "g") {
		t.Fatal("g, asked again: want a still leading, b not")
	}
	// A session's locks go when the server has ended it, a moment after
	// the client closed it: wait for that, as a standby's next try would.
	eventuallyLead := func(l *Leadership, g string) bool {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if lead(l, g) {
				return true
			}
		}
		return false
	}
	a.Close()
	if !eventuallyLead(b, "g") {
		t.Fatal("b does not take g once a closed")
	}
	// The server ends b's session (an administrator, a failover): b no
	// longer leads, and says so on its next check rather than acting.
	a2 := st.Leadership()
	defer a2.Close()
	if lead(a2, "g") {
		t.Fatal("a2 leads g while b holds it")
	}
	db := sql.OpenDB(stdlib.GetConnector(*mustConfig(t, dsn)))
	defer db.Close()
	// With a timeout, pg_terminate_backend waits for the session to end.
	if _, err := db.Exec(`SELECT pg_terminate_backend($1, 10000)`, b.conn.PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Lead(ctx, "g"); ok || err == nil {
		t.Fatalf("b after its session ended: leads=%v err=%v, want false and an error", ok, err)
	}
	if !lead(a2, "g") {
		t.Fatal("a2 does not take g after b's session ended")
	}
	if lead(b, "g") {
		t.Fatal("b, reconnected, leads g again while a2 holds it")
	}
}

func TestNotifyReachesListeners(t *testing.T) {
	s, _ := openPostgres(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan string, 10)
	listening := make(chan struct{})
	go s.Listen(ctx, "runway_test", func(p string) { got <- p }, func(err error) { t.Errorf("listen: %v", err) })
	// LISTEN takes effect asynchronously: notify until one arrives.
	go func() {
		defer close(listening)
		for i := 0; ctx.Err() == nil; i++ {
			if err := s.Notify(ctx, "runway_test", "hello"); err != nil && ctx.Err() == nil {
				t.Errorf("notify: %v", err)
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	select {
	case p := <-got:
		if p != "hello" {
			t.Errorf("payload %q", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notification within 10 s")
	}
	cancel()
	<-listening
}

// Values kept under a key (a scale set's session id) survive a reopen,
// are replaced and removed; the store id is not theirs to change.
func TestMetaValues(t *testing.T) {
	backends(t, func(t *testing.T, open func() *Store) {
		s := open()
		if v, err := s.Meta("scale_set_session/g"); err != nil || v != "" {
			t.Fatalf("unset: %q, %v", v, err)
		}
		for _, v := range []string{"7 sess-a", "7 sess-b"} {
			if err := s.SetMeta("scale_set_session/g", v); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.SetMeta("store_id", "x"); err == nil {
			t.Error("the store id was replaced")
		}
		s.Close()
		s = open()
		defer s.Close()
		if v, _ := s.Meta("scale_set_session/g"); v != "7 sess-b" {
			t.Errorf("after reopen: %q", v)
		}
		s.SetMeta("scale_set_session/g", "")
		if v, _ := s.Meta("scale_set_session/g"); v != "" {
			t.Errorf("after removal: %q", v)
		}
	})
}

// A replica frozen while it leads (SIGSTOP) keeps its session, and with
// it its groups, for as long as its connection lives. The replica an
// outside lease chose ends every other leadership session: it leads at
// once, and the frozen one, resumed, finds it leads nothing.
func TestEndOthersTakesAFrozenLeadersGroups(t *testing.T) {
	ctx := context.Background()
	st, _ := openPostgres(t)
	frozen, next := st.Leadership(), st.Leadership()
	defer frozen.Close()
	defer next.Close()
	if ok, err := frozen.Lead(ctx, "g"); !ok || err != nil {
		t.Fatalf("frozen: %v %v", ok, err)
	}
	if ok, _ := next.Lead(ctx, "g"); ok {
		t.Fatal("next leads g while the frozen one's session holds it")
	}
	n, err := next.EndOthers(ctx)
	if err != nil || n != 1 {
		t.Fatalf("EndOthers: %d %v, want 1 session ended", n, err)
	}
	led := false
	for deadline := time.Now().Add(10 * time.Second); !led && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		led, _ = next.Lead(ctx, "g")
	}
	if !led {
		t.Fatal("next does not lead g after ending the frozen one's session")
	}
	if ok, err := frozen.Lead(ctx, "g"); ok || err == nil {
		t.Fatalf("the frozen one, resumed: leads=%v err=%v, want false and an error", ok, err)
	}
}
