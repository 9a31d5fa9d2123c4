package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// The house rules of docs/architecture.md ("Code size"): no non-test Go
// file over 500 lines, no function over 100.
const (
	maxFileLines = 500
	maxFuncLines = 100
)

func TestFileAndFunctionSizes(t *testing.T) {
	fset := token.NewFileSet()
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(path, "../")
		if n := fset.File(f.Pos()).LineCount(); n > maxFileLines {
			t.Errorf("src/%s: %d lines; split it by concern (at most %d)", name, n, maxFileLines)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			fn, ok := n.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				return true
			}
			if l := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; l > maxFuncLines {
				t.Errorf("src/%s: func %s is %d lines (at most %d)", name, fn.Name.Name, l, maxFuncLines)
			}
			return false
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
