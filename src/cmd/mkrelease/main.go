// Command mkrelease builds this repository's BOSH release without the bosh
// CLI: a dev release tarball, or a final release whose blobs go to a local
// blobstore directory. scripts/release runs it; docs/release.md explains.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/runway-cpi/runway/src/release"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkrelease:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mkrelease", flag.ContinueOnError)
	dir := fs.String("dir", ".", "release directory (the repository root)")
	stageOnly := fs.Bool("stage", false, "only build the package's executables into src/runway_cpi/bin (then `bosh create-release` works too)")
	noStage := fs.Bool("no-stage", false, "use the executables already staged")
	tarball := fs.String("tarball", "", "write the release tarball here")
	final := fs.Bool("final", false, "make a final release: record it in releases/ and .final_builds/, blobs into the blobstore")
	blobstore := fs.String("blobstore", "", "final releases: blobstore directory (default: blobstore_path from config/private.yml, then config/final.yml)")
	version := fs.String("version", "", "release version (default: 0+dev.<commits> for dev, the next whole number for final)")
	force := fs.Bool("force", false, "final releases: allow uncommitted changes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (flags only; see -h)", fs.Args())
	}
	root, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	if !*noStage {
		if err := release.Stage(root); err != nil {
			return err
		}
		fmt.Printf("staged %s\n", release.StageDir(root))
	}
	if *stageOnly {
		return nil
	}
	if !*final && *tarball == "" {
		return errors.New("nothing to build: give -tarball, -final or -stage")
	}
	r, err := release.Read(root)
	if err != nil {
		return err
	}
	commit, dirty := gitState(root)
	opts := release.Options{Version: *version, CommitHash: commit, Dirty: dirty, Tarball: *tarball, Final: *final}
	if *final {
		if dirty && !*force {
			return errors.New("the release directory has uncommitted changes: commit them, or pass -force")
		}
		if opts.Blobstore, err = blobstoreDir(root, *blobstore); err != nil {
			return err
		}
		if opts.Version == "" {
			if opts.Version, err = r.NextFinalVersion(); err != nil {
				return err
			}
		}
	} else if opts.Version == "" {
		opts.Version = "0+dev." + gitCount(root)
	}
	if opts.Tarball != "" {
		if opts.Tarball, err = filepath.Abs(opts.Tarball); err != nil {
			return err
		}
	}
	m, err := r.Build(opts)
	if err != nil {
		return err
	}
	fmt.Printf("release %s/%s (commit %s%s)\n", m.Name, m.Version, m.CommitHash, map[bool]string{true: ", uncommitted changes"}[m.UncommittedChanges])
	for _, p := range m.Packages {
		fmt.Printf("  package %-20s fingerprint %s sha1 %s\n", p.Name, p.Fingerprint, p.SHA1)
	}
	for _, j := range m.Jobs {
		fmt.Printf("  job     %-20s fingerprint %s sha1 %s\n", j.Name, j.Fingerprint, j.SHA1)
	}
	if opts.Tarball != "" {
		fmt.Printf("tarball %s\n", opts.Tarball)
	}
	if *final {
		fmt.Printf("final release recorded in releases/%s and .final_builds/, blobs in %s\n", m.Name, opts.Blobstore)
	}
	return nil
}

// blobstoreDir: the flag, else blobstore_path from config/private.yml,
// else from config/final.yml; relative paths are taken from the release
// directory, as bosh does.
func blobstoreDir(root, flagValue string) (string, error) {
	path := flagValue
	if path == "" {
		for _, f := range []string{"private.yml", "final.yml"} {
			var c struct {
				Blobstore struct {
					Options struct {
						Path string `yaml:"blobstore_path"`
					} `yaml:"options"`
				} `yaml:"blobstore"`
			}
			b, err := os.ReadFile(filepath.Join(root, "config", f))
			if err != nil {
				continue
			}
			if err := yaml.Unmarshal(b, &c); err != nil {
				return "", fmt.Errorf("config/%s: %w", f, err)
			}
			if c.Blobstore.Options.Path != "" {
				path = c.Blobstore.Options.Path
				break
			}
		}
	}
	if path == "" {
		return "", errors.New("a final release needs a blobstore directory: pass -blobstore DIR, or set blobstore.options.blobstore_path in config/private.yml")
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(root, path)
	}
	return path, nil
}

func gitState(root string) (commit string, dirty bool) {
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "non-git", false
	}
	status, _ := exec.Command("git", "-C", root, "status", "--porcelain=1").Output()
	return strings.TrimSpace(string(out)), len(strings.TrimSpace(string(status))) > 0
}

func gitCount(root string) string {
	out, err := exec.Command("git", "-C", root, "rev-list", "--count", "HEAD").Output()
	if err != nil {
		return "1"
	}
	return strings.TrimSpace(string(out))
}
