package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/runway-cpi/runway/src/cpiclient"
)

// runHooks measures has_vm (a cheap method) with no hooks, with 3 pre
// scripts, and with 1 loopback HTTP extension (pre and post).
func runHooks(cpiPath string, n int) error {
	dir, err := os.MkdirTemp("", "cpibench-hooks-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			UID string `json:"uid"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		_ = json.NewEncoder(w).Encode(map[string]any{"uid": req.UID, "status": "Success"})
	})}
	go srv.Serve(l)
	defer srv.Close()

	hooksDir := filepath.Join(dir, "hooks.d")
	pre := filepath.Join(hooksDir, "has_vm-pre.d")
	if err := os.MkdirAll(pre, 0o755); err != nil {
		return err
	}
	variants := []struct {
		name  string
		hooks map[string]any
	}{
		{"no hooks configured", nil},
		{"hooks dir configured, no scripts for it", map[string]any{"dir": filepath.Join(dir, "empty.d")}},
		{"3 pre scripts (exit 0)", map[string]any{"dir": hooksDir}},
		{"1 loopback extension (pre+post)", map[string]any{"extensions": []any{map[string]any{"name": "bench",
			"clientConfig": map[string]any{"url": "http://" + l.Addr().String()}}}}},
	}
	for i := 1; i <= 3; i++ {
		if err := os.WriteFile(filepath.Join(pre, fmt.Sprintf("%02d-ok", i)), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			return err
		}
	}
	fmt.Printf("bin/cpi: %s, has_vm, %d calls per measurement\n\n", cpiPath, n)
	for i, v := range variants {
		cfg := map[string]any{"driver": "local", "state_dir": filepath.Join(dir, "state")}
		if v.hooks != nil {
			v.hooks["audit_log"] = filepath.Join(dir, fmt.Sprintf("audit-%d.jsonl", i))
			cfg["hooks"] = v.hooks
		}
		b, _ := json.Marshal(cfg)
		path := filepath.Join(dir, fmt.Sprintf("cpi-%d.json", i))
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return err
		}
		c := &cpiclient.Client{Path: cpiPath, ConfigPath: path, DirectorUUID: "bench", APIVersion: 2, Timeout: time.Minute}
		var ds []time.Duration
		for j := 0; j < n; j++ {
			r, err := c.Call(context.Background(), "has_vm", "", "vm-bench")
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			ds = append(ds, r.Duration)
		}
		report(v.name, ds)
	}
	return nil
}
