package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/orchestrator/httpapi"
)

// daemonLogging is a long-running command's logger (to stderr, at the
// configured level), the redactor of its outputs, and its own fields.
func daemonLogging(level string) (logging.Logger, *logging.Redactor, logging.Fields, error) {
	l, err := logging.Level(level)
	if err != nil {
		return nil, nil, logging.Fields{}, err
	}
	logger, redact := logging.New(l, os.Stderr)
	return logger, redact, logging.Fields{Logger: logger, Tag: "runway"}, nil
}

func serveCmd(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfgPath := fs.String("config", "runway.yml", "orchestrator config (YAML)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := config.LoadConfig(*cfgPath)
	if err != nil {
		return err
	}
	logger, redact, log, err := daemonLogging(cfg.LogLevel)
	if err != nil {
		return err
	}
	metrics := orchestrator.NewMetrics()
	fcs, err := forges(cfg, metrics, redact, logging.Fields{Logger: logger, Tag: "orchestrator"})
	if err != nil {
		return err
	}
	o, err := orchestrator.New(cfg, orchestrator.Options{Logger: logger, Redactor: redact, Forges: fcs, Metrics: metrics})
	if err != nil {
		return err
	}
	defer o.Close()
	h, err := httpapi.Handler(o, cfg, logging.Fields{Logger: logger, Tag: "orchestrator"}, redact, nil)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	addr := ln.Addr().String()
	// The CLI finds the daemon here when listen uses port 0.
	if err := os.WriteFile(filepath.Join(cfg.StateDir, "listen.addr"), []byte(addr+"\n"), 0o600); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- httpapi.Serve(ctx, cfg.HTTP, ln, h, metrics); stop() }()
	log.Info("runway serve", "listen", addr, "groups", len(cfg.Groups), "forges", len(cfg.Forges), "state_dir", cfg.StateDir)
	err = o.Run(ctx)
	if serr := <-served; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = fmt.Errorf("http server: %w", serr)
	}
	log.Info("runway serve stopped")
	return err
}

// checkCmd asks the forges with the config's tokens for everything the
// groups will need (no daemon, no state dir needed).
func checkCmd(args []string) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	cfgPath := fs.String("config", "runway.yml", "orchestrator config (YAML)")
	if err := parseAnywhere(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("usage: runway check [-config runway.yml] (unexpected %q)", fs.Args())
	}
	cfg, err := config.LoadConfig(*cfgPath)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	redact := &logging.Redactor{} // the tokens, once read
	fcs, err := forges(cfg, nil, redact, logging.Fields{Logger: logging.Discard()})
	if err != nil {
		return fmt.Errorf("check failed:\n%s", redact.Redact(err.Error()))
	}
	if err := orchestrator.Check(ctx, cfg, orchestrator.Options{Forges: fcs}); err != nil {
		return fmt.Errorf("check failed:\n%s", redact.Redact(err.Error()))
	}
	fmt.Printf("ok: %d groups on %d forges can list jobs and runners, register runners and check finished jobs\n", len(cfg.Groups), len(cfg.Forges))
	return nil
}

// daemon finds the running daemon's address and admin token from the
// config (or -addr).
type daemon struct {
	addr, token string
}

// connect adds -config and -addr to a command's flags, parses args and
// finds the daemon.
// connect parses a client command's flags (its own, then -config and
// -addr), wants nargs positional arguments (usage names them) and finds
// the daemon.
func connect(fs *flag.FlagSet, args []string, nargs int, usage string) (*daemon, error) {
	cfg := fs.String("config", "runway.yml", "orchestrator config (YAML)")
	addr := fs.String("addr", "", "daemon address (default: from the config)")
	if err := parseAnywhere(fs, args); err != nil {
		return nil, err
	}
	if fs.NArg() != nargs {
		return nil, fmt.Errorf("usage: runway %s [-config runway.yml] [-addr host:port] (got %d arguments: %q)", usage, fs.NArg(), fs.Args())
	}
	return findDaemon(*cfg, *addr)
}

// parseAnywhere parses flags before, between and after the positional
// arguments (`runway drain e2e -config X` as well as `runway drain
// -config X e2e`); the flag package alone stops at the first positional
// one and would leave -config unread. "--" ends the flags.
func parseAnywhere(fs *flag.FlagSet, args []string) error {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	// Parse once more with only the positionals after "--", so fs.Args
	// answers them.
	return fs.Parse(append([]string{"--"}, pos...))
}

