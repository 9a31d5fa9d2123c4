package main

import (
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
)

// Flags are read wherever they stand: `runway drain e2e -config X` used to
// ignore -config and fall back to ./runway.yml.
func TestFlagsAnywhere(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		cfg, all string
		pos      []string
	}{
		{[]string{"e2e", "-config", "x.yml"}, "x.yml", "false", []string{"e2e"}},
		{[]string{"-config", "x.yml", "e2e"}, "x.yml", "false", []string{"e2e"}},
		{[]string{"a", "-all", "b", "-config=y.yml"}, "y.yml", "true", []string{"a", "b"}},
		{[]string{"-all", "--", "-config", "z"}, "runway.yml", "true", []string{"-config", "z"}},
		{[]string{}, "runway.yml", "false", nil},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		cfg := fs.String("config", "runway.yml", "")
		all := fs.Bool("all", false, "")
		if err := parseAnywhere(fs, tc.args); err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if *cfg != tc.cfg || fs.Lookup("all").Value.String() != tc.all || !slices.Equal(fs.Args(), tc.pos) && len(tc.pos)+fs.NArg() > 0 {
			t.Errorf("%q: config %q all %v args %q; want %q %s %q", tc.args, *cfg, *all, fs.Args(), tc.cfg, tc.all, tc.pos)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if err := parseAnywhere(fs, []string{"e2e", "-nope"}); err == nil {
		t.Error("an unknown flag after the group was accepted")
	}
	if err := drainCmd([]string{"a", "b", "-addr", "127.0.0.1:9"}, true); err == nil || !strings.Contains(err.Error(), "usage: runway drain <group>") {
		t.Errorf("two groups: %v", err)
	}
}
