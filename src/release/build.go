package release

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/google/uuid"
	"gopkg.in/yaml.v3"
)

// Options say what to build.
type Options struct {
	Version    string // required
	CommitHash string
	Dirty      bool // uncommitted changes in the release directory
	Tarball    string
	// Final records the release in releases/ and .final_builds/ and puts
	// every new job and package archive into Blobstore (a directory).
	Final     bool
	Blobstore string
}

// Manifest is release.MF, and releases/<name>/<name>-<version>.yml.
type Manifest struct {
	Name               string       `yaml:"name"`
	Version            string       `yaml:"version"`
	CommitHash         string       `yaml:"commit_hash"`
	UncommittedChanges bool         `yaml:"uncommitted_changes"`
	Jobs               []JobRef     `yaml:"jobs,omitempty"`
	Packages           []PackageRef `yaml:"packages,omitempty"`
}

// JobRef is one job in a release manifest.
type JobRef struct {
	Name        string   `yaml:"name"`
	Version     string   `yaml:"version"`
	Fingerprint string   `yaml:"fingerprint"`
	SHA1        string   `yaml:"sha1"`
	Packages    []string `yaml:"packages"`
}

// PackageRef is one package in a release manifest.
type PackageRef struct {
	Name         string   `yaml:"name"`
	Version      string   `yaml:"version"`
	Fingerprint  string   `yaml:"fingerprint"`
	SHA1         string   `yaml:"sha1"`
	Dependencies []string `yaml:"dependencies"`
}

// index is bosh's .final_builds/<kind>/<name>/index.yml and
// releases/<name>/index.yml.
type index struct {
	Builds        map[string]indexEntry `yaml:"builds"`
	FormatVersion string                `yaml:"format-version"`
}

type indexEntry struct {
	Version     string `yaml:"version"`
	BlobstoreID string `yaml:"blobstore_id,omitempty"`
	SHA1        string `yaml:"sha1,omitempty"`
}

