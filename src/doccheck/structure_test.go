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

// TestOneLogCallStyle: outside src/logging, every log call is a message
// then key-value pairs (logging.Fields), never bosh-utils' (tag, format,
// args...): a format verb in the second argument, or a format passed on
// with its arguments, is the old style.
func TestOneLogCallStyle(t *testing.T) {
	levels := map[string]bool{"Debug": true, "Info": true, "Warn": true, "Error": true, "DebugWithDetails": true, "ErrorWithDetails": true}
	fset := token.NewFileSet()
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() && path == "../logging" {
			if err == nil {
				err = filepath.SkipDir
			}
			return err
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !levels[sel.Sel.Name] {
				return true
			}
			lit, isLit := call.Args[1].(*ast.BasicLit)
			_, tagged := call.Args[0].(*ast.BasicLit)
			_, isIdent := call.Args[1].(*ast.Ident)
			forwarded := len(call.Args) == 3 && tagged && isIdent && call.Ellipsis.IsValid() // Info("tag", f, a...)
			if isLit && lit.Kind == token.STRING && strings.Contains(lit.Value, "%") || forwarded {
				t.Errorf("%s: printf-style log call; use a message and key-value pairs (logging.Fields)", fset.Position(call.Pos()))
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
