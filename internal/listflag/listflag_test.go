package listflag

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSplit(t *testing.T) {
	for in, want := range map[string][]string{
		"":                  nil,
		" , ":               nil,
		"a":                 {"a"},
		"a, b,,c ":          {"a", "b", "c"},
		"n0=h:1,n1=h:2":     {"n0=h:1", "n1=h:2"},
		"http://e:2379, x ": {"http://e:2379", "x"},
	} {
		assert.Equal(t, want, Split(in), "%q", in)
	}
}
