// Package clip shortens text for limits that count bytes: cloud tag and
// metadata values, and the excerpts of answers quoted in error messages.
package clip

import (
	"strings"
	"unicode/utf8"
)

// To cuts s to at most n bytes at a rune boundary (half a rune is
// invalid UTF-8, which clouds refuse in tags).
func To(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Quote is s trimmed and, past n bytes, cut with "..." appended: for
// quoting a peer's answer in an error without flooding the log.
func Quote(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	return To(s, n) + "..."
}
