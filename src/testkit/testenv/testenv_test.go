package testenv

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every test that would skip for a missing environment goes through Need,
// so that scripts/test can turn those skips into failures: no other skip
// exists in the repository's tests.
func TestNoOtherSkips(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	skip := regexp.MustCompile(`\b(t|b|tb|T|GinkgoT\(\))\.Skip(f|Now)?\(|[^.\w]Skip\(`)
	var found []string
	err = filepath.WalkDir(filepath.Join(root, "src"), func(path string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() || !strings.HasSuffix(path, "_test.go") || strings.HasPrefix(path, filepath.Join(root, "src", "testkit", "testenv")) {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if skip.MatchString(line) && !strings.HasPrefix(strings.TrimSpace(line), "//") {
				rel, _ := filepath.Rel(root, path)
				found = append(found, rel+":"+itoa(i+1)+": "+strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) > 0 {
		t.Fatalf("skips outside testenv.Need:\n%s", strings.Join(found, "\n"))
	}
}

func itoa(n int) string {
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	return s
}
