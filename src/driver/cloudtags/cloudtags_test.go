package cloudtags

import "testing"

func TestMerge(t *testing.T) {
	m := Merge(map[string]string{"a": "1", "b": "1"}, nil, map[string]string{"b": "2"})
	if len(m) != 2 || m["a"] != "1" || m["b"] != "2" {
		t.Fatal(m)
	}
}

func TestEncodeNames(t *testing.T) {
	in := map[string]string{"default": "net-1", "b": "x", "bad,name": "y", "c": "has=eq"}
	s := EncodeNames(in, 255)
	if s != "b=x,default=net-1" {
		t.Fatalf("got %q", s)
	}
	got := DecodeNames(s)
	if len(got) != 2 || got["default"] != "net-1" || got["b"] != "x" {
		t.Fatal(got)
	}
	if s := EncodeNames(map[string]string{"aaaa": "1", "b": "2"}, 5); s != "b=2" {
		t.Fatalf("over the limit: %q", s)
	}
	if len(DecodeNames("")) != 0 {
		t.Fatal("empty")
	}
}
