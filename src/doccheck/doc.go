// Package doccheck holds the test that keeps the configuration reference
// in docs/ equal to the code: every key a config struct decodes is in its
// doc table, and every key a doc table names is decoded.
package doccheck
