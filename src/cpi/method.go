package cpi

import (
	"context"
	"maps"
	"reflect"
	"slices"

	"github.com/runway-cpi/runway/src/rpc"
)

// Method is one CPI method, described once: its name, the kind of object
// it acts on (hooks' CPI_OBJECT_TYPE), its positional arguments (the
// fields of its Args struct, in order: rpc.ArgSpecs) and what it does.
// Binding, hook variables and docs/hooks.md all come from this.
type Method struct {
	Name   string
	Object string // vm, disk, snapshot, stemcell or none
	Args   []rpc.ArgSpec
	call   func(s *Service, ctx context.Context, req *rpc.Request) (any, error)
}

var methods = map[string]*Method{}

// method registers a method whose arguments are the fields of A.
func method[A any](name, object string, run func(s *Service, ctx context.Context, req *rpc.Request, args *A) (any, error)) *Method {
	m := &Method{Name: name, Object: object, Args: rpc.ArgSpecs(reflect.TypeFor[A]())}
	m.call = func(s *Service, ctx context.Context, req *rpc.Request) (any, error) {
		var a A
		if err := req.BindArgs(&a); err != nil {
			return nil, err
		}
		return run(s, ctx, req, &a)
	}
	if _, dup := methods[name]; dup {
		panic("cpi: method " + name + " defined twice")
	}
	methods[name] = m
	return m
}

// Lookup returns a method's descriptor.
func Lookup(name string) (*Method, bool) { m, ok := methods[name]; return m, ok }

// Known reports whether method is implemented.
func Known(name string) bool { _, ok := methods[name]; return ok }

// Methods lists the implemented method names, sorted.
func Methods() []string { return slices.Sorted(maps.Keys(methods)) }

// noArgs is the Args of a method that takes none.
type noArgs struct{}

// vmArgs, diskArgs: the methods that take one CID.
type vmArgs struct {
	VM string `arg:"vm_cid"`
}

type diskArgs struct {
	Disk string `arg:"disk_cid"`
}
