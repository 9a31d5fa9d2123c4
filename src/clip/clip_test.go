package clip

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestToKeepsRunesWhole(t *testing.T) {
	for _, s := range []string{"abcdef", "héllo wörld", "日本語のテキスト", "a€b€c€"} {
		for n := 0; n <= len(s)+1; n++ {
			got := To(s, n)
			if len(got) > n || !utf8.ValidString(got) || got != s[:len(got)] || len(got) < n-utf8.UTFMax+1 && len(got) < len(s) {
				t.Errorf("To(%q, %d) = %q", s, n, got)
			}
		}
	}
}

func TestQuote(t *testing.T) {
	if got := Quote("  short \n", 10); got != "short" {
		t.Errorf("got %q", got)
	}
	long := strings.Repeat("ü", 100)
	got := Quote(long, 11)
	if !strings.HasSuffix(got, "...") || !utf8.ValidString(got) || len(got) != 10+3 {
		t.Errorf("got %q (%d bytes)", got, len(got))
	}
}
