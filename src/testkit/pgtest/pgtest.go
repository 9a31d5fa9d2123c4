// Package pgtest gives a test its own PostgreSQL database on the server
// RUNWAY_TEST_POSTGRES_DSN names (scripts/postgres-dev starts one; under
// scripts/test a missing server fails the test instead of skipping it).
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// Var names the admin DSN.
const Var = "RUNWAY_TEST_POSTGRES_DSN"

// Database creates an empty database for the test, dropped when it ends,
// and returns its DSN.
func Database(t testing.TB) string {
	t.Helper()
	admin := testenv.Need(t, "start one with scripts/postgres-dev start; export "+Var+"=$(cat /var/tmp/runway-postgres-dev/dsn)", Var)[0]
	cfg, err := pgx.ParseConfig(admin)
	if err != nil {
		t.Fatalf("%s does not parse", Var)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connecting to %s: %v", Var, err)
	}
	defer conn.Close(context.Background())
	b := make([]byte, 6)
	rand.Read(b)
	name := "runway_test_" + hex.EncodeToString(b)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("creating database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Errorf("dropping test database: %v", err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("dropping test database: %v", err)
		}
	})
	own := *cfg
	own.Database = name
	return dsn(&own)
}

// dsn renders a URL DSN for cfg's server and database.
func dsn(cfg *pgx.ConnConfig) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(cfg.User, cfg.Password),
		Host: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), Path: "/" + cfg.Database, RawQuery: "sslmode=disable"}
	return u.String()
}