// Build writes what opts ask for and answers the release manifest.
func (r *Release) Build(opts Options) (*Manifest, error) {
	if opts.Version == "" {
		return nil, errors.New("a release version is required")
	}
	if opts.Final && opts.Blobstore == "" {
		return nil, errors.New("a final release needs a blobstore directory")
	}
	if opts.Final {
		if exists, err := r.finalVersionExists(opts.Version); err != nil || exists {
			if err == nil {
				err = fmt.Errorf("final release %s/%s already exists", r.Name, opts.Version)
			}
			return nil, err
		}
	}
	stage, err := os.MkdirTemp("", "runway-release-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stage)
	for _, sub := range []string{"jobs", "packages"} {
		if err := os.Mkdir(filepath.Join(stage, sub), 0o755); err != nil {
			return nil, err
		}
	}
	m := &Manifest{Name: r.Name, Version: opts.Version, CommitHash: opts.CommitHash, UncommittedChanges: opts.Dirty}
	ordered, err := r.Order()
	if err != nil {
		return nil, err
	}
	for _, p := range ordered {
		sum, err := r.place(p, "packages", filepath.Join(stage, "packages"), opts)
		if err != nil {
			return nil, err
		}
		deps := append([]string{}, p.Dependencies...)
		m.Packages = append(m.Packages, PackageRef{Name: p.Name, Version: p.Fingerprint, Fingerprint: p.Fingerprint, SHA1: sum, Dependencies: deps})
	}
	for _, j := range r.Jobs {
		sum, err := r.place(j, "jobs", filepath.Join(stage, "jobs"), opts)
		if err != nil {
			return nil, err
		}
		pkgs := append([]string{}, j.Dependencies...)
		m.Jobs = append(m.Jobs, JobRef{Name: j.Name, Version: j.Fingerprint, Fingerprint: j.Fingerprint, SHA1: sum, Packages: pkgs})
	}
	mf, err := marshal(m)
	if err != nil {
		return nil, err
	}
	if opts.Tarball != "" {
		entries := []entry{{name: "release.MF", data: mf, mode: 0o644}}
		for _, kind := range []string{"packages", "jobs"} {
			names, _ := filepath.Glob(filepath.Join(stage, kind, "*.tgz"))
			for _, n := range names {
				entries = append(entries, entry{name: kind + "/" + filepath.Base(n), path: n, mode: 0o644})
			}
		}
		if err := writeFile(opts.Tarball, func(w io.Writer) error { return writeTGZ(w, entries) }); err != nil {
			return nil, fmt.Errorf("writing %s: %w", opts.Tarball, err)
		}
	}
	if opts.Final {
		if err := r.recordFinal(m, mf); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// place puts a's archive into dir and answers its digest. For a final
// release an archive already in .final_builds comes from the blobstore
// (checked against its recorded digest); a new one is added to both.
func (r *Release) place(a *Artifact, kind, dir string, opts Options) (string, error) {
	if !opts.Final {
		_, sum, err := a.archive(dir)
		return sum, err
	}
	idxPath := filepath.Join(r.Dir, ".final_builds", kind, a.Name, "index.yml")
	idx, err := readIndex(idxPath)
	if err != nil {
		return "", err
	}
	if e, ok := idx.Builds[a.Fingerprint]; ok {
		blob := filepath.Join(opts.Blobstore, e.BlobstoreID)
		data, err := os.ReadFile(blob)
		if err != nil {
			return "", fmt.Errorf("%s %s (fingerprint %s) is a final build, but its blob is not in the blobstore: %w", kind, a.Name, a.Fingerprint, err)
		}
		if sum := digestString(string(data)); sum != e.SHA1 {
			return "", fmt.Errorf("blob %s of %s %s has digest %s, the index says %s", blob, kind, a.Name, sum, e.SHA1)
		}
		return e.SHA1, os.WriteFile(filepath.Join(dir, a.Name+".tgz"), data, 0o644)
	}
	path, sum, err := a.archive(dir)
	if err != nil {
		return "", err
	}
	id := uuid.NewString()
	if err := os.MkdirAll(opts.Blobstore, 0o755); err != nil {
		return "", fmt.Errorf("blobstore: %w", err)
	}
	if err := copyFile(path, filepath.Join(opts.Blobstore, id)); err != nil {
		return "", fmt.Errorf("blobstore: %w", err)
	}
	idx.Builds[a.Fingerprint] = indexEntry{Version: a.Fingerprint, BlobstoreID: id, SHA1: sum}
	return sum, writeIndex(idxPath, idx)
}

func (r *Release) releasesDir() string { return filepath.Join(r.Dir, "releases", r.Name) }

func (r *Release) finalVersionExists(version string) (bool, error) {
	idx, err := readIndex(filepath.Join(r.releasesDir(), "index.yml"))
	if err != nil {
		return false, err
	}
	for _, e := range idx.Builds {
		if e.Version == version {
			return true, nil
		}
	}
	return false, nil
}

// NextFinalVersion is one more than the highest whole-number final version.
func (r *Release) NextFinalVersion() (string, error) {
	idx, err := readIndex(filepath.Join(r.releasesDir(), "index.yml"))
	if err != nil {
		return "", err
	}
	last := 0
	for _, e := range idx.Builds {
		if n, err := strconv.Atoi(e.Version); err == nil && n > last {
			last = n
		}
	}
	return strconv.Itoa(last + 1), nil
}

func (r *Release) recordFinal(m *Manifest, mf []byte) error {
	dir := r.releasesDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%s.yml", r.Name, m.Version)), mf, 0o644); err != nil {
		return err
	}
	idxPath := filepath.Join(dir, "index.yml")
	idx, err := readIndex(idxPath)
	if err != nil {
		return err
	}
	idx.Builds[uuid.NewString()] = indexEntry{Version: m.Version}
	return writeIndex(idxPath, idx)
}

func readIndex(path string) (*index, error) {
	idx := &index{Builds: map[string]indexEntry{}, FormatVersion: "2"}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return idx, nil
	}
	if err != nil {
		return nil, err
	}
	if err := yaml.Unmarshal(b, idx); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if idx.Builds == nil {
		idx.Builds = map[string]indexEntry{}
	}
	return idx, nil
}

// marshal writes YAML as bosh does: two-space indents, a document start.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("---\n")
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return b.Bytes(), enc.Close()
}

func writeIndex(path string, idx *index) error {
	b, err := marshal(idx)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return writeFile(path, func(w io.Writer) error { _, err := w.Write(b); return err })
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return writeFile(dst, func(w io.Writer) error { _, err := io.Copy(w, in); return err })
}
