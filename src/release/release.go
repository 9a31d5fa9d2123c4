// Package release builds this repository's BOSH release without the bosh
// CLI: it reads packages/*/spec and jobs/*/spec the way `bosh
// create-release` does, computes the same fingerprints (bosh-cli's "v2"
// scheme, so either tool recognises the other's builds), and writes
// reproducible archives: a release tarball, or a final release with its
// blobs in a local blobstore directory. See docs/release.md.
package release

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// File is one file of a package or job: where it is, and the name it has
// inside the archive (and in the fingerprint).
type File struct {
	Path string
	Name string
	// NoMode leaves the file mode out of the fingerprint (packaging scripts).
	NoMode bool
}

// Artifact is a package or a job.
type Artifact struct {
	Name        string
	Fingerprint string
	Files       []File
	// Dependencies (packages) or Packages (jobs).
	Dependencies []string
}

// Release is the release directory as read.
type Release struct {
	Dir      string
	Name     string
	Packages []*Artifact
	Jobs     []*Artifact
}

type packageSpec struct {
	Name          string   `yaml:"name"`
	Dependencies  []string `yaml:"dependencies"`
	Files         []string `yaml:"files"`
	ExcludedFiles []string `yaml:"excluded_files"`
}

type jobSpec struct {
	Name      string            `yaml:"name"`
	Templates map[string]string `yaml:"templates"`
	Packages  []string          `yaml:"packages"`
}

type finalConfig struct {
	Name      string `yaml:"name"`
	FinalName string `yaml:"final_name"`
	Blobstore struct {
		Provider string         `yaml:"provider"`
		Options  map[string]any `yaml:"options"`
	} `yaml:"blobstore"`
}

// Read reads the release directory dir.
func Read(dir string) (*Release, error) {
	var fc finalConfig
	if err := readYAML(filepath.Join(dir, "config", "final.yml"), &fc); err != nil {
		return nil, err
	}
	r := &Release{Dir: dir, Name: fc.FinalName}
	if r.Name == "" {
		r.Name = fc.Name
	}
	if r.Name == "" {
		return nil, fmt.Errorf("config/final.yml: name is required")
	}
	pkgDirs, _ := filepath.Glob(filepath.Join(dir, "packages", "*", "spec"))
	for _, spec := range pkgDirs {
		p, err := readPackage(dir, filepath.Dir(spec))
		if err != nil {
			return nil, err
		}
		r.Packages = append(r.Packages, p)
	}
	jobDirs, _ := filepath.Glob(filepath.Join(dir, "jobs", "*", "spec"))
	for _, spec := range jobDirs {
		j, err := readJob(filepath.Dir(spec))
		if err != nil {
			return nil, err
		}
		r.Jobs = append(r.Jobs, j)
	}
	if err := r.check(); err != nil {
		return nil, err
	}
	return r, nil
}

// check: every dependency and job package exists, and the package graph
// has no cycle (Order would loop).
func (r *Release) check() error {
	names := map[string]bool{}
	for _, p := range r.Packages {
		names[p.Name] = true
	}
	for _, p := range r.Packages {
		for _, d := range p.Dependencies {
			if !names[d] {
				return fmt.Errorf("package %s depends on %s, which is not in packages/", p.Name, d)
			}
		}
	}
	for _, j := range r.Jobs {
		for _, d := range j.Dependencies {
			if !names[d] {
				return fmt.Errorf("job %s uses package %s, which is not in packages/", j.Name, d)
			}
		}
	}
	_, err := r.Order()
	return err
}

// Order lists the packages so that each comes after its dependencies: the
// order the BOSH agent compiles them in.
func (r *Release) Order() ([]*Artifact, error) {
	byName := map[string]*Artifact{}
	for _, p := range r.Packages {
		byName[p.Name] = p
	}
	var out []*Artifact
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(p *Artifact, path []string) error
	visit = func(p *Artifact, path []string) error {
		switch state[p.Name] {
		case 1:
			return fmt.Errorf("package dependency cycle: %s", strings.Join(append(path, p.Name), " -> "))
		case 2:
			return nil
		}
		state[p.Name] = 1
		deps := append([]string(nil), p.Dependencies...)
		sort.Strings(deps)
		for _, d := range deps {
			if err := visit(byName[d], append(path, p.Name)); err != nil {
				return err
			}
		}
		state[p.Name] = 2
		out = append(out, p)
		return nil
	}
	for _, p := range r.Packages {
		if err := visit(p, nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// readSpec reads the spec of a package or job (kind) in dir into s, checks
// that its name (name, s's field) is the directory's and that the file
// every one of its kind has (need) is there, and answers that file's path.
func readSpec(kind, dir, need string, s any, name *string) (string, error) {
	if err := readYAML(filepath.Join(dir, "spec"), s); err != nil {
		return "", err
	}
	if *name != filepath.Base(dir) {
		return "", fmt.Errorf("%s directory %s does not match the name %q in its spec", kind, dir, *name)
	}
	p := filepath.Join(dir, need)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s %s: %s is missing (an empty file is enough)", kind, *name, p)
	}
	return p, nil
}

func readPackage(root, dir string) (*Artifact, error) {
	var s packageSpec
	packaging, err := readSpec("package", dir, "packaging", &s, &s.Name)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, "pre_packaging")); err == nil {
		return nil, fmt.Errorf("package %s: pre_packaging scripts are not supported by this builder", s.Name)
	}
	files := map[string]File{}
	for _, pattern := range s.Files {
		found := false
		// bosh looks in src/ first, then blobs/; the first match of a name wins.
		for _, base := range []string{"src", "blobs"} {
			matches, err := glob(filepath.Join(root, base), pattern)
			if err != nil {
				return nil, fmt.Errorf("package %s: %w", s.Name, err)
			}
			for _, rel := range matches {
				found = true
				if _, ok := files[rel]; !ok {
					files[rel] = File{Path: filepath.Join(root, base, rel), Name: rel}
				}
			}
		}
		if !found {
			return nil, fmt.Errorf("package %s: no file in src/ or blobs/ matches %q (for runway_cpi, run scripts/release -stage first)", s.Name, pattern)
		}
	}
	for _, pattern := range s.ExcludedFiles {
		for _, base := range []string{"src", "blobs"} {
			matches, err := glob(filepath.Join(root, base), pattern)
			if err != nil {
				return nil, fmt.Errorf("package %s: %w", s.Name, err)
			}
			for _, rel := range matches {
				delete(files, rel)
			}
		}
	}
	if _, ok := files["packaging"]; ok {
		return nil, fmt.Errorf("package %s: 'packaging' must not be listed in files", s.Name)
	}
	a := &Artifact{Name: s.Name, Dependencies: s.Dependencies}
	a.Files = append(a.Files, File{Path: packaging, Name: "packaging", NoMode: true})
	for _, f := range files {
		a.Files = append(a.Files, f)
	}
	fp, err := fingerprint(a.Files, s.Dependencies, false)
	if err != nil {
		return nil, fmt.Errorf("package %s: %w", s.Name, err)
	}
	a.Fingerprint = fp
	return a, nil
}