func findDaemon(cfgPath, addr string) (*daemon, error) {
	d := &daemon{addr: addr}
	if cfg, err := config.LoadConfig(cfgPath); err == nil {
		if d.addr == "" {
			d.addr = cfg.Listen
			if b, err := os.ReadFile(filepath.Join(cfg.StateDir, "listen.addr")); err == nil {
				d.addr = strings.TrimSpace(string(b))
			}
		}
		if cfg.AdminTokenFile != "" {
			b, err := os.ReadFile(cfg.AdminTokenFile)
			if err != nil {
				return nil, fmt.Errorf("admin_token_file: %w", err)
			}
			d.token = strings.TrimSpace(string(b))
		}
	} else if d.addr == "" {
		return nil, err
	}
	return d, nil
}

func (d *daemon) do(method, path string, out any) error {
	req, err := http.NewRequest(method, "http://"+d.addr+path, nil)
	if err != nil {
		return err
	}
	if d.token != "" {
		req.Header.Set("Authorization", "Bearer "+d.token)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("is runway serve running? %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return json.Unmarshal(b, out)
}

func statusCmd(args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	d, err := connect(fs, args, 0, "status [-json]")
	if err != nil {
		return err
	}
	return show(d, "/api/v1/groups", *asJSON, "GROUP\tSCOPE\tQUEUED\tACTIVE/MAX\tCREATING\tIDLE\tBUSY\tDELETING\tDRAINED\tLAST CHECK\tERROR",
		func(g orchestrator.GroupStatus) string {
			last := "never"
			if !g.LastCheckTime.IsZero() {
				last = time.Since(g.LastCheckTime).Round(time.Second).String() + " ago"
			}
			return fmt.Sprintf("%s\t%s\t%d\t%d/%d\t%d\t%d\t%d\t%d\t%v\t%s\t%s", g.Name, g.Scope, g.QueuedJobs, g.ActiveRunners,
				g.MaxActiveRunners, g.Creating, g.Idle, g.Busy, g.Deleting, g.Drained, last, g.LastError)
		})
}

// show GETs a list from the daemon and prints it: JSON with -json, else
// a table of header and one row per element. What it prints passes the
// redactor too (the daemon's answer should be redacted already; an
// older daemon's may not be).
func show[T any](d *daemon, path string, asJSON bool, header string, row func(T) string) error {
	var list []T
	if err := d.do("GET", path, &list); err != nil {
		return err
	}
	if asJSON {
		return printJSON(list)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, header)
	for _, v := range list {
		fmt.Fprintln(w, logging.RedactURLs(row(v)))
	}
	return w.Flush()
}

func runnersCmd(args []string) error {
	fs := flag.NewFlagSet("runners", flag.ContinueOnError)
	all := fs.Bool("all", false, "include deleted runners (history)")
	asJSON := fs.Bool("json", false, "print JSON")
	d, err := connect(fs, args, 0, "runners [-all] [-json]")
	if err != nil {
		return err
	}
	path := "/api/v1/runners"
	if *all {
		path += "?all=true"
	}
	return show(d, path, *asJSON, "RUNNER\tGROUP\tSTATE\tVM\tJOB\tAGE\tREASON", func(r httpapi.RunnerView) string {
		job := ""
		if r.JobID != 0 {
			job = fmt.Sprintf("%s#%d", r.JobRepo, r.JobID)
		} else if r.TriggerJob != 0 {
			job = fmt.Sprintf("(for #%d)", r.TriggerJob)
		}
		return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s", r.Name, r.Group, r.State, r.VMCID, job,
			time.Since(r.CreatedAt).Round(time.Second), r.Reason)
	})
}

func drainCmd(args []string, drain bool) error {
	name := "drain"
	if !drain {
		name = "resume"
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	d, err := connect(fs, args, 1, name+" <group>")
	if err != nil {
		return err
	}
	var g orchestrator.GroupStatus
	if err := d.do("POST", "/api/v1/groups/"+url.PathEscape(fs.Arg(0))+"/"+name, &g); err != nil {
		return err
	}
	fmt.Printf("group %s: drained=%v active=%d busy=%d\n", g.Name, g.Drained, g.ActiveRunners, g.Busy)
	return nil
}

// printJSON prints v redacted, '<' and '&' as they are (as the daemon
// writes it).
func printJSON(v any) error {
	enc := json.NewEncoder((&logging.Redactor{}).Writer(os.Stdout))
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}