func readJob(dir string) (*Artifact, error) {
	var s jobSpec
	// The Director and bosh-cli's create-env both read the monit file
	// unconditionally: an empty one is fine, a missing one is not.
	monit, err := readSpec("job", dir, "monit", &s, &s.Name)
	if err != nil {
		return nil, err
	}
	a := &Artifact{Name: s.Name, Dependencies: s.Packages}
	a.Files = []File{{Path: filepath.Join(dir, "spec"), Name: "job.MF"}, {Path: monit, Name: "monit"}}
	if _, err := os.Stat(filepath.Join(dir, "properties_schema.json")); err == nil {
		a.Files = append(a.Files, File{Path: filepath.Join(dir, "properties_schema.json"), Name: "properties_schema.json"})
	}
	for src := range s.Templates {
		p := filepath.Join(dir, "templates", src)
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("job %s: template %s is missing", s.Name, p)
		}
		a.Files = append(a.Files, File{Path: p, Name: "templates/" + src})
	}
	fp, err := fingerprint(a.Files, nil, true)
	if err != nil {
		return nil, fmt.Errorf("job %s: %w", s.Name, err)
	}
	a.Fingerprint = fp
	return a, nil
}

// glob matches pattern below base and answers paths relative to base
// (regular files only; symlinks count, directories do not). "**" is not
// supported: bosh's recursive globs differ in corner cases, and this
// release lists its files plainly.
func glob(base, pattern string) ([]string, error) {
	if strings.Contains(pattern, "**") {
		return nil, fmt.Errorf("file pattern %q: '**' is not supported by this builder", pattern)
	}
	matches, err := filepath.Glob(filepath.Join(base, pattern))
	if err != nil {
		return nil, fmt.Errorf("file pattern %q: %w", pattern, err)
	}
	var out []string
	for _, m := range matches {
		st, err := os.Lstat(m)
		if err != nil || st.IsDir() {
			continue
		}
		rel, _ := filepath.Rel(base, m)
		out = append(out, filepath.ToSlash(rel))
	}
	return out, nil
}

// fingerprint is bosh-cli's v2 fingerprint with its current SHA-256
// digests: "v2", then per file (sorted by name) its name, the digest of
// its content ("sha256:<hex>") and its git-style mode, then the sorted
// extra chunks (package dependencies) joined by commas; the hex SHA-256 of
// all that. Jobs follow symlinks, packages record link targets.
func fingerprint(files []File, chunks []string, followLinks bool) (string, error) {
	sorted := append([]File(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	var b strings.Builder
	b.WriteString("v2")
	for _, f := range sorted {
		st, err := os.Lstat(f.Path)
		if err != nil {
			return "", err
		}
		link := st.Mode()&os.ModeSymlink != 0
		var digest string
		switch {
		case link && !followLinks:
			target, err := os.Readlink(f.Path)
			if err != nil {
				return "", err
			}
			digest = digestString(target)
		default:
			// A followed link's content counts, but (as in bosh-cli) its
			// own mode, which is 0777.
			if digest, err = digestFile(f.Path); err != nil {
				return "", err
			}
		}
		b.WriteString(f.Name)
		b.WriteString(digest)
		if !f.NoMode {
			switch {
			case link && !followLinks:
				b.WriteString("symlink")
			case st.Mode()&0o111 != 0:
				b.WriteString("100755")
			default:
				b.WriteString("100644")
			}
		}
	}
	if len(chunks) > 0 {
		c := append([]string(nil), chunks...)
		sort.Strings(c)
		b.WriteString(strings.Join(c, ","))
	}
	return strings.TrimPrefix(digestString(b.String()), "sha256:"), nil
}

// digestString and digestFile answer digests as bosh writes them
// ("sha256:<hex>"), in fingerprints and in the manifests' sha1 fields.
func digestString(s string) string {
	h := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(h[:])
}

func digestFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

func readYAML(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
